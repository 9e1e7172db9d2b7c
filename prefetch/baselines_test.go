package prefetch

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// step feeds (page, hit) pairs and returns each answer.
func answers(t *testing.T, c Config, faults []struct {
	page uint64
	hit  bool
}) [][]uint64 {
	t.Helper()
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	var got [][]uint64
	for _, f := range faults {
		got = append(got, p.Access(f.page, f.hit, nil))
	}
	return got
}

type fault = struct {
	page uint64
	hit  bool
}

func checkAnswers(t *testing.T, name string, faults []fault, got, want [][]uint64) {
	t.Helper()
	for i := range want {
		if !slices.Equal(got[i], want[i]) {
			t.Errorf("%s: fault %d (page %d, hit %v): %v, want %v", name, i, faults[i].page, faults[i].hit, got[i], want[i])
		}
	}
}

// Linux's swap read-ahead: a full cluster first (the starting credit of 4 hits), a window
// sized by hits (at least 4), 2 for an adjacent fault and none for a lone one, never less
// than half the last window; always the aligned cluster around the fault, nearest first.
func TestReadahead(t *testing.T) {
	faults := []fault{{13, false}, {40, false}, {41, true}, {100, false}, {200, false}, {201, false}, {500, false}, {900, false}}
	want := [][]uint64{
		{14, 12, 15, 11, 10, 9, 8}, // credit 4: 4+2 -> 8 pages, the cluster 8..15
		{41, 42, 43},               // not next to 13: 1, but at least 8/2: cluster 40..43
		nil,                        // a hit: counted, not answered
		{101, 102, 103},            // 1 hit: 1+2 -> 4
		{201},                      // no hit, 200 not next to 40 (prev is kept across hit windows): 1, at least 4/2
		{200},                      // next to 200: 2, the aligned pair 200..201
		nil,                        // lone: 1 (2/2 = 1): no read-ahead
		nil,
	}
	checkAnswers(t, "readahead", faults, answers(t, Config{Name: NameReadahead}, faults), want)

	// Max is rounded down to a power of two: clusters are aligned.
	got := answers(t, Config{Name: NameReadahead, Max: 6}, []fault{{13, false}})
	if !slices.Equal(got[0], []uint64{14, 12, 15}) {
		t.Errorf("readahead with Max 6 (clusters of 4): %v, want [14 12 15]", got[0])
	}
}

// Baer and Chen's machine: a stride seen twice is followed; one irregular fault drops to
// initial but keeps the stride, so the stream resumes at once; a new stride must repeat.
func TestStride(t *testing.T) {
	faults := []fault{{10, false}, {20, false}, {30, false}, {40, true}, {45, false}, {55, false}, {56, false}, {57, false}, {58, false}, {1000, false}, {7, false}, {3000, false}}
	want := [][]uint64{
		nil,      // initial
		nil,      // transient, stride 10
		{40, 50}, // steady
		{50, 60}, // hits answer too
		nil,      // irregular: initial, stride kept
		{65, 75}, // 10 again: steady
		nil,      // initial
		nil,      // 1 != 10: transient, stride 1
		{59, 60}, // steady on +1
		nil,      // initial
		nil,      // transient, stride -993
		nil,      // no-prediction
	}
	checkAnswers(t, "stride", faults, answers(t, Config{Name: NameStride, Max: 2}, faults), want)
}

func TestNextNAndNone(t *testing.T) {
	faults := []fault{{5, false}, {6, true}, {100, false}}
	checkAnswers(t, "nextn", faults, answers(t, Config{Name: NameNextN, Max: 3}, faults), [][]uint64{{6, 7, 8}, {7, 8, 9}, {101, 102, 103}})
	checkAnswers(t, "none", faults, answers(t, Config{Name: NameNone}, faults), [][]uint64{nil, nil, nil})
}

// Page streams every prefetcher is scored on, 1000 faults of one process each.
func streams() map[string][]Access {
	s := map[string][]Access{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range uint64(1000) {
		s["sequential"] = append(s["sequential"], Access{1, 5000 + i})
		s["stride-10"] = append(s["stride-10"], Access{1, 5000 + 10*i})
		// Two sequential scans, one fault each in turn: the deltas alternate.
		if i%2 == 0 {
			s["interleaved"] = append(s["interleaved"], Access{1, 5000 + i/2})
		} else {
			s["interleaved"] = append(s["interleaved"], Access{1, 900000 + i/2})
		}
		s["random"] = append(s["random"], Access{1, rng.Uint64N(1 << 24)})
	}
	return s
}

func replayAll(t *testing.T, accesses []Access) map[string]Metrics {
	t.Helper()
	ms := map[string]Metrics{}
	for _, name := range Names() {
		m, err := Replay(Config{Name: name}, ModeCache, 4096, accesses)
		if err != nil {
			t.Fatal(err)
		}
		if m.Prefetched != m.Hits+m.Pollution || m.Misses != m.Faults-m.Hits || m.Faults != uint64(len(accesses)) {
			t.Errorf("%s: inconsistent %+v", name, m)
		}
		ms[name] = m
	}
	return ms
}

func TestBaselinesOnStreams(t *testing.T) {
	s := streams()

	seq := replayAll(t, s["sequential"])
	for _, name := range []string{NameLeap, NameReadahead, NameStride, NameNextN} {
		if m := seq[name]; m.Coverage < 0.85 || m.Accuracy < 0.95 {
			t.Errorf("sequential: %s coverage %.2f accuracy %.2f; want >= 0.85 and >= 0.95", name, m.Coverage, m.Accuracy)
		}
	}
	// Leap and readahead decide on misses: a window of 8 then a miss (8/9 and 7/8 covered);
	// nextn and stride, answering hits too, stay ahead.
	if seq[NameNextN].Misses > 2 || seq[NameStride].Misses > 3 {
		t.Errorf("sequential: nextn %d, stride %d misses; want the first faults only", seq[NameNextN].Misses, seq[NameStride].Misses)
	}
	if m := seq[NameNone]; m.Hits != 0 || m.Prefetched != 0 || m.Misses != 1000 {
		t.Errorf("none prefetched: %+v", m)
	}

	st := replayAll(t, s["stride-10"])
	if st[NameLeap].Misses >= st[NameNextN].Misses || st[NameLeap].Misses >= st[NameReadahead].Misses {
		t.Errorf("stride-10: leap %d misses, nextn %d, readahead %d; want leap fewest", st[NameLeap].Misses, st[NameNextN].Misses, st[NameReadahead].Misses)
	}
	if st[NameLeap].Coverage < 0.85 || st[NameStride].Coverage < 0.95 || st[NameNextN].Hits != 0 {
		t.Errorf("stride-10: leap %.2f, stride %.2f coverage, nextn %d hits", st[NameLeap].Coverage, st[NameStride].Coverage, st[NameNextN].Hits)
	}

	// Alternating deltas hold no majority and no repeated stride: leap and stride stay quiet
	// rather than guess; next-N and Linux's clusters follow both scans.
	in := replayAll(t, s["interleaved"])
	if in[NameLeap].Prefetched != 0 || in[NameStride].Prefetched != 0 {
		t.Errorf("interleaved: leap prefetched %d, stride %d; want 0", in[NameLeap].Prefetched, in[NameStride].Prefetched)
	}
	if in[NameNextN].Coverage < 0.95 || in[NameReadahead].Coverage < 0.75 {
		t.Errorf("interleaved: nextn %.2f, readahead %.2f coverage", in[NameNextN].Coverage, in[NameReadahead].Coverage)
	}

	rnd := replayAll(t, s["random"])
	if rnd[NameLeap].Pollution > rnd[NameReadahead].Pollution {
		t.Errorf("random: leap polluted %d pages, readahead %d; want leap no more", rnd[NameLeap].Pollution, rnd[NameReadahead].Pollution)
	}
	// Readahead's starting credit reads one cluster (7 pages), then its window halves: 3, 1.
	if rnd[NameReadahead].Pollution != 11 || rnd[NameNextN].Pollution != 8000 {
		t.Errorf("random: readahead polluted %d (want 11), nextn %d (want 8000)", rnd[NameReadahead].Pollution, rnd[NameNextN].Pollution)
	}
	for name, m := range rnd {
		if m.Hits != 0 {
			t.Errorf("random: %s hit %d times", name, m.Hits)
		}
	}
}

// Leap keeps a trend through irregular faults that break a stride machine's confidence: a
// stride-3 scan where every fifth fault lands elsewhere, so 2 deltas in 5 are noise. Once 16
// deltas are in, the 16-delta window always outvotes them (the first 8 may not).
func TestLeapKeepsTrendThroughNoise(t *testing.T) {
	l := mustLeap(t, Config{})
	rng := rand.New(rand.NewPCG(3, 4))
	var out []uint64
	for i := range uint64(400) {
		page := 5000 + 3*i
		if i%5 == 4 {
			page = rng.Uint64N(1 << 30)
		}
		out = l.Access(page, false, out[:0])
		if i >= 16 && (!l.hasTrend || l.trend != 3) {
			t.Fatalf("fault %d: trend %v %d, want +3 kept", i, l.hasTrend, l.trend)
		}
	}
}

func TestAccessDoesNotAllocate(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var pages []uint64
	for i := range uint64(256) {
		switch i / 64 {
		case 0:
			pages = append(pages, 1000+i)
		case 1:
			pages = append(pages, 1000+7*i)
		default:
			pages = append(pages, rng.Uint64N(1<<20))
		}
	}
	for _, name := range Names() {
		p, _ := New(Config{Name: name})
		out := make([]uint64, 0, DefaultMax)
		i := 0
		allocs := testing.AllocsPerRun(1000, func() {
			out = p.Access(pages[i%len(pages)], i%3 == 0, out[:0])
			i++
		})
		if allocs != 0 {
			t.Errorf("%s: %v allocations per Access", name, allocs)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	cases := []struct {
		c    Config
		want string // "" when valid
	}{
		{Config{}, ""},
		{Config{Name: "readahead", History: 64, Split: 8, Max: 32}, ""},
		{Config{Name: "leap", History: 2, Split: 2, Max: 1}, ""},
		{Config{Name: "majority"}, `unknown prefetcher "majority": choose one of leap, streams, readahead, stride, nextn, none`},
		{Config{Name: "Leap"}, "unknown prefetcher"},
		{Config{History: 1}, "prefetch history 1: give 2 to 4096"},
		{Config{History: -5}, "prefetch history -5"},
		{Config{History: 5000}, "prefetch history 5000"},
		{Config{Split: 3}, "prefetch split 3: give a power of two that divides the history (32)"},
		{Config{History: 8, Split: 16}, "prefetch split 16"},
		{Config{History: 12, Split: 8}, "prefetch split 8"},
		{Config{Split: -1}, "prefetch split -1"},
		{Config{Max: -1}, "prefetch max -1: give 1 to 1024"},
		{Config{Max: 1025}, "prefetch max 1025"},
	}
	for _, c := range cases {
		p, err := New(c.c)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("New(%+v): %v", c.c, err)
		case c.want == "" && p.Name() != c.c.WithDefaults().Name:
			t.Errorf("New(%+v) made %s", c.c, p.Name())
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("New(%+v): %v, want %q", c.c, err, c.want)
		}
	}
	for _, name := range Names() {
		if p, err := New(Config{Name: name}); err != nil || p.Name() != name {
			t.Errorf("New(%s): %v, %v", name, p, err)
		}
	}
}
