package pagetable

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

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
	tb.Install(pg, Written, 0)
	if res.Load() != 1 {
		t.Fatalf("resident %d, want 1", res.Load())
	}
	tb.MarkEvicted(pg, tb.Get(pg), store(t, m))
	if res.Load() != 0 {
		t.Fatalf("resident %d after eviction, want 0", res.Load())
	}
	tb.Removed(pg, pg+backend.PageSize, time.Now()) // ours
	if e := tb.Get(pg); e == nil || e.State != Evicted || e.InFlight {
		t.Fatalf("after our REMOVE: %+v, want Evicted, not in flight", e)
	}
	if m.Stored() != 1 {
		t.Fatalf("stored %d, want 1", m.Stored())
	}
	tb.Removed(pg, pg+backend.PageSize, time.Now()) // the program's
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
	tb.Install(0x1000, Clean, s)
	tb.Install(0x2000, Written, 0)
	tb.MarkEvicted(0x2000, tb.Get(0x2000), store(t, m))
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
	tb.VictimBlock = 1
	for _, p := range []uint64{0x5000, 0x1000, 0x3000, 0x2000} {
		tb.Install(p, Written, 0)
	}
	tb.Pin(0x3000, 0x4000)
	tb.Install(0x5000, Written, 0) // re-installed: goes to the tail
	got := tb.Victims(2, nil)
	if len(got) != 2 || got[0] != 0x1000 || got[1] != 0x2000 {
		t.Fatalf("victims %x, want [1000 2000] (FIFO, pinned page skipped, re-installed page last)", got)
	}
	got = tb.Victims(5, nil)
	if len(got) != 1 || got[0] != 0x5000 {
		t.Fatalf("victims %x, want [5000]", got)
	}
}

// A page seen written is predicted to be written again when it comes back; one evicted clean
// is not, nor one installed writable on that prediction whose content did not change.
func TestWasWrittenPrediction(t *testing.T) {
	var resident atomic.Int64
	tb := New(&resident, NewSlots(backend.NewMemory()))
	tb.Install(0x1000, Written, 0)
	tb.Install(0x2000, Clean, 7)
	tb.MarkEvicted(0x1000, tb.Get(0x1000), 5)
	tb.MarkEvicted(0x2000, tb.Get(0x2000), 7)
	if !tb.Get(0x1000).WasWritten || tb.Get(0x2000).WasWritten {
		t.Fatalf("WasWritten: dirty page %v, clean page %v; want true, false", tb.Get(0x1000).WasWritten, tb.Get(0x2000).WasWritten)
	}
	if d := tb.Refetch(tb.Get(0x1000), false); d != GuessWritten {
		t.Fatalf("a read fault on a page written in its last stay installs it %d, want GuessWritten", d)
	}
	if d, w := tb.Refetch(tb.Get(0x2000), false), tb.Refetch(tb.Get(0x2000), true); d != Clean || w != Written {
		t.Fatalf("a page evicted clean: read fault %d, write fault %d; want Clean, Written", d, w)
	}
	// The content stored at that eviction had sum 11.
	tb.Get(0x1000).Sum = 11
	e := tb.Install(0x1000, GuessWritten, 5)
	if e.WasWritten || !e.Dirty || e.Sum != 11 {
		t.Fatalf("installed on the guess: WasWritten %v, Dirty %v, Sum %d; want false, true, 11", e.WasWritten, e.Dirty, e.Sum)
	}
	// Installed writable on the guess, its content changed (sum 12): a write seen.
	tb.Copied(e, 12)
	tb.MarkEvicted(0x1000, e, 5)
	if !e.WasWritten || e.Sum != 12 {
		t.Fatalf("a guessed stay that changed the content: WasWritten %v, Sum %d; want true, 12", e.WasWritten, e.Sum)
	}
	// Installed on the guess again, and copied out unchanged: the guess was wrong, and the
	// next stay must start write-protected, or a page written once is rewritten for ever.
	e = tb.Install(0x1000, GuessWritten, 5)
	tb.Copied(e, 12)
	tb.MarkEvicted(0x1000, e, 5)
	if e.WasWritten {
		t.Fatal("WasWritten set by a guessed stay whose content did not change")
	}
	// A write seen by a WP fault (Dirty on a clean page) makes the guess again, whatever
	// the sum: the guess is learned only on guessed stays.
	e = tb.Install(0x1000, Clean, 5)
	e.Dirty = true
	tb.Copied(e, 12)
	tb.MarkEvicted(0x1000, e, 5)
	if !e.WasWritten {
		t.Fatal("a write seen did not predict the next")
	}
}

// Entry stays 32 bytes: one per page tracked, 8 MiB per GiB.
func TestEntrySize(t *testing.T) {
	if n := unsafe.Sizeof(Entry{}); n != 32 {
		t.Fatalf("Entry is %d bytes, want 32", n)
	}
}

// mremap during an eviction: the evictor works on the old address and finds nothing there, so
// the moved pages must not stay in its hands (an Evicting page would never be woken again).
func TestMoveDuringEviction(t *testing.T) {
	var resident atomic.Int64
	tb := New(&resident, NewSlots(backend.NewMemory()))
	tb.Install(0x1000, Written, 0)
	tb.Install(0x2000, Written, 0)
	tb.Get(0x1000).State = Evicting
	tb.MarkEvicted(0x2000, tb.Get(0x2000), 0)
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

// A moving batch's life cycle: Staged pages count as resident until committed; one the agent
// could not move goes back to Resident; the commit takes the page's new slot and releases its
// old one, and expects no REMOVE for it.
func TestStagedCommitAndUnstage(t *testing.T) {
	tb, m, res := newTable(t)
	old := store(t, m)
	tb.Install(0x1000, Written, old) // dirty, with a stale slot
	tb.Install(0x2000, Written, 0)
	a, b := tb.Get(0x1000), tb.Get(0x2000)
	tb.Stage(0x1000, a, 0)
	tb.Stage(0x2000, b, 1)
	if res.Load() != 2 || a.State != Staged || a.Stage != 1 || b.Stage != 2 {
		t.Fatalf("staged: resident %d, %+v %+v; want 2, Staged at 1 and 2", res.Load(), a, b)
	}
	if v := tb.Victims(10, nil); len(v) != 0 {
		t.Fatalf("staged pages chosen again as victims: %x", v)
	}
	tb.Unstage(0x2000, b)
	if b.State != Resident || b.Stage != 0 || res.Load() != 2 {
		t.Fatalf("unstaged: %+v resident %d; want Resident, still counted", b, res.Load())
	}
	tb.CommitStaged(0x1000, a, store(t, m))
	if a.State != Evicted || a.InFlight || a.Zapping || a.Stage != 0 || !a.WasWritten || res.Load() != 1 {
		t.Fatalf("committed: %+v resident %d; want Evicted, no drop expected, written, 1 resident", a, res.Load())
	}
	if m.Stored() != 1 {
		t.Fatalf("stored %d, want 1: the stale slot must be released", m.Stored())
	}
	tb.Removed(0x1000, 0x2000, time.Now()) // the program's own discard, not ours: none of ours is to come
	if tb.Get(0x1000) != nil || m.Stored() != 0 {
		t.Fatal("a REMOVE after the commit must discard the page")
	}
}

// A batch holds its victims' entries across the agent's move: a discard must be visible through
// the pointer (the program's REMOVE wins), and an mremap must keep the entry Staged at its new
// address, queued to be chosen again should the batch put it back.
func TestStagedDiscardAndRemap(t *testing.T) {
	tb, _, res := newTable(t)
	tb.Install(0x1000, Written, 0)
	tb.Install(0x2000, Written, 0)
	a, b := tb.Get(0x1000), tb.Get(0x2000)
	tb.Stage(0x1000, a, 0)
	tb.Stage(0x2000, b, 1)
	tb.Removed(0x1000, 0x2000, time.Now())
	if a.State != 0 || tb.Get(0x1000) != nil || res.Load() != 1 {
		t.Fatalf("discarded staged page: %+v resident %d; want State 0, no entry, 1 resident", a, res.Load())
	}
	tb.Move(0x2000, 0x100000, 0x1000)
	if tb.Get(0x100000) != b || b.State != Staged {
		t.Fatalf("remapped staged page: %+v, want the same entry, still Staged", tb.Get(0x100000))
	}
	tb.Unstage(0x100000, b)
	if v := tb.Victims(10, nil); len(v) != 1 || v[0] != 0x100000 {
		t.Fatalf("victims %x, want the remapped page at its new address", v)
	}
}

// A fork while pages are Staged: the child reads a clean one from its slot (shared), and a dirty
// one, which has no current slot, from its own copy of the staging area.
func TestCloneOfStagedPages(t *testing.T) {
	tb, m, _ := newTable(t)
	tb.SetStaging(0x900000, 0x900000+256*backend.PageSize)
	s := store(t, m)
	tb.Install(0x1000, Clean, s) // clean
	tb.Install(0x2000, Written, store(t, m))
	tb.Stage(0x1000, tb.Get(0x1000), 0)
	tb.Stage(0x2000, tb.Get(0x2000), 5)
	c := tb.CloneFor()
	if e := c.Get(0x1000); e == nil || e.State != Evicted || e.Slot != s || e.Stage != 0 {
		t.Fatalf("child's clean staged page: %+v, want Evicted from slot %d", e, s)
	}
	if e := c.Get(0x2000); e == nil || e.State != Evicted || e.Slot != 0 || e.Stage != 6 {
		t.Fatalf("child's dirty staged page: %+v, want Evicted, no slot, Stage 6", e)
	}
	if start, end := c.Staging(); start != 0x900000 || !c.InStaging(end-backend.PageSize) || c.InStaging(end) {
		t.Fatalf("child's staging area [%#x, %#x), want the parent's", start, end)
	}
	tb.Clear()
	if m.Stored() != 1 {
		t.Fatalf("after the parent's exit stored %d, want 1 (the child's share of the clean slot)", m.Stored())
	}
	c.Clear()
	if m.Stored() != 0 {
		t.Fatalf("after both exited stored %d, want 0", m.Stored())
	}
}

// Each victim brings the other resident, unpinned pages of its aligned block, never twice, and
// the count stays within n; the next call goes on in FIFO order with what is left.
func TestVictimsByBlock(t *testing.T) {
	tb, _, _ := newTable(t)
	tb.VictimBlock = 4 // blocks of 0x4000 bytes
	for _, p := range []uint64{0x9000, 0x1000, 0x5000, 0x2000, 0x3000, 0x4000, 0x6000, 0x7000, 0xa000} {
		tb.Install(p, Written, 0)
	}
	tb.Pin(0x6000, 0x7000)
	tb.MarkEvicted(0xa000, tb.Get(0xa000), 0) // not resident: never a victim
	got := tb.Victims(3, nil)
	if fmt.Sprint(got) != fmt.Sprint([]uint64{0x1000, 0x2000, 0x9000}) {
		t.Fatalf("victims %x, want [1000 2000 9000]: the oldest alone (its mate a000 is evicted), then the next with one mate, up to 3", got)
	}
	for _, p := range got {
		tb.MarkEvicted(p, tb.Get(p), 0)
	}
	got = tb.Victims(10, nil)
	if fmt.Sprint(got) != fmt.Sprint([]uint64{0x3000, 0x4000, 0x5000, 0x7000}) {
		t.Fatalf("victims %x, want [3000 4000 5000 7000]: 5000 with its unpinned mates, then 3000; no page twice", got)
	}
}
