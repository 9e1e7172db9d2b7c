package prefetch

// leap is Leap's majority-trend prefetcher for one process (see the package doc).
type leap struct {
	deltas   []int64 // ring of the newest page deltas, len History; deltas[head-1] is the newest
	head     int     // where the next delta goes
	filled   int     // deltas recorded so far, up to len(deltas): younger slots vote for nothing
	first    int     // the first vote window (History/Split); it doubles up to len(deltas)
	max      int     // the largest prefetch window (Max)
	last     uint64  // the previous fault's page, the base of the next delta
	started  bool    // a fault was seen: last is valid
	hits     int     // prefetch hits since the last window decision (the paper's Chit)
	window   int     // the last window decided (PWsize_{t-1}): how far the next one may shrink
	trend    int64   // the newest majority delta found, 0 before any: speculation follows it
	hasTrend bool    // whether the last decision found a trend (for tests and inspection)
}

func newLeap(history, split, max int) *leap {
	return &leap{deltas: make([]int64, history), first: history / split, max: max}
}

func (l *leap) Name() string { return NameLeap }

func (l *leap) Access(page uint64, hit bool, out []uint64) []uint64 {
	if l.started {
		// Two's complement: the delta is right for any two pages less than 2^63 apart.
		l.deltas[l.head] = int64(page - l.last)
		if l.head++; l.head == len(l.deltas) {
			l.head = 0
		}
		l.filled = min(l.filled+1, len(l.deltas))
	}
	l.last, l.started = page, true
	if hit {
		// The last window is paying off; the next miss sizes the window by how much.
		l.hits++
		return out
	}
	trend, found := l.findTrend()
	l.hasTrend = found
	if found {
		l.trend = trend
	}
	w := 0
	switch {
	case l.hits > 0:
		// min: past max the answer is max anyway, and the rounding cannot overflow.
		w = ceilPow2(min(l.hits, l.max) + 1)
	case found:
		w = 1
	}
	w = max(min(w, l.max), l.window/2)
	l.window, l.hits = w, 0
	if w == 0 || l.trend == 0 {
		return out
	}
	return appendStride(out, page, l.trend, w)
}

// findTrend votes over the newest first, 2*first, ... len(deltas) deltas and returns the
// first strict majority that is not 0.
func (l *leap) findTrend() (int64, bool) {
	for w := l.first; w <= len(l.deltas); w *= 2 {
		if d, ok := l.majority(w); ok && d != 0 {
			return d, true
		}
	}
	return 0, false
}

// majority returns the delta that fills more than half of the newest w slots, if one does:
// Boyer-Moore's vote finds the only candidate, a second pass counts it. It runs at every miss,
// up to three times on the fault thread's path: the ring is walked by index, with no division.
func (l *leap) majority(w int) (int64, bool) {
	n := min(w, l.filled)
	var candidate int64
	votes := 0
	j := l.head
	for range n {
		if j--; j < 0 {
			j = len(l.deltas) - 1
		}
		switch d := l.deltas[j]; {
		case votes == 0:
			candidate, votes = d, 1
		case d == candidate:
			votes++
		default:
			votes--
		}
	}
	count := 0
	j = l.head
	for range n {
		if j--; j < 0 {
			j = len(l.deltas) - 1
		}
		if l.deltas[j] == candidate {
			count++
		}
	}
	return candidate, count > w/2
}

// ceilPow2 returns the smallest power of two >= n (n >= 1).
func ceilPow2(n int) int {
	p := 1
	for p < n {
		p <<= 1
	}
	return p
}
