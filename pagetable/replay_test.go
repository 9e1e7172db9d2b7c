package pagetable

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func seqOf(pages []uint64) func(func(uint64) bool) { return slices.Values(pages) }

// fifoMisses is first-in first-out at frames pages, the definition.
func fifoMisses(seq []uint64, frames int) int {
	var q []uint64
	misses := 0
	for _, p := range seq {
		if slices.Contains(q, p) {
			continue
		}
		misses++
		q = append(q, p)
		if len(q) > frames {
			q = q[1:]
		}
	}
	return misses
}

// With no heat, no block mates and no head, Replay is FIFO at the cap: Belady's
// anomaly (9 misses at 3 frames, 10 at 4), and FIFO's definition on random streams.
func TestReplayPlainIsFIFO(t *testing.T) {
	belady := []uint64{1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5}
	for frames, want := range map[int]uint64{3: 9, 4: 10} {
		r := Replay(seqOf(belady), ReplayConfig{Cap: frames, Head: 0, Batch: 256, VictimBlock: 1})
		if r.Faults != want || r.Refaults != want-5 {
			t.Errorf("%d frames: %+v, want %d faults, %d of them re-faults", frames, r, want, want-5)
		}
	}
	rnd := rand.New(rand.NewPCG(5, 6))
	for range 20 {
		seq := make([]uint64, 2000)
		for i := range seq {
			seq[i] = 0x7f000 + uint64(rnd.IntN(40))
		}
		frames := 2 + rnd.IntN(30)
		r := Replay(seqOf(seq), ReplayConfig{Cap: frames, Head: 0, Batch: 256, VictimBlock: 1})
		if int(r.Faults) != fifoMisses(seq, frames) {
			t.Fatalf("%d frames: %d faults, FIFO takes %d", frames, r.Faults, fifoMisses(seq, frames))
		}
	}
}

// The head is room kept free: with more of it, the table holds fewer pages and misses more on
// a loop it could otherwise hold; and the second chances take fewer faults than FIFO on a
// skewed stream, as the live evictor's do (replace_test.go replays the same policy).
func TestReplayHeadAndHeat(t *testing.T) {
	var loop []uint64
	for range 5 {
		for p := range uint64(100) {
			loop = append(loop, p)
		}
	}
	if r := Replay(seqOf(loop), ReplayConfig{Cap: 100, Head: 0, Batch: 256, VictimBlock: 1}); r.Refaults != 0 {
		t.Errorf("a 100-page loop at a 100-page cap: %d re-faults, want 0", r.Refaults)
	}
	if r := Replay(seqOf(loop), ReplayConfig{Cap: 100, Head: 8, Batch: 256, VictimBlock: 1}); r.Refaults != 400 {
		t.Errorf("a 100-page loop at a 100-page cap with 8 pages of head: %d re-faults, want every access after the first pass (400)", r.Refaults)
	}
	rnd := rand.New(rand.NewPCG(7, 8))
	skew := make([]uint64, 200_000)
	for i := range skew {
		if rnd.IntN(10) < 8 {
			skew[i] = uint64(rnd.IntN(200)) // 80 % of the accesses to 200 pages
		} else {
			skew[i] = 1000 + uint64(rnd.IntN(4000))
		}
	}
	fifo := Replay(seqOf(skew), ReplayConfig{Cap: 1000, Head: 64, Batch: 256, VictimBlock: 1})
	heat := Replay(seqOf(skew), ReplayConfig{Cap: 1000, Head: 64, Batch: 256, MaxHeat: DefaultMaxHeat, VictimBlock: 1})
	if heat.Refaults >= fifo.Refaults {
		t.Errorf("skewed stream: %d re-faults with second chances, FIFO %d: want fewer", heat.Refaults, fifo.Refaults)
	}
}
