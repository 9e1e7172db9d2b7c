package remote

import (
	"context"
	"errors"
	"math/bits"
	"slices"
	"time"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/ctrl"
)

// Slots. A slab hands out its pages by bumping `used`, and takes freed ones back on its own
// free list; take always serves from the lowest-numbered slab with room. Packing new pages
// into the low slabs lets the high ones drain as the program frees memory, and a slab with no
// page in use is given back to the ctrl (releaseEmpty), which has its servers free the memory.
// Its index in Store.slabs becomes a hole that the next new slab fills.

// install puts a new slab in the lowest hole, or at the end. Called with Store.mu held.
func (s *Store) install(sl *slab) int {
	i := len(s.slabs)
	if len(s.holes) > 0 {
		j := slices.Index(s.holes, slices.Min(s.holes))
		i = s.holes[j]
		s.holes = slices.Delete(s.holes, j, j+1)
		s.slabs[i] = sl
	} else {
		s.slabs = append(s.slabs, sl)
	}
	s.setRoom(i)
	s.empty++
	return i
}

func (s *Store) setRoom(i int) {
	w := i / 64
	for len(s.room) <= w {
		s.room = append(s.room, 0)
	}
	s.room[w] |= 1 << (i % 64)
	s.roomFrom = min(s.roomFrom, w)
}

func (s *Store) clearRoom(i int) { s.room[i/64] &^= 1 << (i % 64) }

// firstRoom is the lowest index of a slab with a page to hand out, or -1.
func (s *Store) firstRoom() int {
	for w := s.roomFrom; w < len(s.room); w++ {
		if s.room[w] != 0 {
			s.roomFrom = w
			return w*64 + bits.TrailingZeros64(s.room[w])
		}
	}
	s.roomFrom = len(s.room)
	return -1
}

// take hands out len(slots) slots, growing into new slabs as needed.
func (s *Store) take(slots []backend.Slot) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := range slots {
		idx := s.firstRoom()
		if idx < 0 {
			sl, err := s.grow()
			if err != nil {
				s.giveBack(slots[:i])
				return err
			}
			idx = s.install(sl)
		}
		sl := s.slabs[idx]
		var pg uint32
		if n := len(sl.free); n > 0 {
			pg, sl.free = sl.free[n-1], sl.free[:n-1]
		} else {
			pg = sl.used
			sl.used++
		}
		if sl.inUse == 0 {
			s.empty--
		}
		sl.inUse++
		if len(sl.free) == 0 && sl.used == sl.pages {
			s.clearRoom(idx)
		}
		slots[i] = backend.Slot(uint64(idx+1)<<32 | uint64(pg))
	}
	return nil
}

// giveBack returns slots to their slabs' free lists. Called with Store.mu held.
func (s *Store) giveBack(slots []backend.Slot) {
	for _, slot := range slots {
		idx := int(uint64(slot)>>32) - 1
		sl := s.slabs[idx]
		sl.free = append(sl.free, uint32(slot))
		sl.inUse--
		if sl.inUse == 0 {
			s.empty++
		}
		s.setRoom(idx)
	}
}

// releaseEmpty gives back to the ctrl the slabs with no page in use, as long as the slabs kept
// still have a slab's worth of free pages (so a program that frees and allocates again does
// not ask the ctrl each time), highest first. The ctrl has their servers free the memory in
// their next heartbeat reply. A release the ctrl did not hear of is retried next time.
func (s *Store) releaseEmpty() {
	s.mu.Lock()
	var out []*slab
	if s.empty > 0 {
		var roomPages uint64
		for _, sl := range s.slabs {
			if sl != nil {
				roomPages += uint64(sl.pages - sl.inUse)
			}
		}
		for i := len(s.slabs) - 1; i >= 0 && s.empty > 0; i-- {
			sl := s.slabs[i]
			if sl == nil || sl.inUse != 0 || roomPages-uint64(sl.pages) < uint64(sl.pages) {
				continue
			}
			roomPages -= uint64(sl.pages)
			s.slabs[i] = nil
			s.holes = append(s.holes, i)
			s.clearRoom(i)
			s.empty--
			out = append(out, sl)
		}
	}
	s.mu.Unlock()
	for _, sl := range out {
		// Its copies are dropped: a rebuild still filling one stops (copyChunk).
		sl.mu.Lock()
		reps := sl.replicas
		sl.replicas = nil
		sl.lost = errReleased
		sl.mu.Unlock()
		// Freed on the servers we are connected to at once (over shm this also unmaps it here,
		// which the ctrl's word to the server would not); the ctrl tells the others.
		for _, r := range reps {
			r.srv.free(sl.id)
		}
		s.released = append(s.released, sl.id)
	}
	var keep []uint64
	for i, id := range s.released {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.ctrl.FreeSlab(ctx, s.session.ID, id)
		cancel()
		if err != nil && !errors.Is(err, ctrl.ErrNotFound) {
			s.cfg.Logf("farmem: giving slab %d back to the ctrl (retrying): %v", id, err)
			keep = s.released[i:]
			break
		}
	}
	s.released = slices.Clone(keep)
}

var errReleased = errors.New("remote: the slab was given back to the ctrl")
