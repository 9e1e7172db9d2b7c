package prefetch

// ConsumedBetween is map mode's hit inference. In map mode a predicted page is installed
// straight into the program, so the program's accesses to it never fault and nobody sees
// them; what the fault path does see is the program's next miss. ConsumedBetween infers,
// from where that miss lands, which of the pages predicted and installed at the previous miss
// the program used in between: those it must have walked through to get there. The caller
// feeds them to its Prefetcher as hits (Access with hit set, their predictions discarded),
// then feeds the miss itself, so the history holds the stream's real deltas rather than the
// gaps between misses, and Leap's window grows with them as it does with cache hits.
//
// prev is the page of the previous miss, window the pages installed for it in prediction
// order (only those actually queued: a prediction skipped as resident is not in it), miss the
// page of this miss. Walking window in order, a page counts while it lies strictly between
// prev and miss; the run counts only if miss lands within one step of the last page counted,
// where the step is the larger of the distance from prev to window[0] and the last gap in the
// run (the stream went on past the window, or stopped inside it). A miss anywhere else (a
// jump, another stream) says nothing about the window, and nothing counts. The inferred pages
// are appended to out, in window order; window is not modified. It is pure, allocates only
// when out is short of room, and works in either direction and on any stride.
//
// The inference can be wrong both ways: a page the program skipped inside a run it walked
// through counts as used, and pages it used before jumping elsewhere do not.
func ConsumedBetween(prev uint64, window []uint64, miss uint64, out []uint64) []uint64 {
	between := func(x uint64) bool { return (prev < x && x < miss) || (miss < x && x < prev) }
	dist := func(a, b uint64) uint64 { return max(a, b) - min(a, b) }
	c := 0
	for c < len(window) && between(window[c]) {
		c++
	}
	if c == 0 {
		return out
	}
	step := dist(window[0], prev)
	if c > 1 {
		step = max(step, dist(window[c-1], window[c-2]))
	}
	if dist(miss, window[c-1]) > step {
		return out
	}
	return append(out, window[:c]...)
}
