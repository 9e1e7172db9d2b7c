package remote

import (
	"math/rand"
	"testing"
	"time"

	"github.com/farmem/farmem/backend"
)

// allUp fails the test unless the store counts every memory server it uses up.
func allUp(t *testing.T, s *Store, after string) {
	t.Helper()
	if up, total := s.Health(); up != total {
		t.Fatalf("after %s, %d of the %d memory servers are counted up", after, up, total)
	}
}

// slotsOf returns up to n of the slots in pages that lie in the slab at index i of Store.slabs.
func slotsOf(pages map[backend.Slot][]byte, i, n int) []backend.Slot {
	var out []backend.Slot
	for sl := range pages {
		if int(uint64(sl)>>32) == i+1 && len(out) < n {
			out = append(out, sl)
		}
	}
	return out
}

// storeBatch stores n random pages in one Store call, adds them to pages and returns their slots.
func storeBatch(t *testing.T, s *Store, pages map[backend.Slot][]byte, seed int64, n int) []backend.Slot {
	t.Helper()
	data := make([]byte, n*backend.PageSize)
	rand.New(rand.NewSource(seed)).Read(data)
	slots := make([]backend.Slot, n)
	if err := s.Store(data, slots); err != nil {
		t.Fatal(err)
	}
	for i, sl := range slots {
		pages[sl] = data[i*backend.PageSize : (i+1)*backend.PageSize]
	}
	return slots
}

// reuse frees the slots (the next Store takes them, lowest slab first) and forgets their pages.
func reuse(s *Store, pages map[backend.Slot][]byte, slots []backend.Slot) {
	s.Free(slots...)
	for _, sl := range slots {
		delete(pages, sl)
	}
}

// waitSpare waits until housekeep has allocated its spare slab, so that no allocation (and no
// create on a server about to stall) happens later in the test.
func waitSpare(t *testing.T, s *Store) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		s.spareMu.Lock()
		have := s.spare != nil
		s.spareMu.Unlock()
		if have {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("no spare slab was allocated")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
