package remote

import (
	"bytes"
	"testing"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/fabric"
)

// One Store writes a server the pages of every slab with a copy there in one request, which
// the server refuses whole when one of those slabs is gone from it. Only that slab's copy is
// bad: the other slabs' copies on that server take their pages, are not reported bad and
// stay, and every page reads back.
func TestGoneSlabFailsOnlyItsCopyInASharedWrite(t *testing.T) {
	c := newCluster(t, 3)
	s := c.open(2)
	pages := storePages(t, s, 43, 1000) // 4 slabs of 256 pages, the last one not full
	s.mu.Lock()
	a, b := s.slabs[0], s.slabs[1]
	s.mu.Unlock()
	// Two copies each on three servers: the two slabs share a server.
	var shared *server
	a.mu.RLock()
	b.mu.RLock()
	for _, ra := range a.replicas {
		for _, rb := range b.replicas {
			if ra.srv == rb.srv {
				shared = ra.srv
			}
		}
	}
	b.mu.RUnlock()
	a.mu.RUnlock()
	if shared == nil {
		t.Fatal("slabs 0 and 1 share no server")
	}
	c.byAddr(shared.addr).srv.FreeSlab(a.id)

	// One Store whose pages land in both slabs (the lowest slabs with room come first).
	reuse(s, pages, append(slotsOf(pages, 0, 20), slotsOf(pages, 1, 20)...))
	slots := storeBatch(t, s, pages, 44, 40)
	var inB []backend.Slot
	for _, sl := range slots {
		if int(uint64(sl)>>32) == 2 {
			inB = append(inB, sl)
		}
	}
	if len(inB) == 0 || len(inB) == len(slots) {
		t.Fatalf("the batch's %d pages are not in both slabs: %d in slab 1", len(slots), len(inB))
	}

	b.mu.RLock()
	for _, r := range b.replicas {
		if r.srv == shared && r.bad.Load() {
			t.Errorf("slab %d's copy on %s was reported bad with slab %d's, which that server no longer held", b.id, shared.addr, a.id)
		}
	}
	b.mu.RUnlock()
	// That copy holds the batch's pages: read them from it, past the store.
	direct, err := fabric.DialTCP(shared.addr, fabric.DialConfig{Token: token, Session: s.Session()})
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	got := make([]byte, backend.PageSize)
	for _, sl := range inB {
		if err := direct.Read([]fabric.Addr{{Slab: b.id, Page: uint32(sl)}}, got); err != nil {
			t.Fatalf("page %d of slab %d on %s: %v", uint32(sl), b.id, shared.addr, err)
		}
		if !bytes.Equal(got, pages[sl]) {
			t.Fatalf("slab %d's copy on %s does not hold page %d as stored", b.id, shared.addr, uint32(sl))
		}
	}

	c.whole(s, 2)
	has := func(sl *slab, srv *server) bool {
		sl.mu.RLock()
		defer sl.mu.RUnlock()
		for _, r := range sl.replicas {
			if r.srv == srv {
				return true
			}
		}
		return false
	}
	if has(a, shared) {
		t.Errorf("slab %d still has a copy on %s, which no longer held it", a.id, shared.addr)
	}
	if !has(b, shared) {
		t.Errorf("slab %d's copy on %s, which held it, was replaced", b.id, shared.addr)
	}
	verify(t, s, pages)
}
