package pagetable

import (
	"testing"
	"time"

	"github.com/farmem/farmem/backend"
)

// The program's discards are remembered for ZapLag, so that adopt leaves the pages whose zap
// may be still to come alone; our own eviction's DONTNEEDs are not the program's and are not
// remembered (adopt never meets their pages: they have entries).
func TestDiscardingRemembersTheProgramsRemovesForZapLag(t *testing.T) {
	tb, m, _ := newTable(t)
	const pg = 0x10000
	t0 := time.Unix(1000, 0)

	tb.Install(pg, Written, 0)
	tb.MarkEvicted(pg, tb.Get(pg), store(t, m))
	tb.Removed(pg, pg+backend.PageSize, t0) // ours: the agent's DONTNEED of the victim
	if tb.Discarding(pg, pg+backend.PageSize, t0) {
		t.Error("our own eviction's REMOVE was taken for the program's discard")
	}

	const lo, hi = 0x40000, 0x48000
	tb.Removed(lo, hi, t0) // the program's: nothing of it in the table
	for _, c := range []struct {
		start, end uint64
		at         time.Time
		want       bool
	}{
		{lo, lo + backend.PageSize, t0, true},
		{hi - backend.PageSize, hi, t0.Add(ZapLag), true},
		{lo - backend.PageSize, lo, t0, false}, // just below
		{hi, hi + backend.PageSize, t0, false}, // just above
		{0, 1 << 40, t0.Add(time.Millisecond), true},
		{lo, hi, t0.Add(ZapLag + time.Nanosecond), false}, // past the lag: zapped
	} {
		if got := tb.Discarding(c.start, c.end, c.at); got != c.want {
			t.Errorf("Discarding(%#x, %#x) %v after the REMOVE = %v, want %v", c.start, c.end, c.at.Sub(t0), got, c.want)
		}
	}

	// A REMOVE that covers one of our victims and pages of the program's is the program's.
	tb.Install(pg, Written, 0)
	tb.MarkEvicted(pg, tb.Get(pg), store(t, m))
	tb.Removed(pg-backend.PageSize, pg+backend.PageSize, t0)
	if !tb.Discarding(pg-backend.PageSize, pg, t0) {
		t.Error("a REMOVE wider than our victim was not remembered")
	}

	// Discards older than the lag are forgotten as new ones come.
	tb.Removed(0x80000, 0x81000, t0.Add(3*ZapLag))
	if n := len(tb.discards); n != 1 {
		t.Errorf("%d discards remembered, want 1 (the older ones are past the lag)", n)
	}
}
