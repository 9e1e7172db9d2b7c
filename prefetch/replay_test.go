package prefetch

import (
	"strings"
	"testing"
)

func pages(pid uint32, ps ...uint64) []Access {
	a := make([]Access, len(ps))
	for i, p := range ps {
		a[i] = Access{pid, p}
	}
	return a
}

func replay(t *testing.T, c Config, cachePages int, accesses []Access) Metrics {
	t.Helper()
	m, err := Replay(c, cachePages, accesses)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func checkMetrics(t *testing.T, got, want Metrics) {
	t.Helper()
	if got != want {
		t.Errorf("metrics\n got %+v\nwant %+v", got, want)
	}
}

// The paper's stream replayed by leap (history 8, Nsplit 2) with hits fed back:
//
//	t3 0x3F  miss, -3 found, window 1: 0x3C      t10 0x0C miss, 1 hit -> 2: 0x0E 0x10
//	t4 0x3C  hit (lead 1)                        t11 0x10 hit (lead 1)
//	t5 0x02  miss, 1 hit -> 2, but 0x02-3 wraps  t12 0x39 miss, 1 hit -> 2: 0x3B 0x3D
//	t6 0x04  miss, no trend: 2/2 = 1 along -3: 0x01   t13 0x12 miss, +2, 2/2 = 1: 0x14
//	t7 0x06  miss, no trend, 1/2 = 0             t14 0x14 hit (lead 1)
//	t8 0x08  miss, +2 found, window 1: 0x0A      t15 0x16 miss, 1 hit -> 2: 0x18 0x1A
//	t9 0x0A  hit (lead 1)
//
// 10 pages issued, 4 used; 0x01, 0x0E, 0x3B, 0x3D, 0x18, 0x1A never are.
func TestReplayWorkedExample(t *testing.T) {
	m := replay(t, Config{Name: NameLeap, History: 8, Split: 2}, 64, pages(7, workedExample...))
	checkMetrics(t, m, Metrics{Prefetcher: "leap", Processes: 1, Faults: 16, Hits: 4, Misses: 12, Prefetched: 10,
		Pollution: 6, Accuracy: 0.4, Coverage: 0.25, LeadP50: 1, LeadMean: 1, LeadOne: 4})
}

// A cache of 2 pages: the oldest prefetched page goes first, a hit frees its slot at once,
// a page already cached is not issued again.
//
//	0   miss: 1 2 issued            cache [1 2]
//	10  miss: 11 12 push out 1 2    cache [11 12]   evicted 2
//	1   miss: 2 3 push out 11 12    cache [2 3]     evicted 4
//	2   hit (lead 1): 3 cached, 4   cache [3 4]
//	4   hit (lead 1): 5, 6 pushes 3 cache [5 6]     evicted 5
func TestReplayFIFOEagerEviction(t *testing.T) {
	m := replay(t, Config{Name: NameNextN, Max: 2}, 2, pages(1, 0, 10, 1, 2, 4))
	checkMetrics(t, m, Metrics{Prefetcher: "nextn", Processes: 1, Faults: 5, Hits: 2, Misses: 3, Prefetched: 9,
		Pollution: 7, Evicted: 5, Accuracy: 2.0 / 9, Coverage: 0.4, LeadP50: 1, LeadMean: 1, LeadOne: 2})
}

// Lead counts the process's own faults between issue and use: next-4 on a scan issues 1..4
// at fault 1, then one page per fault, 4 faults ahead.
func TestReplayLead(t *testing.T) {
	m := replay(t, Config{Name: NameNextN, Max: 4}, 64, pages(1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9))
	// Hits on pages 1..9 with leads 1, 2, 3, 4, 4, 4, 4, 4, 4; pages 10..13 left unused.
	checkMetrics(t, m, Metrics{Prefetcher: "nextn", Processes: 1, Faults: 10, Hits: 9, Misses: 1, Prefetched: 13,
		Pollution: 4, Accuracy: 9.0 / 13, Coverage: 0.9, LeadP50: 4, LeadMean: 30.0 / 9, LeadOne: 1})
}

// Each pid has its own prefetcher and its own pages: the same page number in another
// process is another page, and a process's lead counts only its own faults.
func TestReplayPerProcess(t *testing.T) {
	accesses := []Access{{1, 0}, {2, 0}, {2, 50}, {1, 1}, {2, 1}}
	m := replay(t, Config{Name: NameNextN, Max: 1}, 64, accesses)
	// pid 1: 0 issues 1; 1 hits (lead 1: its second fault), issues 2.
	// pid 2: 0 issues 1; 50 issues 51; 1 hits (lead 2), issues 2.
	checkMetrics(t, m, Metrics{Prefetcher: "nextn", Processes: 2, Faults: 5, Hits: 2, Misses: 3, Prefetched: 5,
		Pollution: 3, Accuracy: 0.4, Coverage: 0.4, LeadP50: 1, LeadMean: 1.5, LeadOne: 1})

	// Two processes scanning with stride 3, interleaved fault by fault: one shared history
	// would see alternating deltas and no trend; per-process histories see +3 each.
	var inter []Access
	for i := range uint64(200) {
		inter = append(inter, Access{10, 1000 + 3*i}, Access{11, 90000 + 3*i})
	}
	if m := replay(t, Config{}, 4096, inter); m.Coverage < 0.8 {
		t.Errorf("two interleaved stride-3 processes: leap coverage %.2f, want >= 0.8", m.Coverage)
	}
	for i := range inter {
		inter[i].Pid = 10
	}
	if m := replay(t, Config{}, 4096, inter); m.Hits != 0 {
		t.Errorf("the same stream as one process: leap hit %d times, want 0 (no majority)", m.Hits)
	}
}

func TestReplayEmptyAndBadInput(t *testing.T) {
	m := replay(t, Config{}, 1, nil)
	checkMetrics(t, m, Metrics{Prefetcher: "leap"})
	for _, c := range []struct {
		cfg   Config
		cache int
		want  string
	}{
		{Config{}, 0, "prefetch cache of 0 pages: give 1 to 16777216"},
		{Config{}, -3, "prefetch cache of -3 pages"},
		{Config{Name: "oracle"}, 8, "unknown prefetcher"},
	} {
		if _, err := NewReplayer(c.cfg, c.cache); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewReplayer(%+v, %d): %v, want %q", c.cfg, c.cache, err, c.want)
		}
	}
}

// The cache never holds more than its size and its bookkeeping stays consistent through a
// long mixed stream (a hit, a re-issue of a hit page, evictions).
func TestReplayCacheBound(t *testing.T) {
	r, err := NewReplayer(Config{Name: NameReadahead}, 16)
	if err != nil {
		t.Fatal(err)
	}
	for i := range uint64(5000) {
		r.Access(uint32(i%3), (i*7919)%512)
		if f := r.cache; f.Len() > 16 || f.Len()+len(f.free) != 16 || len(f.index) != f.Len() {
			t.Fatalf("fault %d: %d cached, %d free of 16", i, f.Len(), len(f.free))
		}
	}
	m := r.Metrics()
	if m.Prefetched != m.Hits+m.Pollution || m.Hits == 0 || m.Evicted == 0 {
		t.Errorf("inconsistent or trivial: %+v", m)
	}
}
