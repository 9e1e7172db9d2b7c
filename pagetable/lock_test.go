package pagetable

import (
	"slices"
	"testing"
	"time"

	"github.com/farmem/farmem/backend"
)

// A fault thread that asks for the lock while the evictor chooses victims gets it within the
// choice, not after it; and what it did meanwhile (here: the program discarded pages the choice
// had taken) is in the choice's result: only pages still resident are victims.
func TestVictimsYieldToFault(t *testing.T) {
	tb, _, _ := newTable(t)
	tb.VictimBlock = 1
	const n = 4 * yieldEvery
	for i := range uint64(n) {
		tb.Install(0x10000+i*backend.PageSize, Written, 0)
	}
	first := uint64(0x10000) // the first in the queue: taken before the first yield
	tb.Lock()
	served := make(chan struct{})
	go func() { // the fault thread: a REMOVE of the first page read while the choice runs
		tb.LockForFault()
		tb.DiscardRange(first, first+backend.PageSize)
		tb.Unlock()
		close(served)
	}()
	for tb.faultWaiting.Load() == 0 { // it waits
		time.Sleep(time.Millisecond)
	}
	out := tb.Victims(n, nil)
	select {
	case <-served:
	default:
		t.Fatal("the fault thread waited for the whole choice of victims")
	}
	if slices.Contains(out, first) {
		t.Fatalf("page %#x, discarded while the choice yielded, was chosen", first)
	}
	if len(out) != n-1 {
		t.Errorf("%d victims, want the %d resident pages", len(out), n-1)
	}
	for _, p := range out {
		if e := tb.Get(p); e == nil || e.State != Resident {
			t.Fatalf("victim %#x is not resident", p)
		}
	}
	tb.Unlock()
}
