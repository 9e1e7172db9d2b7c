package pagetable

import (
	"container/list"
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/farmem/farmem/backend"
)

// The replacement policy, replayed on access traces without a kernel: the real PageTable
// (Install, Refaulted, Victims) against a simulated cap, with the evictor's watermarks. Only
// faults reach the table, as in farmem: a resident page's accesses are invisible to it.

const simBase = 0x7f00_0000_0000

// simulate replays trace (page indices) through a table with the given policy at capPages and
// returns its faults.
func simulate(trace []int, capPages, maxHeat, block int) int {
	f, _ := simulateRuns(trace, capPages, maxHeat, block)
	return f
}

// simulateRuns is simulate that also returns the contiguous runs the batches took out: each
// costs a TLB flush in this VM, about what a fault costs.
func simulateRuns(trace []int, capPages, maxHeat, block int) (faults, runs int) {
	var res atomic.Int64
	tb := New(&res, NewSlots(backend.NewMemory()))
	tb.MaxHeat, tb.VictimBlock = uint8(maxHeat), block
	head := max(capPages/16, 1) // evict from cap down to cap-head in batches, as the evictor
	var victims []uint64
	for _, i := range trace {
		p := simBase + uint64(i)*backend.PageSize
		e := tb.Get(p)
		if e != nil && e.State == Resident {
			continue
		}
		faults++
		if ne := tb.Install(p, Written, 0); e != nil {
			tb.Refaulted(ne)
		}
		for tb.Resident() > capPages {
			victims = tb.Victims(min(tb.Resident()-(capPages-head), 256), victims)
			if len(victims) == 0 {
				panic("no victim")
			}
			for k, v := range victims {
				if k == 0 || victims[k-1]+backend.PageSize != v {
					runs++
				}
				tb.CommitStaged(v, tb.Get(v), 0)
			}
		}
	}
	return faults, runs
}

// lruFaults is the reference no policy of ours can reach without access bits.
func lruFaults(trace []int, capPages int) int {
	l := list.New()
	at := map[int]*list.Element{}
	faults := 0
	for _, p := range trace {
		if el, ok := at[p]; ok {
			l.MoveToFront(el)
			continue
		}
		faults++
		at[p] = l.PushFront(p)
		if l.Len() > capPages {
			delete(at, l.Remove(l.Back()).(int))
		}
	}
	return faults
}

// zipfTrace draws n accesses over pages pages, Zipf-distributed with exponent s (YCSB's 0.99
// is below 1, which math/rand's Zipf does not take), the ranks scattered over the pages as a
// hash table scatters hot keys.
func zipfTrace(r *rand.Rand, pages, n int, s float64, perm []int) []int {
	cdf := make([]float64, pages)
	sum := 0.0
	for k := range cdf {
		sum += 1 / math.Pow(float64(k+1), s)
		cdf[k] = sum
	}
	out := make([]int, n)
	for i := range out {
		u := r.Float64() * sum
		lo, hi := 0, pages-1
		for lo < hi {
			mid := (lo + hi) / 2
			if cdf[mid] < u {
				lo = mid + 1
			} else {
				hi = mid
			}
		}
		out[i] = perm[lo]
	}
	return out
}

type simCase struct {
	name  string
	trace []int
	cap   int
}

func simCases() []simCase {
	const pages = 16384
	r := rand.New(rand.NewPCG(1, 2))
	perm := r.Perm(pages)
	zipf := zipfTrace(r, pages, 600_000, 0.99, perm)
	// The hot set moves halfway: a policy must let the old hot pages go.
	shifted := append(zipfTrace(r, pages, 300_000, 0.99, perm), zipfTrace(r, pages, 300_000, 0.99, r.Perm(pages))...)
	// Zipf with a one-pass scan of a cold region every 100k accesses (a batch job, a BGSAVE).
	var scanned []int
	for i, p := range zipfTrace(r, pages, 600_000, 0.99, perm) {
		scanned = append(scanned, p)
		if i%100_000 == 99_999 {
			for q := pages; q < pages+4096; q++ {
				scanned = append(scanned, q)
			}
		}
	}
	var loop []int // a loop over 1.25x the cap: FIFO and LRU both miss every access
	for range 20 {
		for q := range pages * 5 / 8 {
			loop = append(loop, q)
		}
	}
	return []simCase{
		{"zipf 50%", zipf, pages / 2}, {"zipf 25%", zipf, pages / 4},
		{"zipf, hot set moves, 50%", shifted, pages / 2},
		{"zipf + cold scans, 50%", scanned, pages / 2},
		{"loop of 1.25x the cap", loop, pages / 2},
	}
}

// The policy's decisions on a replayed trace, against FIFO on the same trace: fewer faults
// where some pages are used more than others, no more where none is, and no more runs (each a
// TLB flush). The traces are seeded: the counts are the same every run.
func TestReplacementBeatsFIFOOnSkew(t *testing.T) {
	for _, c := range simCases() {
		ff, fr := simulateRuns(c.trace, c.cap, 0, DefaultVictimBlock)
		hf, hr := simulateRuns(c.trace, c.cap, DefaultMaxHeat, DefaultVictimBlock)
		t.Logf("%-28s faults fifo %d heat %d (%.1f %%), runs fifo %d heat %d, lru faults %d",
			c.name, ff, hf, 100*float64(hf-ff)/float64(ff), fr, hr, lruFaults(c.trace, c.cap))
		if hr > fr+fr/20 {
			t.Errorf("%s: %d runs, FIFO %d: the policy must not scatter the victims", c.name, hr, fr)
		}
		if c.name == "loop of 1.25x the cap" {
			if hf > ff {
				t.Errorf("%s: %d faults, FIFO %d: no page is hotter, nothing to gain and nothing to lose", c.name, hf, ff)
			}
			continue
		}
		if hf >= ff {
			t.Errorf("%s: %d faults, no fewer than FIFO's %d", c.name, hf, ff)
		}
	}
}

// A page faulted back within a pass of its eviction is passed over once per Level; one that
// comes back later starts over; with MaxHeat 0 the queue is plain FIFO.
func TestRefaultedEarnsPasses(t *testing.T) {
	const hot, ps = 0x10000, backend.PageSize
	for _, maxHeat := range []uint8{0, 2} {
		tb, _, _ := newTable(t)
		tb.VictimBlock, tb.MaxHeat = 1, maxHeat
		evictOne := func() uint64 {
			v := tb.Victims(1, nil)
			if len(v) != 1 {
				t.Fatalf("MaxHeat %d: no victim", maxHeat)
			}
			tb.CommitStaged(v[0], tb.Get(v[0]), 0)
			return v[0]
		}
		for p := uint64(hot); p < hot+8*ps; p += ps {
			tb.Install(p, Written, 0)
		}
		if v := evictOne(); v != hot {
			t.Fatalf("first victim %#x, want the oldest %#x", v, hot)
		}
		// Faulted back at once: 1 eviction since, 7 pages resident.
		tb.Refaulted(tb.Install(hot, Written, 0))
		if e := tb.Get(hot); e.Level() != min(1, maxHeat) || e.Heat() != e.Level() {
			t.Fatalf("MaxHeat %d: after a quick re-fault %+v, want level and heat %d", maxHeat, e, min(1, maxHeat))
		}
		// Two pages come after it. With heat it is passed over once, and goes after them too.
		tb.Install(hot+8*ps, Written, 0)
		tb.Install(hot+9*ps, Written, 0)
		var order []uint64
		for range 10 {
			order = append(order, evictOne())
		}
		want := 7 // FIFO: the 7 older pages, then it
		if maxHeat > 0 {
			want = 9 // passed over once: behind the two newer pages
		}
		if order[want] != hot {
			t.Fatalf("MaxHeat %d: eviction order %#x, want the hot page at %d", maxHeat, order, want)
		}
		// Faulted back after three more pages came and went, with nothing resident: far (a pass
		// was 0 pages long). It starts over.
		for p := uint64(hot + 16*ps); p < hot+19*ps; p += ps {
			tb.Install(p, Written, 0)
		}
		for range 3 {
			evictOne()
		}
		tb.Refaulted(tb.Install(hot, Written, 0))
		if e := tb.Get(hot); e.Level() != 0 || e.Heat() != 0 {
			t.Fatalf("MaxHeat %d: after a late re-fault %+v, want level 0", maxHeat, e)
		}
	}
}

// When every resident page has heat left, Victims still returns what was asked, after a
// bounded walk (the fault thread waits for the table's lock meanwhile).
func TestVictimsWhenAllHot(t *testing.T) {
	tb, _, _ := newTable(t)
	tb.VictimBlock, tb.MaxHeat = 1, 15
	const n = 4096
	for i := range uint64(n) {
		p := 0x100000 + i*backend.PageSize
		tb.Install(p, Written, 0)
		tb.Get(p).setHeat(15)
	}
	if v := tb.Victims(4, nil); len(v) != 4 {
		t.Fatalf("%d victims, want 4", len(v))
	}
	if got := len(tb.fifo) - tb.head; got != n-4 {
		t.Fatalf("%d pages queued after the batch, want %d: each passed-over page is queued once", got, n-4)
	}
}
