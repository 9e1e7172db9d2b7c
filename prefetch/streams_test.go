package prefetch

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// interleaved is a fault stream where a walk in order over one region alternates with
// random faults elsewhere, as a collector's allocation beside a program's random reads:
// the walk's next page comes every other fault.
func interleaved(n int, seed uint64) []Access {
	rng := rand.New(rand.NewPCG(seed, 1))
	var out []Access
	next := uint64(1 << 20)
	for range n {
		out = append(out, Access{Page: next})
		next++
		out = append(out, Access{Page: 1<<30 + rng.Uint64N(1<<16)})
	}
	return out
}

// In map mode Leap finds no trend in an interleaved stream; the stream table follows the walk.
func TestStreamsFollowAWalkAmongRandomFaults(t *testing.T) {
	acc := interleaved(5000, 3)
	leap, err := Replay(Config{Name: NameLeap, Max: 32}, ModeMap, 4096, acc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := Replay(Config{Name: NameStreams, Max: 32}, ModeMap, 4096, acc)
	if err != nil {
		t.Fatal(err)
	}
	// The walk is half the faults: nearly all of it should be installed ahead.
	if st.Hits < 4500 {
		t.Errorf("streams: %d hits of the walk's 5000 pages (leap: %d)", st.Hits, leap.Hits)
	}
	if st.Accuracy < 0.9 {
		t.Errorf("streams: accuracy %.2f on a walk that never stops", st.Accuracy)
	}
	if leap.Hits >= st.Hits/2 {
		t.Errorf("leap %d hits, streams %d: the test's stream no longer defeats Leap", leap.Hits, st.Hits)
	}
}

// Random faults alone start no stream: nearly nothing is installed ahead.
func TestStreamsInstallNothingOnRandomFaults(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	p, err := New(Config{Name: NameStreams, Max: 32})
	if err != nil {
		t.Fatal(err)
	}
	var issued int
	out := make([]uint64, 0, 32)
	for range 20000 {
		issued += len(p.Access(rng.Uint64N(1<<18), false, out[:0]))
	}
	// Two random faults within streamSlack pages of each other, among 16 streams over 2^18
	// pages, come about once in 4000 faults.
	if issued > 200 {
		t.Errorf("%d pages issued for 20000 random faults", issued)
	}
}

// A stream's window doubles with every miss that continues it, from streamStart up to Max,
// and its pages follow the miss in order.
func TestStreamsWindowDoubles(t *testing.T) {
	p, err := New(Config{Name: NameStreams, Max: 16})
	if err != nil {
		t.Fatal(err)
	}
	out := make([]uint64, 0, 16)
	if got := p.Access(100, false, out[:0]); len(got) != 0 {
		t.Fatalf("a first fault installed %v", got)
	}
	page := uint64(101)
	for _, want := range []int{2, 4, 8, 16, 16} {
		got := p.Access(page, false, out[:0])
		var exp []uint64
		for d := range want {
			exp = append(exp, page+1+uint64(d))
		}
		// Leap may name the same pages first (the walk is its trend too): the set is what counts.
		slices.Sort(got)
		if !slices.Equal(got, exp) {
			t.Fatalf("miss at %d: installed %v, want %v", page, got, exp)
		}
		page += uint64(want) + 1 // the next miss is the page just past the window
	}
}
