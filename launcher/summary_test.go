package launcher

import (
	"strings"
	"testing"
)

func TestSummaryFormats(t *testing.T) {
	for _, c := range []struct {
		got, want string
	}{
		{count(0), "0"}, {count(999), "999"}, {count(1000), "1,000"}, {count(48312), "48,312"}, {count(1234567), "1,234,567"},
		{size(0), "0 B"}, {size(512), "512 B"}, {size(96 << 10), "96 KiB"}, {size(32 << 20), "32 MiB"},
		{size(33<<20 + 400<<10), "33.4 MiB"}, {size(206<<20 + 40<<10), "206 MiB"}, {size(99<<20 + 1000<<10), "100 MiB"},
		{size(3 << 30), "3 GiB"},
		{duration(850), "850 ns"}, {duration(8704), "8.7 µs"}, {duration(9960), "10 µs"}, {duration(60_416), "60 µs"},
		{duration(172_032), "170 µs"}, {duration(999_700), "1.0 ms"}, {duration(1_507_328), "1.5 ms"},
		{duration(99_600_000), "0.10 s"}, {duration(620_000_000), "0.62 s"}, {duration(1_300_000_000), "1.3 s"},
		{duration(12_340_000_000), "12 s"}, {duration(0), "0 s"},
		{percent(0, 10), "0 %"}, {percent(1, 1000), "under 1 %"}, {percent(98, 100), "98 %"}, {percent(998, 1000), "over 99 %"},
		{percent(10, 10), "100 %"}, {percent(1, 0), "0 %"},
		{and(nil), ""}, {and([]string{"a"}), "a"}, {and([]string{"a", "b"}), "a and b"}, {and([]string{"a", "b", "c"}), "a, b and c"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// The lines of runs the end-to-end tests do not give on every machine: no memory cgroup,
// cache mode, armed without a fault.
func TestSummaryLines(t *testing.T) {
	s := &Summary{Program: []string{"/usr/bin/redis-server"}, CapBytes: 32 << 20, Armed: true, PeakAnonBytes: 31 << 20,
		BytesIn: 1000 * 4096, BytesOut: 900 * 4096, Evicted: Evicted{Written: 900, DroppedClean: 100},
		Faults: map[string]Histogram{"backend": {Count: 400, SumNs: 4e6, P50Ns: 9700, P99Ns: 60_100}, "cache": {Count: 500, SumNs: 1e6},
			"zero": {Count: 0}, "wp": {Count: 3, SumNs: 1000}},
		Held:           map[string]Histogram{"room": {Count: 0}},
		Prefetch:       &Prefetch{Name: "leap", Mode: "cache", CachePages: 4096, Issued: 700, Placed: 600, Used: 500, PushedOut: 100},
		HeldThreadsMax: 4, BusyReleases: 2,
	}
	want := []string{
		"farmem: held redis-server to 32 MiB; its anonymous memory peaked at 31 MiB (sampled)",
		"farmem: 1,000 pages came back (3.9 MiB, 600 of them prefetched) and 1,000 went out (3.5 MiB written, 100 unchanged since stored)",
		"farmem: faults cost the program 5.0 ms: 400 read back (median 9.7 µs, 99th percentile 60 µs), 500 from the prefetch cache, 3 first writes",
		"farmem: up to 4 threads of a process that faulted hard ran on one CPU with its fault thread, so that no fault woke a thread across CPUs; let go 2 times because they computed more than they waited for pages",
		"farmem: prefetching (leap, cache mode) paid: 600 pages read ahead, 500 used (83 %), 100 pushed out unused; 56 % of the pages redis-server needed back were in the cache",
	}
	if got := summaryLines(s); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	quiet := &Summary{Program: []string{"sleep"}, CapBytes: 16 << 20, Armed: true, PeakAnonBytes: 1 << 20, Faults: map[string]Histogram{}}
	want = []string{
		"farmem: held sleep to 16 MiB; its anonymous memory peaked at 1 MiB (sampled)",
		"farmem: no page had to go out: sleep fit in its cap",
		"farmem: no fault was taken",
	}
	if got := summaryLines(quiet); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// Attached at 128 MiB under a 32 MiB cap, then detached: its peak is measured against what it
	// had, not the cap, and the pages the detach read back are neither faults nor pages that came back.
	attached := &Summary{Program: []string{"attachee"}, CapBytes: 32 << 20, Armed: true, Attached: true,
		AttachedAtBytes: 128 << 20, PeakAnonBytes: 128<<20 + 40<<10, BroughtBackPages: 24_709,
		Evicted: Evicted{Written: 24_678, Zero: 31}, BytesOut: 24_678 * 4096, Faults: map[string]Histogram{}}
	want = []string{
		"farmem: held attachee to 32 MiB; its anonymous memory peaked at 128 MiB (sampled)",
		"farmem: it had 128 MiB when farmem attached: what was over the cap went to the store",
		"farmem: its anonymous memory went 40 KiB over what it had then: pages being evicted count until their batch drops them",
		"farmem: 0 pages came back (0 B) and 24,709 went out (96.4 MiB written, 31 all zeros)",
		"farmem: the detach read 24,709 pages (96.5 MiB) back into it",
		"farmem: no fault was taken",
	}
	if got := summaryLines(attached); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
