package remote

import (
	"bytes"
	"testing"

	"github.com/farmem/farmem/backend"
)

// A memory server that refuses a read or a write for a slab it no longer holds has answered:
// that copy is bad, but the server is not down. It still counts as up, its other copies are
// read as before, and it is sent frees.
func TestRefusedSlabLeavesServerUp(t *testing.T) {
	c := newCluster(t, 3)
	s := c.open(2)
	pages := storePages(t, s, 41, 1000) // 4 slabs of 256 pages, the last one not full

	// A read refused: the read takes the copy it prefers, whose server freed it.
	slot := slotsOf(pages, 0, 1)[0]
	freePreferredCopy(t, c, s, slot)
	buf := make([]byte, backend.PageSize)
	if err := s.Load(slot, buf); err != nil || !bytes.Equal(buf, pages[slot]) {
		t.Fatalf("slot %#x, its preferred copy gone: %v (right bytes: %v)", slot, err, bytes.Equal(buf, pages[slot]))
	}
	allUp(t, s, "a read refused for a gone slab")

	// A write refused: free a full slab's copy on one server and store into that slab.
	s.mu.Lock()
	victim := s.slabs[1]
	s.mu.Unlock()
	victim.mu.RLock()
	gone := victim.replicas[0].srv
	victim.mu.RUnlock()
	c.byAddr(gone.addr).srv.FreeSlab(victim.id)
	reuse(s, pages, slotsOf(pages, 1, 10))
	storeBatch(t, s, pages, 42, 10)
	allUp(t, s, "a write refused for a gone slab")

	c.whole(s, 2)
	allUp(t, s, "the gone copies were replaced")
	verify(t, s, pages)
}

// A server that stopped answering (a Store's write to it timed out) is down: read from last and
// counted down. Once it answers again it is up.
func TestServerUpAgainOnceItAnswers(t *testing.T) {
	c := newCluster(t, 0)
	_, stalled := c.addStallServer()
	c.addServer()
	s := c.open(2)
	pages := storePages(t, s, 51, 1000) // 4 slabs of 256 pages, the last one not full
	waitSpare(t, s)

	stalled.stall(true)
	storeBatch(t, s, pages, 52, 1) // into the last slab: its copy on the stalled server times out
	if up, total := s.Health(); up != 1 || total != 2 {
		t.Fatalf("with one of two servers not answering, %d of %d are counted up", up, total)
	}
	stalled.stall(false)
	// A Store into the first slab, whose copy there is good: the server answers it.
	reuse(s, pages, slotsOf(pages, 0, 1))
	storeBatch(t, s, pages, 53, 1)
	allUp(t, s, "the server answered again")
	verify(t, s, pages)
}
