package remote

import (
	"bytes"
	"testing"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/ctrl"
)

func (c *cluster) byAddr(addr string) *memserver {
	for _, m := range c.servers {
		if m.addr == addr {
			return m
		}
	}
	c.t.Fatalf("no memory server at %s", addr)
	return nil
}

// freePreferredCopy has the server of the copy that slot's next read would take free that
// copy's slab, and returns the slab and that server's address.
func freePreferredCopy(t *testing.T, c *cluster, s *Store, slot backend.Slot) (*slab, string) {
	t.Helper()
	sb, _, err := s.slot(slot)
	if err != nil {
		t.Fatal(err)
	}
	addr, _, _, ok := s.DescribeLoad(slot)
	if !ok {
		t.Fatal("no copy to read from")
	}
	c.byAddr(addr).srv.FreeSlab(sb.id)
	return sb, addr
}

// whole waits until the ctrl counts every slab of the session whole and the store holds, for
// every slab, `want` ready copies, none of them marked bad nor on a server in avoid.
func (c *cluster) whole(s *Store, want int, avoid ...string) {
	c.t.Helper()
	c.waitStatus(func(st ctrl.Status) bool {
		for _, sess := range st.Sessions {
			if sess.Name == c.t.Name() && (sess.Degraded > 0 || sess.Rebuilding > 0 || sess.Lost > 0) {
				return false
			}
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, sl := range s.slabs {
			sl.mu.RLock()
			n := 0
			for _, r := range sl.replicas {
				if r.usable() && !contains(avoid, r.srv.addr) {
					n++
				}
			}
			sl.mu.RUnlock()
			if n != want {
				return false
			}
		}
		return true
	})
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// A memory server loses one slab's copy (freed behind the client's back) and stays alive: the
// next write to that slab fails there, the client reports the copy bad, and the ctrl places a
// replacement on another server, which the client fills from the good copy. The server is
// still a healthy member; every page reads back, even once the good copy's server is killed.
func TestBadCopyOnLiveServerIsReplaced(t *testing.T) {
	c := newCluster(t, 4)
	s := c.open(2)
	pages := storePages(t, s, 11, 1000) // 4 slabs of 256 pages
	s.mu.Lock()
	victim := s.slabs[1]
	s.mu.Unlock()
	victim.mu.RLock()
	badSrv, goodSrv := victim.replicas[0].srv.addr, victim.replicas[1].srv.addr
	victim.mu.RUnlock()
	c.byAddr(badSrv).srv.FreeSlab(victim.id)

	// Rewrite some of its pages: free slots of the victim slab and store new pages into them.
	var reuse []backend.Slot
	for sl := range pages {
		if uint64(sl)>>32 == 2 && len(reuse) < 40 {
			reuse = append(reuse, sl)
		}
	}
	s.Free(reuse...)
	for _, sl := range reuse {
		delete(pages, sl)
	}
	for sl, p := range storePages(t, s, 12, len(reuse)) {
		pages[sl] = p
	}
	c.whole(s, 2)
	victim.mu.RLock()
	for _, r := range victim.replicas {
		if r.srv.addr == badSrv {
			t.Errorf("slab %d still has a copy on %s, whose copy was bad", victim.id, badSrv)
		}
	}
	victim.mu.RUnlock()
	st := c.waitStatus(func(ctrl.Status) bool { return true })
	for _, sv := range st.Servers {
		if sv.Addr == badSrv && !sv.Healthy {
			t.Fatalf("the server whose copy was bad was declared dead: %+v", sv)
		}
	}
	verify(t, s, pages)
	c.byAddr(goodSrv).kill()
	verify(t, s, pages)
	select {
	case err := <-s.Lost():
		t.Fatalf("store reported a loss: %v", err)
	default:
	}
}

// A memory server's data path dies while its heartbeats go on (to the ctrl it is alive): every
// slab allocated with a copy there — that copy cannot be created — and every slab whose copy
// there fails a write gets its full replica count elsewhere, rather than living on with a copy
// fewer that the ctrl counts as whole.
func TestSlabPlacedOnHalfDeadServerGetsFullCount(t *testing.T) {
	c := newCluster(t, 3)
	s := c.open(2)
	half := c.servers[2]
	half.srv.Close() // listeners and connections gone, slabs freed; heartbeats go on
	pages := storePages(t, s, 13, 2500)
	c.whole(s, 2, half.addr)
	// The spare slab too, if it was placed there: the ctrl places nothing of ours there.
	c.waitStatus(func(st ctrl.Status) bool {
		for _, sv := range st.Servers {
			if sv.Addr == half.addr {
				if !sv.Healthy {
					t.Fatalf("the half-dead server was declared dead: %+v; its heartbeats go on", sv)
				}
				return sv.Slabs == 0
			}
		}
		return false
	})
	verify(t, s, pages)
}

// A program that frees most of its memory gives the slabs left with no page in use back to the
// ctrl during the run: the session's slab count and the servers' used pages fall, the pages
// still in use read back, and new pages fill the freed room.
func TestEmptySlabsGivenBack(t *testing.T) {
	c := newCluster(t, 3)
	s := c.open(2)
	pages := storePages(t, s, 21, 3000) // 12 slabs of 256 pages, and a spare
	sessSlabs := func(st ctrl.Status) int {
		for _, sess := range st.Sessions {
			if sess.Name == t.Name() {
				return sess.Slabs
			}
		}
		return -1
	}
	usedPages := func(st ctrl.Status) (n uint64) {
		for _, sv := range st.Servers {
			n += sv.UsedPages
		}
		return n
	}
	before := c.waitStatus(func(st ctrl.Status) bool { return usedPages(st) >= 2*12*256 })
	// Free every page of the slabs past the second, and half of the first two's.
	var gone []backend.Slot
	i := 0
	for sl := range pages {
		if uint64(sl)>>32 > 2 || i%2 == 0 {
			gone = append(gone, sl)
		}
		i++
	}
	s.Free(gone...)
	for _, sl := range gone {
		delete(pages, sl)
	}
	after := c.waitStatus(func(st ctrl.Status) bool {
		return sessSlabs(st) <= 5 && usedPages(st) <= 2*5*256
	})
	t.Logf("slabs %d -> %d, servers' used pages %d -> %d", sessSlabs(before), sessSlabs(after), usedPages(before), usedPages(after))
	verify(t, s, pages)
	for sl, p := range storePages(t, s, 22, 2000) {
		pages[sl] = p
	}
	verify(t, s, pages)
	if s.Stored() != len(pages) {
		t.Fatalf("Stored() = %d, want %d", s.Stored(), len(pages))
	}
}

// A copy a live server no longer holds is found by a read as well (the server refuses: no such
// slab): the read fails over to the other copy, and the copy is re-placed and filled without
// any write to the slab.
func TestGoneCopyFoundByReadIsReplaced(t *testing.T) {
	c := newCluster(t, 3)
	s := c.open(2)
	pages := storePages(t, s, 31, 600)
	var slot backend.Slot
	for sl := range pages {
		slot = sl
		break
	}
	// A read prefers the copy whose server answered fastest so far, so any read of another slab
	// may change which copy this slab's next read takes, and a copy no read takes is never found
	// gone. Read the described slot itself next, with no read in between.
	sb, addr := freePreferredCopy(t, c, s, slot)
	buf := make([]byte, backend.PageSize)
	if err := s.Load(slot, buf); err != nil {
		t.Fatalf("slot %#x, its preferred copy gone: %v", slot, err)
	}
	if !bytes.Equal(buf, pages[slot]) {
		t.Fatalf("slot %#x, its preferred copy gone, came back with other bytes", slot)
	}
	sb.mu.RLock()
	for _, r := range sb.replicas {
		if r.srv.addr == addr && !r.bad.Load() {
			t.Errorf("the read of slot %#x did not find its preferred copy on %s gone: that copy is not marked bad", slot, addr)
		}
	}
	sb.mu.RUnlock()
	c.whole(s, 2)
	sb.mu.RLock()
	for _, r := range sb.replicas {
		if r.srv.addr == addr {
			t.Errorf("slab %d still has a copy on %s, which no longer held it", sb.id, addr)
		}
	}
	sb.mu.RUnlock()
	verify(t, s, pages)
}
