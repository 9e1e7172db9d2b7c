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

func replay(t *testing.T, c Config, mode Mode, pages int, accesses []Access) Metrics {
	t.Helper()
	m, err := Replay(c, mode, pages, accesses)
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
	m := replay(t, Config{Name: NameLeap, History: 8, Split: 2}, ModeCache, 64, pages(7, workedExample...))
	checkMetrics(t, m, Metrics{Prefetcher: "leap", Mode: ModeCache, Max: 8, Processes: 1, Faults: 16, Hits: 4, FedHits: 4, Misses: 12, Prefetched: 10,
		Pollution: 6, Accuracy: 0.4, Coverage: 0.25, LeadP50: 1, LeadMean: 1, LeadOne: 4})
}

// The paper's stream in map mode (history 8, split 2): the same 4 pages are used as in cache
// mode, but the prefetcher learns of 2 of them only, inferred at the next miss, and issues less:
//
//	t3  0x3F  miss, -3 found, window 1: 0x3C
//	t4  0x3C  hit (lead 1), unseen
//	t5  0x02  miss far from 0x3C: nothing inferred; -3 found (-61 -3 -3 -3), window 1, but
//	          0x02-3 wraps
//	t6  0x04  miss, no trend, no hit: window 0 (cache mode, with its hit: 2/2 = 1, 0x01)
//	t7  0x06  miss, no trend: 0
//	t8  0x08  miss, +2 found, window 1: 0x0A
//	t9  0x0A  hit (lead 1), unseen
//	t10 0x0C  miss right past 0x0A: inferred, 1 hit -> 2: 0x0E 0x10
//	t11 0x10  hit (lead 1), unseen; 0x0E is skipped
//	t12 0x39  miss far from 0x10: nothing inferred; +2 found, window 1: 0x3B
//	t13 0x12  miss, 0x3B not on its way: nothing inferred; +2 found over 8 deltas, window 1: 0x14
//	t14 0x14  hit (lead 1), unseen
//	t15 0x16  miss right past 0x14: inferred, 1 hit -> 2: 0x18 0x1A
//
// 8 pages issued, 4 used; 0x0E, 0x3B, 0x18, 0x1A never are.
func TestReplayWorkedExampleMap(t *testing.T) {
	m := replay(t, Config{Name: NameLeap, History: 8, Split: 2}, ModeMap, 64, pages(7, workedExample...))
	checkMetrics(t, m, Metrics{Prefetcher: "leap", Mode: ModeMap, Max: 8, Processes: 1, Faults: 16, Hits: 4, Misses: 12,
		Prefetched: 8, FedHits: 2, Pollution: 4, Accuracy: 0.5, Coverage: 0.25, LeadP50: 1, LeadMean: 1, LeadOne: 4})
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
	m := replay(t, Config{Name: NameNextN, Max: 2}, ModeCache, 2, pages(1, 0, 10, 1, 2, 4))
	checkMetrics(t, m, Metrics{Prefetcher: "nextn", Mode: ModeCache, Max: 2, Processes: 1, Faults: 5, Hits: 2, FedHits: 2, Misses: 3, Prefetched: 9,
		Pollution: 7, Evicted: 5, Accuracy: 2.0 / 9, Coverage: 0.4, LeadP50: 1, LeadMean: 1, LeadOne: 2})
}

// Lead counts the process's own faults between issue and use: next-4 on a scan issues 1..4
// at fault 1, then one page per fault, 4 faults ahead.
func TestReplayLead(t *testing.T) {
	m := replay(t, Config{Name: NameNextN, Max: 4}, ModeCache, 64, pages(1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9))
	// Hits on pages 1..9 with leads 1, 2, 3, 4, 4, 4, 4, 4, 4; pages 10..13 left unused.
	checkMetrics(t, m, Metrics{Prefetcher: "nextn", Mode: ModeCache, Max: 4, Processes: 1, Faults: 10, Hits: 9, FedHits: 9, Misses: 1, Prefetched: 13,
		Pollution: 4, Accuracy: 9.0 / 13, Coverage: 0.9, LeadP50: 4, LeadMean: 30.0 / 9, LeadOne: 1})
}

// Each pid has its own prefetcher and its own pages: the same page number in another
// process is another page, and a process's lead counts only its own faults.
func TestReplayPerProcess(t *testing.T) {
	accesses := []Access{{1, 0}, {2, 0}, {2, 50}, {1, 1}, {2, 1}}
	m := replay(t, Config{Name: NameNextN, Max: 1}, ModeCache, 64, accesses)
	// pid 1: 0 issues 1; 1 hits (lead 1: its second fault), issues 2.
	// pid 2: 0 issues 1; 50 issues 51; 1 hits (lead 2), issues 2.
	checkMetrics(t, m, Metrics{Prefetcher: "nextn", Mode: ModeCache, Max: 1, Processes: 2, Faults: 5, Hits: 2, FedHits: 2, Misses: 3, Prefetched: 5,
		Pollution: 3, Accuracy: 0.4, Coverage: 0.4, LeadP50: 1, LeadMean: 1.5, LeadOne: 1})

	// Two processes scanning with stride 3, interleaved fault by fault: one shared history
	// would see alternating deltas and no trend; per-process histories see +3 each.
	var inter []Access
	for i := range uint64(200) {
		inter = append(inter, Access{10, 1000 + 3*i}, Access{11, 90000 + 3*i})
	}
	if m := replay(t, Config{}, ModeCache, 4096, inter); m.Coverage < 0.8 {
		t.Errorf("two interleaved stride-3 processes: leap coverage %.2f, want >= 0.8", m.Coverage)
	}
	for i := range inter {
		inter[i].Pid = 10
	}
	if m := replay(t, Config{}, ModeCache, 4096, inter); m.Hits != 0 {
		t.Errorf("the same stream as one process: leap hit %d times, want 0 (no majority)", m.Hits)
	}
}

func TestReplayEmptyAndBadInput(t *testing.T) {
	for _, mode := range Modes() {
		m := replay(t, Config{}, mode, 1, nil)
		checkMetrics(t, m, Metrics{Prefetcher: "leap", Mode: mode, Max: DefaultMax})
	}
	for _, c := range []struct {
		cfg   Config
		mode  Mode
		pages int
		want  string
	}{
		{Config{}, ModeCache, 0, "prefetch cache of 0 pages: give 1 to 16777216"},
		{Config{}, ModeMap, -3, "prefetch cache of -3 pages"},
		{Config{Name: "oracle"}, ModeMap, 8, "unknown prefetcher"},
		{Config{}, "", 8, `unknown prefetch mode "": choose map or cache`},
		{Config{}, "both", 8, `unknown prefetch mode "both": choose map or cache`},
	} {
		if _, err := NewReplayer(c.cfg, c.mode, c.pages); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewReplayer(%+v, %q, %d): %v, want %q", c.cfg, c.mode, c.pages, err, c.want)
		}
	}
}

// In either mode the unused prefetched pages never exceed the bound and the bookkeeping stays
// consistent through a long mixed stream (hits, re-issues of hit pages, evictions).
func TestReplayCacheBound(t *testing.T) {
	for _, mode := range Modes() {
		r, err := NewReplayer(Config{Name: NameReadahead}, mode, 16)
		if err != nil {
			t.Fatal(err)
		}
		for i := range uint64(5000) {
			r.Access(uint32(i%3), (i*7919)%512)
			if f := r.cache; f.Len() > 16 || f.Len()+len(f.free) != 16 || len(f.index) != f.Len() {
				t.Fatalf("%s, fault %d: %d waiting, %d free of 16", mode, i, f.Len(), len(f.free))
			}
		}
		m := r.Metrics()
		if m.Prefetched != m.Hits+m.Pollution || m.Hits == 0 || m.Evicted == 0 {
			t.Errorf("%s: inconsistent or trivial: %+v", mode, m)
		}
	}
}

// seq returns the pages from to to-1 of pid.
func seq(pid uint32, from, to uint64) []Access {
	var a []Access
	for p := from; p < to; p++ {
		a = append(a, Access{pid, p})
	}
	return a
}

// On a sequential scan map mode's inference is exact: each miss lands right past the window,
// which is fed back as hits, so Leap's window grows as it does on cache hits and both modes
// hit and miss alike (history 4, split 2: a trend takes two equal deltas):
//
//	0, 1  miss, no trend                      7   miss, 2 hits: 4 pages, 8..11
//	2     miss, +1 found, window 1: 3         8-11  hits (leads 1-4)
//	3     hit (lead 1)                        12  miss, 4 hits: 8 pages, 13..20
//	4     miss, 1 hit: 2 pages, 5 6           13-19 hits (leads 1-7); 20 never used
//	5, 6  hits (leads 1, 2)
//
// Cache mode feeds its 14 hits as they happen; map mode feeds 1 + 2 + 4 at the misses that
// follow and never the last window's 7, which no miss follows. Without the inferred hits map
// mode's window would stay at 1 and miss every other page.
func TestReplayMapSequentialLeap(t *testing.T) {
	cfg := Config{Name: NameLeap, History: 4, Split: 2}
	want := Metrics{Prefetcher: "leap", Max: 8, Processes: 1, Faults: 20, Hits: 14, Misses: 6, Prefetched: 15,
		Pollution: 1, Accuracy: 14.0 / 15, Coverage: 0.7, LeadP50: 2, LeadMean: 3, LeadOne: 4}
	want.Mode, want.FedHits = ModeCache, 14
	checkMetrics(t, replay(t, cfg, ModeCache, 64, seq(1, 0, 20)), want)
	want.Mode, want.FedHits = ModeMap, 7
	checkMetrics(t, replay(t, cfg, ModeMap, 64, seq(1, 0, 20)), want)
}

// next-4 on a scan: in cache mode every hit is a fault that tops the cache up by one page,
// so one miss starts a stream that never misses again. In map mode a hit does not fault and
// nothing answers it: the program walks through the 4 installed pages and misses on the
// fifth, one miss a window (0, 5, 10, 15), as the live map mode pays.
func TestReplayMapNextNScan(t *testing.T) {
	cfg := Config{Name: NameNextN, Max: 4}
	// Pages 1..4 issued at fault 1 (leads 1-4), then page k at page k-4's fault (lead 4);
	// 20..23 left over.
	checkMetrics(t, replay(t, cfg, ModeCache, 64, seq(1, 0, 20)), Metrics{Prefetcher: "nextn", Mode: ModeCache, Max: 4,
		Processes: 1, Faults: 20, Hits: 19, Misses: 1, Prefetched: 23, FedHits: 19, Pollution: 4,
		Accuracy: 19.0 / 23, Coverage: 0.95, LeadP50: 4, LeadMean: 70.0 / 19, LeadOne: 1})
	// Four windows of 4, each used with leads 1-4; the last one's hits are never inferred.
	checkMetrics(t, replay(t, cfg, ModeMap, 64, seq(1, 0, 20)), Metrics{Prefetcher: "nextn", Mode: ModeMap, Max: 4,
		Processes: 1, Faults: 20, Hits: 16, Misses: 4, Prefetched: 16, FedHits: 12,
		Accuracy: 1, Coverage: 0.8, LeadP50: 2, LeadMean: 2.5, LeadOne: 4})
}

// The installed pages are bounded like the cache, the oldest unused one going first; a hit is
// invisible (nothing is issued for it), and the inference may count a page never used.
//
//	0   miss: 1 2 installed                     [1 2]
//	10  miss: nothing inferred (a jump); 11 12 push out 1 2      [11 12]  evicted 2
//	1   miss: nothing inferred; 2 3 push out 11 12               [2 3]    evicted 4
//	2   hit (lead 1), unseen                    [3]
//	4   miss, right past the window 2 3: both inferred used, though the program skipped 3;
//	    5 6 installed, 6 pushes out 3           [5 6]    evicted 5
//
// Cache mode on the same stream hits 2 and 4 (TestReplayFIFOEagerEviction): its hit on 2
// tops up 3 and 4.
func TestReplayMapFIFO(t *testing.T) {
	m := replay(t, Config{Name: NameNextN, Max: 2}, ModeMap, 2, pages(1, 0, 10, 1, 2, 4))
	checkMetrics(t, m, Metrics{Prefetcher: "nextn", Mode: ModeMap, Max: 2, Processes: 1, Faults: 5, Hits: 1, Misses: 4,
		Prefetched: 8, FedHits: 2, Pollution: 7, Evicted: 5, Accuracy: 1.0 / 8, Coverage: 0.2, LeadP50: 1, LeadMean: 1, LeadOne: 1})
}

// A scan that jumps: map mode cannot see the hits of the window the program used before its
// jump (the miss lands far from it), so Leap restarts at a window of 1 after the jump where
// cache mode, having seen 2 hits, goes on with 4 (history 4, split 2):
//
//	0-6     as TestReplayMapSequentialLeap in both modes: misses 0 1 2 4, hits 3 5 6
//	1000    miss; cache: 2 hits, 4 pages 1001..1004    map: none inferred, 1 page: 1001
//	1001    hit in both                                map: hit, unseen
//	1002-4  cache: hits                                map: 1002 miss (1001 inferred:
//	                                                   2 pages, 1003 1004), then hits
//	1005    cache: miss, 4 hits: 8 pages 1006..1013    map: miss, 2 inferred: 4 pages 1006..1009
//	1006    hit in both
func TestReplayMapJump(t *testing.T) {
	stream := append(seq(1, 0, 7), seq(1, 1000, 1007)...)
	cfg := Config{Name: NameLeap, History: 4, Split: 2}
	type counts struct{ Hits, Misses, Prefetched, Pollution, FedHits uint64 }
	for _, c := range []struct {
		mode Mode
		want counts
	}{
		{ModeCache, counts{Hits: 8, Misses: 6, Prefetched: 15, Pollution: 7, FedHits: 8}},
		{ModeMap, counts{Hits: 7, Misses: 7, Prefetched: 10, Pollution: 3, FedHits: 4}},
	} {
		m := replay(t, cfg, c.mode, 64, stream)
		if got := (counts{m.Hits, m.Misses, m.Prefetched, m.Pollution, m.FedHits}); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.mode, got, c.want)
		}
	}
}

// On a random stream nothing is hit in either mode, nothing is inferred, and with no hits to
// tell apart both modes feed the prefetcher the same stream: the same pages are issued.
func TestReplayMapRandom(t *testing.T) {
	s := streams()["random"]
	for _, name := range Names() {
		byMode := map[Mode]Metrics{}
		for _, mode := range Modes() {
			m := replay(t, Config{Name: name}, mode, 4096, s)
			if m.Hits != 0 || m.FedHits != 0 || m.Misses != uint64(len(s)) || m.Pollution != m.Prefetched {
				t.Errorf("%s, %s on a random stream: %+v, want no hit", name, mode, m)
			}
			byMode[mode] = m
		}
		if p, q := byMode[ModeMap].Prefetched, byMode[ModeCache].Prefetched; p != q {
			t.Errorf("%s on a random stream: map mode prefetched %d pages, cache mode %d", name, p, q)
		}
	}
}
