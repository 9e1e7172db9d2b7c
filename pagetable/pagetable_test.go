package pagetable

import (
	"sync/atomic"
	"testing"

	"github.com/farmem/farmem/backend"
)

func newTable(t *testing.T) (*PageTable, *backend.Memory, *atomic.Int64) {
	var res atomic.Int64
	m := backend.NewMemory()
	return New(&res, NewSlots(m)), m, &res
}

func store(t *testing.T, m *backend.Memory) backend.Slot {
	s := make([]backend.Slot, 1)
	if err := m.Store(make([]byte, backend.PageSize), s); err != nil {
		t.Fatal(err)
	}
	return s[0]
}

// Our own eviction's REMOVE is consumed by the in-flight page; a second REMOVE (the program's
// discard) then makes it read as zeros, whichever of the two came first.
func TestRemovedOwnEvictionThenDiscard(t *testing.T) {
	tb, m, res := newTable(t)
	const pg = 0x10000
	tb.Install(pg, true, 0)
	if res.Load() != 1 {
		t.Fatalf("resident %d, want 1", res.Load())
	}
	tb.MarkEvicted(tb.Get(pg), store(t, m))
	if res.Load() != 0 {
		t.Fatalf("resident %d after eviction, want 0", res.Load())
	}
	tb.Removed(pg, pg+backend.PageSize) // ours
	if e := tb.Get(pg); e == nil || e.State != Evicted || e.InFlight {
		t.Fatalf("after our REMOVE: %+v, want Evicted, not in flight", e)
	}
	if m.Stored() != 1 {
		t.Fatalf("stored %d, want 1", m.Stored())
	}
	tb.Removed(pg, pg+backend.PageSize) // the program's
	if e := tb.Get(pg); e != nil {
		t.Fatalf("after the program's REMOVE: %+v, want no entry (zeros)", e)
	}
	if m.Stored() != 0 {
		t.Fatalf("slot not freed: stored %d", m.Stored())
	}
}

// A fork shares slots; each table's release counts, the last one frees.
func TestCloneSharesSlots(t *testing.T) {
	tb, m, res := newTable(t)
	s := store(t, m)
	tb.Install(0x1000, false, s)
	tb.Install(0x2000, true, 0)
	tb.MarkEvicted(tb.Get(0x2000), store(t, m))
	c := tb.CloneFor()
	if res.Load() != 2 {
		t.Fatalf("resident %d, want 2 (one page in each process)", res.Load())
	}
	tb.Clear()
	if m.Stored() != 2 {
		t.Fatalf("parent's exit freed shared slots: stored %d, want 2", m.Stored())
	}
	if e := c.Get(0x2000); e == nil || e.State != Evicted || e.InFlight || e.Zapping {
		t.Fatalf("child entry %+v: want Evicted without the parent's in-flight marks", e)
	}
	c.Clear()
	if m.Stored() != 0 || res.Load() != 0 {
		t.Fatalf("after both exited: stored %d resident %d, want 0 0", m.Stored(), res.Load())
	}
}

func TestVictimsFIFOAndPinned(t *testing.T) {
	tb, _, _ := newTable(t)
	for _, p := range []uint64{0x5000, 0x1000, 0x3000, 0x2000} {
		tb.Install(p, true, 0)
	}
	tb.Pin(0x3000, 0x4000)
	tb.Install(0x5000, true, 0) // re-installed: goes to the tail
	got := tb.Victims(2, nil)
	if len(got) != 2 || got[0] != 0x1000 || got[1] != 0x2000 {
		t.Fatalf("victims %x, want [1000 2000] (FIFO, pinned page skipped, re-installed page last)", got)
	}
	got = tb.Victims(5, nil)
	if len(got) != 1 || got[0] != 0x5000 {
		t.Fatalf("victims %x, want [5000]", got)
	}
}

// A page evicted dirty is predicted to be written again when it comes back; one evicted clean
// is not; the prediction ends with the next install.
func TestWasWrittenPrediction(t *testing.T) {
	var resident atomic.Int64
	tb := New(&resident, NewSlots(backend.NewMemory()))
	tb.Install(0x1000, true, 0)
	tb.Install(0x2000, false, 7)
	tb.MarkEvicted(tb.Get(0x1000), 5)
	tb.MarkEvicted(tb.Get(0x2000), 7)
	if !tb.Get(0x1000).WasWritten || tb.Get(0x2000).WasWritten {
		t.Fatalf("WasWritten: dirty page %v, clean page %v; want true, false", tb.Get(0x1000).WasWritten, tb.Get(0x2000).WasWritten)
	}
	tb.Install(0x1000, true, 5)
	if tb.Get(0x1000).WasWritten {
		t.Fatal("WasWritten survived a re-install")
	}
}

// mremap during an eviction: the evictor works on the old address and finds nothing there, so
// the moved pages must not stay in its hands (an Evicting page would never be woken again).
func TestMoveDuringEviction(t *testing.T) {
	var resident atomic.Int64
	tb := New(&resident, NewSlots(backend.NewMemory()))
	tb.Install(0x1000, true, 0)
	tb.Install(0x2000, true, 0)
	tb.Get(0x1000).State = Evicting
	tb.MarkEvicted(tb.Get(0x2000), 0)
	tb.Move(0x1000, 0x100000, 0x2000)
	if e := tb.Get(0x100000); e == nil || e.State != Resident || !e.Dirty {
		t.Fatalf("moved Evicting page: %+v, want Resident and dirty", e)
	}
	if e := tb.Get(0x101000); e == nil || e.State != Evicted || e.InFlight || e.Zapping {
		t.Fatalf("moved Evicted page: %+v, want Evicted, no drop expected", e)
	}
	if tb.Get(0x1000) != nil || tb.Get(0x2000) != nil {
		t.Fatal("entries left at the old address")
	}
	if v := tb.Victims(10, nil); len(v) != 1 || v[0] != 0x100000 {
		t.Fatalf("victims after the move %x, want the moved resident page", v)
	}
}
