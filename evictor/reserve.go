package evictor

import (
	"math"
	"time"
)

// BurstReserve sizes Evictor.Reserve: room kept free below the cap for memory a program takes
// without faulting.
//
// Why a reserve: glibc's malloc maps its large blocks and grows its heaps with internal
// mmap/brk calls the shim cannot interpose, so their pages appear in the kernel's count with no
// fault to stop them. The runtime finds and registers such mappings within one of its RSS polls,
// but a program filling fresh malloc blocks can take more pages in that window than a batch
// evicts. Faults can be made to wait; these writes cannot. So after a burst is seen, the evictor keeps that much room free
// for the next one, and the cap holds as the kernel counts it. A program that allocates this
// way only rarely gets its room back as the reserve decays (it halves every HalfLife).
//
// It is a pure function of what it is told: the runtime feeds it the pages each poll adopted
// (found present in newly registered mappings) and stores the result in Evictor.Reserve.
type BurstReserve struct {
	Max      int64         // the reserve never exceeds this many pages
	HalfLife time.Duration // how fast a burst is forgotten

	level float64 // pages, as of at
	at    time.Time
}

// NewBurstReserve returns the reserve for a cap: at most half of it, so a program that keeps
// allocating unseen still has half its cap for the pages it faults in. It halves in 10 s: a
// program's allocation phases recur (the torture's every few seconds, a cache's on each load)
// and a reserve forgotten between them leaves every phase's first burst over the cap. (The
// torture's peak RssAnon at a 16 MiB cap, with no reserve and with half-lives of 1 s and 10 s,
// chose 10 s: see the git history of this file.)
func NewBurstReserve(capPages int64) *BurstReserve {
	return &BurstReserve{Max: capPages / 2, HalfLife: 10 * time.Second}
}

// Observe records that unseen pages arrived unseen at now and returns the reserve, in pages.
func (b *BurstReserve) Observe(now time.Time, unseen int64) int64 {
	if b.at.IsZero() || now.After(b.at) { // a clock stepping back decays nothing
		if !b.at.IsZero() && b.HalfLife > 0 {
			b.level *= math.Exp2(-float64(now.Sub(b.at)) / float64(b.HalfLife))
		}
		b.at = now
	}
	b.level = max(b.level, float64(unseen))
	return min(int64(b.level), b.Max)
}
