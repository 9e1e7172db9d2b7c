package evictor

import (
	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
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
func (e *Evictor) commit(b *batch) {
	tb := b.tb
	tb.Lock()
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
