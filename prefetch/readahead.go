package prefetch

// readahead is Linux's swap read-ahead for one process (mm/swap_state.c: swapin_nr_pages
// sizes the window, swap_cluster_readahead reads the aligned cluster around the fault), over
// virtual page numbers instead of swap slots. See the package doc.
type readahead struct {
	max     int    // the largest window: a power of two (Linux: 1 << page-cluster)
	hits    int    // prefetch hits since the last miss (Linux: swapin_readahead_hits)
	window  int    // the last window decided: the next one is at least half of it
	prev    uint64 // the last miss that had no hit before it (Linux: prev_offset)
	hasPrev bool   // prev is valid
}

// initialHits is Linux's starting credit (swapin_readahead_hits = ATOMIC_INIT(4)): the
// first fault of a process reads a whole cluster.
const initialHits = 4

func newReadahead(max int) *readahead {
	return &readahead{max: floorPow2(max), hits: initialHits}
}

func (r *readahead) Name() string { return NameReadahead }

func (r *readahead) Access(page uint64, hit bool, out []uint64) []uint64 {
	if hit {
		r.hits++
		return out
	}
	// min: past max+1 the rounding below gives max anyway, and cannot overflow.
	pages := min(r.hits, r.max) + 2
	if r.hits == 0 {
		// No hit to judge by: read ahead only when the stream looks sequential, i.e. this
		// fault is next to the last one ("must not get stuck here forever").
		if !r.hasPrev || (page != r.prev+1 && page+1 != r.prev) {
			pages = 1
		}
		r.prev, r.hasPrev = page, true
	} else {
		pages = max(ceilPow2(pages), 4)
	}
	pages = max(min(pages, r.max), r.window/2) // don't shrink read-ahead too fast
	r.window, r.hits = pages, 0
	if pages <= 1 {
		return out
	}
	// The aligned cluster [lo, hi] holding page, nearest pages first. Aligned to pages (a
	// power of two: 1, 2 or a rounded value, all <= max), so it never wraps.
	mask := uint64(pages - 1)
	lo, hi := page&^mask, page|mask
	for d := uint64(1); d <= mask; d++ {
		if hi-page >= d {
			out = append(out, page+d)
		}
		if page-lo >= d {
			out = append(out, page-d)
		}
	}
	return out
}

// floorPow2 returns the largest power of two <= n (n >= 1).
func floorPow2(n int) int {
	p := 1
	for p*2 <= n {
		p *= 2
	}
	return p
}
