package evictor

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

// protect is the drop protocol's first step, for the victims the move left in the program
// (rest): a dirty victim, or one with no slot yet, is marked Evicting and its runs are
// write-protected, so that no write can slip in between its copy and its drop (a writer waits
// on the protection until wake); a clean one has a current slot and is only dropped. A victim
// the program discarded or moved (mremap) meanwhile is left out.
//
// A range the program unmapped meanwhile (ENOENT) gives up the drop way for this batch
// (abort); the staged victims go on.
func (e *Evictor) protect(b *batch) error {
	b.tb.Lock()
	for _, p := range b.rest {
		en := b.tb.Get(p)
		if en == nil || en.State != pagetable.Resident {
			continue // discarded, or moved by mremap, meanwhile
		}
		if en.Dirty || en.Slot == 0 {
			b.tb.Protect(p, en)
			b.dirty = append(b.dirty, p)
		} else {
			b.clean = append(b.clean, p)
		}
	}
	b.tb.Unlock()
	b.dirtyRuns = runs(b.dirty, b.dirtyRuns)
	for _, r := range b.dirtyRuns {
		// (The kernel refuses DONTWAKE together with WP: EINVAL.)
		err := retryEAGAIN(func() error { return uffd.WriteProtect(b.fd, r.Addr, r.Len, uffd.WPModeWP) })
		if errors.Is(err, unix.ESRCH) {
			return ErrGone
		}
		if errors.Is(err, unix.ENOENT) {
			e.abort(b) // unmapped or moved meanwhile
			break
		}
		if err != nil {
			return fmt.Errorf("evict: write-protect %#x+%d: %w", r.Addr, r.Len, err)
		}
	}
	return nil
}

// retryEAGAIN calls f until it fails with something other than EAGAIN, backing off a little
// more each time.
func retryEAGAIN(f func() error) error {
	for i := 0; ; i++ {
		err := f()
		if !errors.Is(err, unix.EAGAIN) {
			return err
		}
		// An unread uffd event (the program's madvise/munmap/fork) blocks the ioctl; the fault
		// thread reads it shortly.
		time.Sleep(time.Duration(min(i+1, 100)) * 10 * time.Microsecond)
	}
}

// abort gives up the drop way for a batch whose pages the program unmapped or moved (munmap,
// mremap) between the choice and the copy: giveUp, and the writers waiting on the protection
// are woken to retry. The batch goes on with its staged victims only.
func (e *Evictor) abort(b *batch) {
	b.tb.Lock()
	e.giveUp(b, false)
	b.tb.Unlock()
	for _, r := range b.dirtyRuns {
		uffd.Wake(b.fd, r.Addr, r.Len) // ENOENT/ESRCH: nobody left to wake there
	}
	b.dirtyRuns = b.dirtyRuns[:0]
}

// giveUp, with the page table locked, leaves the drop way's victims in the program: those still
// mapped go back to Resident (dirty ones stay dirty; some are left write-protected, which a
// later write un-protects as for any clean page) and are queued again. If the dirty ones were
// stored already, their slots are freed. The caller wakes the writers held by the protection.
func (e *Evictor) giveUp(b *batch, stored bool) {
	for i, p := range b.dirty {
		if en := b.tb.Get(p); en != nil && en.State == pagetable.Evicting {
			b.tb.Unprotect(p, en)
			b.tb.Requeue(p)
		}
		if slot := b.slots[b.nStaged+i]; stored && slot != 0 {
			e.cfg.Backend.Free(slot)
		}
	}
	for _, p := range b.clean {
		b.tb.Requeue(p)
	}
	e.Stats.Aborted.Add(1)
	b.dirty, b.clean = b.dirty[:0], b.clean[:0]
}

// commitAndDrop commits the batch, then has the agent madvise(DONTNEED) what the commit left to
// drop, in one request: the runs of the victims committed in the program (the drop way's), each
// of which raises a REMOVE event that the fault thread reads, and the used part of the staging
// area (the move's). The commit runs under the agent's lock (Target.Drop).
func (e *Evictor) commitAndDrop(b *batch) error {
	var commitErr error
	err := b.t.Drop(func() []Run {
		if commitErr = e.commit(b); commitErr != nil {
			return nil
		}
		return b.toDrop()
	})
	if commitErr != nil {
		return commitErr
	}
	if err != nil {
		if errors.Is(err, ErrGone) {
			return ErrGone
		}
		// ENOMEM: a run was unmapped or moved by the program meanwhile; the UNMAP or REMAP
		// event already updated the page table, and the other runs were dropped.
		if !errors.Is(err, unix.ENOMEM) {
			return fmt.Errorf("evict: agent drop: %w", err)
		}
	}
	return nil
}

// toDrop returns the runs to drop once the batch is committed: the drop way's committed
// victims, and the used part of the staging area.
func (b *batch) toDrop() []Run {
	slices.Sort(b.drop)
	b.dropRuns = runs(b.drop, b.dropRuns)
	b.removes = len(b.dropRuns) // one REMOVE event a run dropped from the program
	if b.moved > 0 {
		// The whole used part of the staging area, in one run whatever the victims' spread
		// (its REMOVE event is no layout change: see Target.Staging). It holds nothing of the
		// program's any more: committed pages, and those the program discarded after they
		// moved. Left there, a page would refuse the next batch's move to its index (EEXIST).
		b.dropRuns = append(b.dropRuns, Run{b.base, uint64(b.moved) * uffd.PageSize})
	}
	return b.dropRuns
}

// settle clears Zapping on the pages the agent dropped from the program: their drop is done,
// and a fault on one no longer waits for it.
func (b *batch) settle() {
	b.tb.Lock()
	for _, p := range b.drop {
		if en := b.tb.Get(p); en != nil && en.State == pagetable.Evicted {
			b.tb.Zapped(p, en)
		}
	}
	b.tb.Unlock()
}

// wake wakes the writers that hit the write protection: their retry faults as MISSING, the page
// being gone, and is served from the stored copy. (Faults on staged pages wait in the fault thread, which
// retries them when Loop wakes it.)
func (b *batch) wake() error {
	for _, r := range b.dirtyRuns {
		if err := uffd.Wake(b.fd, r.Addr, r.Len); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("evict: wake: %w", err)
		}
	}
	return nil
}
