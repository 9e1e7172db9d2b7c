package pagetable

import (
	"sync/atomic"
	"testing"

	"github.com/farmem/farmem/backend"
)

// window feeds g one window of stays, written of which wrote their page.
func (g *writeGuess) window(written int) {
	for i := range guessWindow {
		g.stay(i < written)
	}
}

func TestWriteGuessFollowsTheShareOfStaysThatWrite(t *testing.T) {
	var g writeGuess
	for _, c := range []struct {
		written int
		want    bool
		why     string
	}{
		{guessWindow / 2, true, "half the stays wrote"},
		{guessWindow / 4, true, "a quarter: between the thresholds, kept on"},
		{guessWindow / 10, false, "a tenth: off"},
		{guessWindow / 4, false, "a quarter: between the thresholds, kept off"},
		{guessAllOn, true, "exactly the threshold: on"},
		{guessAllOff, true, "exactly the lower threshold: still on"},
		{guessAllOff - 1, false, "just below it: off"},
	} {
		if g.stays != 0 {
			t.Fatalf("a window left %d stays counted", g.stays)
		}
		g.window(c.written)
		if g.all != c.want {
			t.Fatalf("%s: all %v, want %v", c.why, g.all, c.want)
		}
	}
	// Mid-window, nothing changes.
	g.stay(true)
	if g.all {
		t.Fatal("one stay turned the guess on mid-window")
	}
}

// The table learns from how stays of pages read back end: a process whose read-back pages are
// mostly written has every page read back installed writable, even one its last stay only
// read; stays that began with a write or a zero fill teach nothing.
func TestTableGuessesForEveryPageWhenMostStaysWrite(t *testing.T) {
	var resident atomic.Int64
	tb := New(&resident, NewSlots(backend.NewMemory()))
	evict := func(pg uint64, d Dirt, write bool) {
		e := tb.Install(pg, d, 0)
		if write {
			e.Dirty = true // as a WP fault records a write on a Clean page
		}
		tb.MarkEvicted(pg, e, 0)
	}
	// A whole window of stays that began with a write fault: not counted.
	for i := range guessWindow {
		evict(uint64(i+1)<<12, Written, false)
	}
	if tb.GuessingAll() {
		t.Fatal("stays that began with a write turned the guess on")
	}
	// Read-back pages, Clean, 40 % written in their stay.
	for i := range guessWindow {
		evict(uint64(i+1)<<12, Clean, i%10 < 4)
	}
	if !tb.GuessingAll() {
		t.Fatal("40 % of read-back stays wrote, and the guess is not on")
	}
	// Page 6's last stay only read it (i = 5), yet it is installed writable now.
	if e := tb.Get(6 << 12); e.WasWritten || tb.Refetch(e, false) != GuessWritten {
		t.Fatalf("WasWritten %v, Refetch %d; want false, GuessWritten", e.WasWritten, tb.Refetch(e, false))
	}
	// Guessed stays whose content does not change (the checksum equal) count as unwritten.
	for i := range guessWindow {
		e := tb.Install(uint64(i+1)<<12, GuessWritten, 0)
		tb.Copied(e, e.Sum)
		tb.MarkEvicted(uint64(i+1)<<12, e, 0)
	}
	if tb.GuessingAll() {
		t.Fatal("a window of guessed stays that wrote nothing left the guess on")
	}
}
