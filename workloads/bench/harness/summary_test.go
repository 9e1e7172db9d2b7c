package main

import (
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func run(wl string, c config, round int, tput float64, stop, oom bool) result {
	return result{wl: wl, cfg: c, round: round, capMiB: 16, tput: tput, wall: 1, timeout: stop || oom, oom: oom}
}

// A stopped run is counted, never entered as a zero: zram at 75 % with one of three runs
// OOM-killed was 0.91x with the zero in the median, 0.96x without.
func TestSummarizeSkipsStoppedRuns(t *testing.T) {
	zram := config{kind: "swap", swap: "zram", pct: 75}
	rs := []result{run("w", zram, 1, 0, false, true), run("w", zram, 2, 90, false, false), run("w", zram, 3, 100, false, false)}
	s, ok := summarize(rs, "w", zram)
	if !ok || s.n != 3 || s.ooms != 1 || s.timeouts != 1 || s.done() != 2 {
		t.Fatalf("counts: %+v", s)
	}
	if s.tput != 95 {
		t.Errorf("median %v, want 95 (of the two that finished)", s.tput)
	}
	if got := s.stopped(); got != "1 of 3 OOM-killed" {
		t.Errorf("stopped() = %q", got)
	}
	if !s.comparable() {
		t.Error("2 of 3 finished: comparable")
	}
	rs = append(rs, run("w", zram, 4, 0, true, false), run("w", zram, 5, 0, false, true))
	s, _ = summarize(rs, "w", zram)
	if s.comparable() || s.stopped() != "2 of 5 OOM-killed, 1 of 5 timed out" {
		t.Errorf("3 of 5 stopped: comparable %v, %q", s.comparable(), s.stopped())
	}
	none := []result{run("w", zram, 1, 0, false, true)}
	s, _ = summarize(none, "w", zram)
	if s.done() != 0 || !math.IsNaN(s.tput) {
		t.Errorf("none finished: %+v", s)
	}
}

// A target against a side that did not finish in most rounds is "not comparable", never met.
func TestTargetNotComparable(t *testing.T) {
	fm, zram := config{kind: "farmem", pct: 50}, config{kind: "swap", swap: "zram", pct: 50}
	rs := []result{run("redis-sys", config{kind: "native"}, 1, 100, false, false)}
	for r := 1; r <= 3; r++ {
		rs = append(rs, run("redis-sys", fm, r, 70, false, false), run("redis-sys", zram, r, 0, false, r != 2))
	}
	rs[len(rs)-3].tput = 93 // round 2's zram run finished
	h := &harness{refs: map[string]*ref{}}
	nat := map[string]stat{}
	nat["redis-sys"], _ = summarize(rs, "redis-sys", config{kind: "native"})
	var b strings.Builder
	h.targets(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, []workload{{name: "redis-sys", title: "redis SYS"}}, rs, nat)
	out := b.String()
	if !strings.Contains(out, "| farmem vs swap-zram at 50 % >= 1.5x | redis SYS | not comparable (swap-zram finished 1 of 3) | not comparable |") {
		t.Errorf("targets:\n%s", out)
	}
	if strings.Contains(out, "| met |") {
		t.Errorf("a target met against a side that was killed:\n%s", out)
	}
}

// -render reads back what writeCSV wrote, and keeps the run's header (not an earlier render's note).
func TestRenderRoundTrip(t *testing.T) {
	dir := t.TempDir()
	fm := config{kind: "farmem", pct: 50}
	rs := []result{
		{wl: "micro-random", cfg: config{kind: "native"}, round: 1, wall: 0.1, tput: 1e6},
		{wl: "micro-random", cfg: fm, round: 1, capMiB: 33, wall: 1, tput: 5e4, faults: 7, inB: 4096, outB: 8192, peakB: 33 << 20, fsP50: 13.8, fsP99: 221},
		{wl: "micro-random", cfg: config{kind: "swap", swap: "zram", pct: 50}, round: 1, capMiB: 33, limitB: 34 << 20, wall: 2, timeout: true, oom: true},
	}
	path := filepath.Join(dir, "swap.csv")
	if err := writeCSV(path, rs); err != nil {
		t.Fatal(err)
	}
	got, _, err := readResults(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rs) {
		t.Errorf("read back:\n%+v\nwant\n%+v", got, rs)
	}
	md := "# title\n\nCommand: `bin/farmem-bench -scale 2 -rounds 1` (x)\nMachine: m.\n\n**Re-rendered** before.\n\nEvery row is the median of ..."
	pre, cmd, err := preamble(md)
	if err != nil || cmd != "bin/farmem-bench -scale 2 -rounds 1" || strings.Contains(pre, "Re-rendered") || !strings.HasPrefix(pre, "Command:") {
		t.Errorf("preamble %q, command %q, %v", pre, cmd, err)
	}
}

func TestFootprints(t *testing.T) {
	refs := map[string]*ref{"a": {peakMiB: 1606}, "b": {peakMiB: 2066}}
	s := footprints([]workload{{name: "a"}, {name: "b"}}, refs)
	if strings.Contains(s, "small") || !strings.Contains(s, "1606-2066 MiB") {
		t.Errorf("GiB run: %q", s)
	}
	refs = map[string]*ref{"a": {peakMiB: 62}}
	if s := footprints([]workload{{name: "a"}}, refs); !strings.Contains(s, "small (native peaks 62 MiB") {
		t.Errorf("small run: %q", s)
	}
}
