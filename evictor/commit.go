package evictor

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

// commit records the batch in the page table, under its lock: only pages still in the state
// the batch left them in are evicted, for the program may have discarded (REMOVE/UNMAP) or
// written (clean pages) some meanwhile. A page stored for nothing (discarded meanwhile) has
// its slot freed. It fills drop with the committed pages that are still in the program.
//
//	staged, copied out   still Staged: Copied, then committed Evicted with its new slot
//	staged, clean        still Staged: committed Evicted with the slot it had
//	dirty (Evicting)     still Evicting: Copied, then Evicted, InFlight, Zapping; to drop
//	clean (drop way)     still Resident and not written: Evicted with the slot it had; to
//	                     drop. Written or discarded meanwhile: requeued (if still there)
//
// The staged victims are found by their entries, the drop way's by their addresses, which hold
// the pages the copy out read only if the table holds the layout as it is (current). If it
// cannot tell, the drop way is given up: its victims stay in the program.
func (e *Evictor) commit(b *batch) error {
	tb := b.tb
	tb.Lock()
	if ok, err := b.current(); err != nil {
		tb.Unlock()
		return err
	} else if !ok {
		e.giveUp(b, true)
		e.Stats.Unsettled.Add(1)
	}
	next := 0 // the next of stagedDirty, and its slot's index
	for k, i := range b.staged {
		en := b.ents[i]
		slot := en.Slot // clean
		if next < b.nStaged && b.stagedDirty[next] == k {
			slot = b.slots[next]
			sum := b.sums[next]
			next++
			if en.State != pagetable.Staged {
				if slot != 0 {
					e.cfg.Backend.Free(slot)
				}
				continue
			}
			tb.Copied(en, sum)
			e.written(b, slot)
		} else if en.State != pagetable.Staged {
			continue
		} else {
			e.Stats.Dropped.Add(1)
			b.rec.Dropped++
		}
		tb.CommitStaged(b.victims[i], en, slot)
	}
	for i, p := range b.dirty {
		slot := b.slots[b.nStaged+i]
		en := tb.Get(p)
		if en == nil || en.State != pagetable.Evicting {
			if slot != 0 {
				e.cfg.Backend.Free(slot)
			}
			continue
		}
		tb.Copied(en, b.sums[b.nStaged+i])
		tb.MarkEvicted(p, en, slot)
		b.drop = append(b.drop, p)
		e.written(b, slot)
	}
	for _, p := range b.clean {
		en := tb.Get(p)
		if en == nil || en.State != pagetable.Resident || en.Dirty {
			tb.Requeue(p)
			continue
		}
		tb.MarkEvicted(p, en, en.Slot)
		b.drop = append(b.drop, p)
		e.Stats.Dropped.Add(1)
		b.rec.Dropped++
	}
	tb.Unlock()
	return nil
}

// current reports whether the page table, locked, holds the program's layout as it is now: no
// layout event raised and not read, none read and not applied. Then a drop-way victim still
// Evicting at its address was never moved from it (a REMAP applied leaves no entry Evicting),
// so the page the copy out read there was the victim's, and one still clean is the page whose
// slot is current.
//
// The kernel tells an event raised and not read: it fails every ioctl on the uffd with EAGAIN
// from before the change is made until the event is read (and the table's lock, held, keeps the
// fault thread from reading it meanwhile). The ioctl asked is one that changes nothing: the
// write-protection of a victim that is write-protected already.
func (b *batch) current() (bool, error) {
	page, ok := b.protectedVictim()
	if !ok {
		return true, nil // nothing of the drop way's to commit
	}
	err := b.t.Fenced(func() error { return uffd.WriteProtect(b.fd, page, uffd.PageSize, uffd.WPModeWP) })
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, unix.ESRCH):
		return false, ErrGone
	case errors.Is(err, unix.EAGAIN), errors.Is(err, unix.ENOENT):
		return false, nil
	}
	return false, fmt.Errorf("evict: write-protect %#x again: %w", page, err)
}

// protectedVictim returns a drop-way victim that the locked table holds write-protected: dirty
// and Evicting (protect did it), or clean (installed so, and not written since).
func (b *batch) protectedVictim() (uint64, bool) {
	for _, p := range b.dirty {
		if en := b.tb.Get(p); en != nil && en.State == pagetable.Evicting {
			return p, true
		}
	}
	for _, p := range b.clean {
		if en := b.tb.Get(p); en != nil && en.State == pagetable.Resident && !en.Dirty {
			return p, true
		}
	}
	return 0, false
}

// written counts a page copied out and committed: stored, or all zeros (slot 0).
func (e *Evictor) written(b *batch, slot backend.Slot) {
	if slot == 0 {
		e.Stats.Zero.Add(1)
		b.rec.Zero++
	} else {
		e.Stats.Written.Add(1)
		b.rec.Written++
	}
}
