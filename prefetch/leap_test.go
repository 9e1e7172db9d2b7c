package prefetch

import (
	"slices"
	"testing"
)

// workedExample is the fault stream of Leap's paper (section 3.1, Figure 4), as page numbers.
var workedExample = []uint64{0x48, 0x45, 0x42, 0x3F, 0x3C, 0x02, 0x04, 0x06, 0x08, 0x0A, 0x0C, 0x10, 0x39, 0x12, 0x14, 0x16}

func mustLeap(t *testing.T, c Config) *leap {
	t.Helper()
	c.Name = NameLeap
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return p.(*leap)
}

// The paper's example, with its history of 8 and Nsplit 2 (vote windows of 4 then 8): -3 is
// found at t3, lost as the stream turns at t6, +2 found at t8 and kept across the 0x10 and
// 0x39 irregulars, which the 8-delta window outvotes. Every fault is a miss here, so each
// window is 1 page (no hits to grow it) and nothing is speculated (the window is already 0
// when the trend is lost).
func TestLeapWorkedExample(t *testing.T) {
	l := mustLeap(t, Config{History: 8, Split: 2})
	want := []struct {
		trend    int64 // 0: none found
		prefetch []uint64
	}{
		{0, nil},             // t0 0x48: no delta yet
		{0, nil},             // t1 0x45: one -3 of 4 slots
		{0, nil},             // t2 0x42: two -3 of 4 slots: not a strict majority
		{-3, []uint64{0x3C}}, // t3 0x3F: three -3 of 4
		{-3, []uint64{0x39}}, // t4 0x3C
		{-3, nil},            // t5 0x02: -3 still holds 3 of the newest 4, but 0x02-3 would wrap below 0
		{0, nil},             // t6 0x04: {-3,-3,-58,+2}, then 4 of 8 -3: no majority
		{0, nil},             // t7 0x06: {-3,-58,+2,+2}, then 4 of 8 -3
		{2, []uint64{0x0A}},  // t8 0x08: {-58,+2,+2,+2}
		{2, []uint64{0x0C}},  // t9 0x0A
		{2, []uint64{0x0E}},  // t10 0x0C
		{2, []uint64{0x12}},  // t11 0x10: {+2,+2,+2,+4}
		{2, []uint64{0x3B}},  // t12 0x39: {+2,+2,+4,+41} has none; 5 of the newest 8 are +2
		{2, []uint64{0x14}},  // t13 0x12: 5 of 8
		{2, []uint64{0x16}},  // t14 0x14: 5 of 8
		{2, []uint64{0x18}},  // t15 0x16: 5 of 8
	}
	out := make([]uint64, 0, 8)
	for i, page := range workedExample {
		out = l.Access(page, false, out[:0])
		trend := int64(0)
		if l.hasTrend {
			trend = l.trend
		}
		if trend != want[i].trend || !slices.Equal(out, want[i].prefetch) {
			t.Errorf("t%d (page %#x): trend %d, prefetch %#x; want trend %d, prefetch %#x", i, page, trend, out, want[i].trend, want[i].prefetch)
		}
	}
}

// The authors' default: 32 deltas voted over in windows of 8, 16, 32. A trend needs 5 equal
// deltas in the newest 8 to be found at first.
func TestLeapDefaultWindows(t *testing.T) {
	l := mustLeap(t, Config{})
	if len(l.deltas) != 32 || l.first != 8 || l.max != 8 {
		t.Fatalf("defaults: history %d, first window %d, max %d; want 32, 8, 8", len(l.deltas), l.first, l.max)
	}
	var out []uint64
	for page := uint64(1000); page < 1005; page++ {
		if out = l.Access(page, false, out[:0]); len(out) != 0 || l.hasTrend {
			t.Fatalf("page %d: trend after %d deltas (out %v); want none before 5", page, page-1000, out)
		}
	}
	if out = l.Access(1005, false, out[:0]); !l.hasTrend || l.trend != 1 || !slices.Equal(out, []uint64{1006}) {
		t.Fatalf("after 5 deltas of +1: trend %v %d, out %v; want +1 and [1006]", l.hasTrend, l.trend, out)
	}
}

// The window follows the hits since the last decision: h hits make it h+1 rounded up to a
// power of two, capped at Max; with no hit it halves at most per miss, down to 1 while a
// trend holds.
func TestLeapWindowGrowsWithHitsAndShrinksByHalf(t *testing.T) {
	l := mustLeap(t, Config{History: 8, Split: 2, Max: 8})
	page := uint64(100)
	var out []uint64
	for range 4 { // 3 deltas of +1: a trend in the newest 4
		out = l.Access(page, false, out[:0])
		page++
	}
	if !slices.Equal(out, []uint64{104}) || l.window != 1 {
		t.Fatalf("trend found: out %v window %d; want [104] and 1", out, l.window)
	}
	for _, step := range []struct{ hits, window int }{
		{1, 2}, {2, 4}, {3, 4}, {4, 8}, {7, 8}, {20, 8}, // growth, capped at Max
		{0, 4}, {0, 2}, {0, 1}, {0, 1}, // no hits: halve, but a trend keeps 1
		{1, 2}, {0, 1},
	} {
		for range step.hits {
			if out = l.Access(page, true, out[:0]); len(out) != 0 {
				t.Fatalf("a hit answered %v: leap decides on misses only", out)
			}
			page++
		}
		out = l.Access(page, false, out[:0])
		want := make([]uint64, step.window)
		for i := range want {
			want[i] = page + uint64(i) + 1
		}
		if l.window != step.window || !slices.Equal(out, want) {
			t.Fatalf("miss after %d hits: window %d, out %v; want %d, %v", step.hits, l.window, out, step.window, want)
		}
		page++
	}
}

// With no trend found, leap keeps fetching along the previous trend while the window is not
// zero (halving per miss, or sized by hits if its guesses still pay), and stops at zero until
// a trend appears again.
func TestLeapSpeculatesAlongPreviousTrend(t *testing.T) {
	l := mustLeap(t, Config{History: 4, Split: 1, Max: 8}) // one window: 3 of 4 deltas
	var out []uint64
	feed := func(page uint64, hit bool) []uint64 {
		out = l.Access(page, hit, out[:0])
		return out
	}
	// Grow the window on a +1 stream: miss, hit, miss, 2 hits, miss, 4 hits, miss -> 8.
	for _, a := range []struct {
		page uint64
		hit  bool
	}{{0, false}, {1, false}, {2, false}, {3, false}, {4, true}, {5, false}, {6, true}, {7, true}, {8, false},
		{9, true}, {10, true}, {11, true}, {12, true}, {13, false}} {
		feed(a.page, a.hit)
	}
	if l.window != 8 || !slices.Equal(out, []uint64{14, 15, 16, 17, 18, 19, 20, 21}) {
		t.Fatalf("window %d out %v after the ramp; want 8 pages from 14", l.window, out)
	}
	steps := []struct {
		page     uint64
		hit      bool
		trend    bool
		prefetch []uint64
	}{
		{1000, false, true, []uint64{1001, 1002, 1003, 1004}}, // {1,1,1,987}: +1 still holds; window 8/2
		{3000, false, false, []uint64{3001, 3002}},            // no trend: speculate along +1, window 4/2
		{3001, true, false, nil},                              // the speculation hit
		{7000, false, false, []uint64{7001, 7002}},            // one hit: window 2, still along +1
		{9000, false, false, []uint64{9001}},                  // 2/2
		{100, false, false, nil},                              // 1/2 = 0: stop
		{200, false, false, nil},                              // stays stopped without a trend
		{202, false, false, nil},
		{204, false, false, nil}, // {-8900, 100, 2, 2}: 2 of 4
		{206, false, true, []uint64{208}},
	}
	for i, s := range steps {
		got := feed(s.page, s.hit)
		if !s.hit && l.hasTrend != s.trend || !slices.Equal(got, s.prefetch) {
			t.Errorf("step %d (page %d): trend %v prefetch %v; want trend %v prefetch %v", i, s.page, l.hasTrend, got, s.trend, s.prefetch)
		}
	}
}

// Predictions stop at the ends of the page space instead of wrapping.
func TestPredictionsNeverWrap(t *testing.T) {
	const top = ^uint64(0)
	for _, name := range Names() {
		p, _ := New(Config{Name: name, History: 4, Split: 1})
		var out []uint64
		// Descending by 1 towards 0, then ascending by 1 towards the top.
		for _, page := range []uint64{6, 5, 4, 3, 2, 1, 0, top - 6, top - 5, top - 4, top - 3, top - 2, top - 1, top} {
			out = p.Access(page, false, out[:0])
			for _, q := range out {
				if q == page {
					t.Errorf("%s: page %d predicted itself", name, page)
				}
				if page < 100 && q > 100 || page > top-100 && q < top-100 {
					t.Errorf("%s: page %d predicted %d: wrapped", name, page, q)
				}
			}
			if len(out) > DefaultMax {
				t.Errorf("%s: %d predictions, more than Max", name, len(out))
			}
		}
	}
}

func TestAppendStrideExtremes(t *testing.T) {
	const top = ^uint64(0)
	cases := []struct {
		page  uint64
		delta int64
		n     int
		want  []uint64
	}{
		{10, -3, 5, []uint64{7, 4, 1}},
		{top - 5, 2, 5, []uint64{top - 3, top - 1}},
		{1 << 63, -1 << 63, 3, []uint64{0}},
		{0, -1 << 63, 3, nil},
		{1, 1<<63 - 1, 3, []uint64{1 << 63, top}},
	}
	for _, c := range cases {
		if got := appendStride(nil, c.page, c.delta, c.n); !slices.Equal(got, c.want) {
			t.Errorf("appendStride(%d, %d, %d) = %v, want %v", c.page, c.delta, c.n, got, c.want)
		}
	}
}
