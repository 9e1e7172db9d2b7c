package pagetable

import (
	"sync"

	"github.com/farmem/farmem/backend"
)

// Slots reference-counts backend slots: the one place where a fork's sharing of stored pages
// is counted, like swap entry counts. A slot starts with one reference (its storing page
// table); CloneFor adds one per child; the last Release frees it in the backend.
type Slots struct {
	mu    sync.Mutex
	extra map[backend.Slot]uint32 // protected by mu; references beyond the first, only for shared slots
	b     backend.Backend
}

// NewSlots counts references to slots of b.
func NewSlots(b backend.Backend) *Slots {
	return &Slots{extra: make(map[backend.Slot]uint32), b: b}
}

// Retain adds a reference to s.
func (s *Slots) Retain(slot backend.Slot) {
	s.mu.Lock()
	s.extra[slot]++
	s.mu.Unlock()
}

// RetainAll adds a reference to each of slots (a slot may appear more than once).
func (s *Slots) RetainAll(slots []backend.Slot) {
	s.mu.Lock()
	for _, slot := range slots {
		s.extra[slot]++
	}
	s.mu.Unlock()
}

// Release drops a reference to s, freeing it in the backend when it was the last.
func (s *Slots) Release(slot backend.Slot) {
	s.mu.Lock()
	if n := s.extra[slot]; n > 0 {
		if n == 1 {
			delete(s.extra, slot)
		} else {
			s.extra[slot] = n - 1
		}
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.b.Free(slot)
}

// Backend returns the backend the slots live in.
func (s *Slots) Backend() backend.Backend { return s.b }
