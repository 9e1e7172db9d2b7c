package evictor

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/pagetable"
)

// moveOut is the move protocol's first step: the agent takes every victim it can out of the
// program into the staging area (victim i to staging page i). From there nothing can change
// it, so it needs no write-protect, and the batch's drop of it is one range, the staging
// area's, not one per run. What the move leaves in the program is rest, for the drop way.
//
// The agent moves a victim only while the program's layout is still the one the choice saw
// (Target.Move): after a layout event its address may hold another page, which a move would
// take for the victim, and the commit, which finds the victim by its entry, would record the
// other page evicted as the victim's while it says the other resident.
//
// Each victim ends in one of these, decided under the page-table lock once the agent answered:
//
//	moved, still Staged            staged (and stagedDirty unless clean: its slot is current)
//	no longer Staged               discarded by the program meanwhile (Discard set State 0):
//	                               whatever moved is junk now; not touched again
//	not moved, ESTALE              Unstaged and requeued, still in the program (a REMAP
//	                               requeued it where it moved): a later batch takes it
//	not moved, ENOENT              absent from the program: left Resident and off the queue
//	not moved, any other errno     Unstaged, still in the program: rest
//
// Without a staging area every victim is rest.
func (e *Evictor) moveOut(b *batch) error {
	if b.base == 0 {
		b.rest = append(b.rest[:0], b.victims...) // a copy: rest's storage is its own
		return nil
	}
	status := b.status[:len(b.victims)]
	if err := b.t.Move(b.victimRuns, b.base, b.layout, status); err != nil {
		if errors.Is(err, ErrGone) {
			return ErrGone
		}
		return fmt.Errorf("evict: agent move: %w", err)
	}
	b.rest = b.rest[:0]
	b.tb.Lock()
	for i, en := range b.ents {
		if status[i] == 0 {
			b.moved = i + 1
		}
		switch {
		case en.State != pagetable.Staged:
			// Discarded by the program meanwhile (State 0): whatever moved is junk now.
		case status[i] == 0:
			if en.Dirty || en.Slot == 0 { // else clean: its slot is current
				b.stagedDirty = append(b.stagedDirty, len(b.staged))
			}
			b.staged = append(b.staged, i)
		case status[i] == byte(unix.ESTALE):
			b.tb.Unstage(b.victims[i], en)
			if b.tb.Get(b.victims[i]) == en {
				b.tb.Requeue(b.victims[i])
			}
			e.Stats.Stale.Add(1)
		case status[i] == byte(unix.ENOENT):
			// Absent from the program while still Staged, with no layout event since the
			// choice (that would be ESTALE): a record gone wrong. It must not be read: the
			// read would fault. Left Resident and off the queue: the next fault on it finds
			// it absent and stops the program (missing).
			b.tb.Unstage(b.victims[i], en)
			e.Stats.Absent.Add(1)
		default:
			b.tb.Unstage(b.victims[i], en) // still in the program: evicted the drop way, or requeued
			b.rest = append(b.rest, b.victims[i])
		}
	}
	b.tb.Unlock()
	return nil
}
