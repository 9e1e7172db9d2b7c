package ctrl

import (
	"testing"
	"time"
)

// checkUnreported recomputes, for every server, the pages placed there that its last report did
// not list, and compares them with what placement reads (server.unreported).
func checkUnreported(t *testing.T, c *Cluster, when string) {
	t.Helper()
	for id, s := range c.servers {
		var want uint64
		for sid, sl := range s.placed {
			if _, ok := s.reported[sid]; !ok {
				want += uint64(sl.pages)
			}
		}
		if s.unreported != want {
			t.Fatalf("%s: server %s counts %d pages placed but unreported, recounted %d", when, id, s.unreported, want)
		}
	}
}

// What placement counts against each server stays the pages it was given and has not reported,
// through allocations, reports, frees, a server's death and the rebuild, and a session's end.
func TestCtrlUnreportedPagesStayCounted(t *testing.T) {
	c := newTestCluster(5, 16)
	srv := servers(4, 1000)
	for _, s := range srv {
		s.heartbeat(t, c, at(0))
	}
	sid := openSession(t, c, at(0))
	var slabs []Slab
	for i := range 12 {
		slabs = append(slabs, alloc(t, c, at(time.Duration(i)*time.Millisecond), sid, 2))
		checkUnreported(t, c, "after an allocation")
	}
	// Each server reports what it was given, but for the last slab.
	for _, s := range srv {
		s.slabs = nil
		for _, sl := range slabs[:len(slabs)-1] {
			for _, r := range sl.Replicas {
				if r.Server == s.id {
					s.slabs = append(s.slabs, sl.ID)
				}
			}
		}
		s.heartbeat(t, c, at(100*time.Millisecond))
		checkUnreported(t, c, "after a report")
	}
	if err := c.FreeSlab(at(200*time.Millisecond), sid, slabs[0].ID); err != nil {
		t.Fatal(err)
	}
	checkUnreported(t, c, "after a free")
	// srv[0] stops heartbeating: it dies, and its replicas are rebuilt on the others.
	for d := time.Second; d <= 12*time.Second; d += time.Second {
		for _, s := range srv[1:] {
			s.heartbeat(t, c, at(d))
		}
		checkUnreported(t, c, "while a server dies and its slabs are rebuilt")
	}
	if err := c.CloseSession(at(13*time.Second), sid); err != nil {
		t.Fatal(err)
	}
	checkUnreported(t, c, "after the session closed")
	for _, s := range c.servers {
		if len(s.placed) != 0 || s.unreported != 0 {
			t.Fatalf("server %s still holds %d slabs (%d pages unreported) after its session closed", s.id, len(s.placed), s.unreported)
		}
	}
}
