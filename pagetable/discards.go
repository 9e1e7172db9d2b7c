package pagetable

import "time"

// ZapLag bounds how long after its REMOVE event is read the program's discard may still be to
// happen. madvise(MADV_DONTNEED) on a registered range queues the event and waits until the
// fault thread reads it; only then, once its thread runs again, does it zap the pages. Until the
// zap, pagemap shows them present. The bound is a scheduling delay with a wide margin: what
// rests on it (Discarding) only ever leaves a page uncounted, never loses one.
const ZapLag = 2 * time.Second

// discard is one of the program's REMOVE events: [start, end), read at at.
type discard struct {
	start, end uint64
	at         time.Time
}

// noteDiscard remembers the program's discard of [start, end), read at at, for ZapLag, and
// forgets the ones older. Discards arrive in the order they were read.
func (t *PageTable) noteDiscard(start, end uint64, at time.Time) {
	old := 0
	for old < len(t.discards) && at.Sub(t.discards[old].at) > ZapLag {
		old++
	}
	t.discards = append(t.discards[old:], discard{start, end, at})
}

// Discarding reports whether a discard of the program's read within ZapLag before now overlaps
// [start, end): its zap may not have happened yet, so the pages pagemap shows present there
// may be about to read as zeros. adopt leaves them alone: recorded resident, such a page would
// fault once zapped, on a record farmem cannot serve.
func (t *PageTable) Discarding(start, end uint64, now time.Time) bool {
	for i := len(t.discards) - 1; i >= 0; i-- {
		d := &t.discards[i]
		if now.Sub(d.at) > ZapLag {
			return false
		}
		if d.start < end && start < d.end {
			return true
		}
	}
	return false
}
