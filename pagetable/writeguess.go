package pagetable

// writeGuess decides whether a page read back on a read fault (or prefetched) is installed
// writable for every page of the process, or only for those written in their last stay
// (WasWritten). It does no I/O: the table tells it how each such stay ended.
//
// A page installed write-protected (Clean) costs a WP fault if the stay writes it, a round
// trip to farmem and back. One installed writable on a guess costs, if the stay does not write
// it, what the evictor does to tell: copy it out, checksum it and store it again, where a Clean
// page unwritten is dropped in place. The WP fault costs several times the copy and the store
// (results/writeguess/writeguess.md has both, per page), so guessing for every page pays once
// more than about a fifth of the stays write. WasWritten alone misses a page whose last stay
// only read it, and a program that writes most pages it reads back (xz's match finder) then
// takes a WP fault on many of them (results/writeguess/writeguess.md).
//
// So it counts, over windows of guessWindow such stays, how many wrote their page (a Clean
// page's by its WP fault, a guessed page's by its checksum), and guesses for every page while
// the share is high: from guessAllOn up, until it falls below guessAllOff (hysteresis: the
// share measured under one setting is no less true under the other, but a program near the
// line should not flip at every window).
type writeGuess struct {
	all     bool   // guess writable for every page read back
	stays   uint32 // stays counted in this window
	written uint32 // of which wrote their page
}

const (
	guessWindow = 1024
	guessAllOn  = guessWindow * 3 / 10 // 30 % of the stays wrote
	guessAllOff = guessWindow * 2 / 10 // below 20 %
)

// stay records the end (eviction) of a stay that began with a read-back page installed on a
// read, and whether the stay wrote it.
func (g *writeGuess) stay(written bool) {
	g.stays++
	if written {
		g.written++
	}
	if g.stays < guessWindow {
		return
	}
	switch {
	case g.written >= guessAllOn:
		g.all = true
	case g.written < guessAllOff:
		g.all = false
	}
	g.stays, g.written = 0, 0
}
