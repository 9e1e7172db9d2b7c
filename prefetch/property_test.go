package prefetch

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// Whatever the stream and settings: at most Max predictions, never the faulting page, never
// the same page twice in one answer, and the same answers for the same stream (no hidden
// state beyond the Prefetcher).
func TestPredictionInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	const top = ^uint64(0)
	for round := range 200 {
		history := []int{2, 4, 8, 32, 64}[rng.IntN(5)]
		split := 1 << rng.IntN(3)
		for history%split != 0 || split > history {
			split /= 2
		}
		c := Config{Name: Names()[round%len(Names())], History: history, Split: split, Max: 1 + rng.IntN(16)}
		var stream []fault
		page := rng.Uint64()
		if rng.IntN(4) == 0 {
			page = rng.Uint64N(64) // near 0
		} else if rng.IntN(4) == 0 {
			page = top - rng.Uint64N(64) // near the top
		}
		for range 300 {
			switch rng.IntN(6) {
			case 0:
				page = rng.Uint64()
			case 1:
				page += uint64(rng.IntN(7)) - 3
			default:
				page++
			}
			stream = append(stream, fault{page, rng.IntN(3) == 0})
		}
		a, b := answers(t, c, stream), answers(t, c, stream)
		for i, out := range a {
			if !slices.Equal(out, b[i]) {
				t.Fatalf("%+v: fault %d answered %v then %v", c, i, out, b[i])
			}
			if len(out) > c.Max {
				t.Fatalf("%+v: fault %d (page %d): %d predictions", c, i, stream[i].page, len(out))
			}
			seen := map[uint64]bool{}
			for _, q := range out {
				if q == stream[i].page || seen[q] {
					t.Fatalf("%+v: fault %d (page %d): %v repeats a page", c, i, stream[i].page, out)
				}
				seen[q] = true
			}
		}
	}
}
