package remote

import (
	"context"
	"errors"
	"time"

	"github.com/farmem/farmem/ctrl"
)

// badCopy is a copy of a slab the ctrl must re-place: a write to it failed while its server
// may well be alive (so no death will drop it), its server said it no longer holds it, or it
// could not even be created.
type badCopy struct {
	slab   uint64
	server string   // instance id
	addr   string   // for the log
	rep    *replica // our copy, if we hold one: un-marked if the ctrl keeps it
}

// replicaBad marks r bad (it is read and written no more) and queues the report to the ctrl;
// housekeep sends it. Once per copy: a copy already marked is already reported.
func (s *Store) replicaBad(sl *slab, r *replica, why error) {
	if r.bad.Swap(true) {
		return
	}
	s.cfg.Logf("farmem: the copy of slab %d on %s cannot be used (%v): telling the ctrl, which places a replacement", sl.id, r.srv.addr, why)
	s.queueBad(badCopy{slab: sl.id, server: r.srv.id, addr: r.srv.addr, rep: r})
}

func (s *Store) queueBad(b badCopy) {
	s.badMu.Lock()
	s.bad = append(s.bad, b)
	s.badMu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// sendBad reports the queued bad copies to the ctrl in one request (a server's failure is one
// save on the ctrl, not one per slab); if the ctrl cannot be reached they wait for the next
// round. Called by housekeep only.
func (s *Store) sendBad() {
	s.badMu.Lock()
	todo := s.bad
	s.bad = nil
	s.badMu.Unlock()
	if len(todo) == 0 {
		return
	}
	req := make([]ctrl.BadReplica, 0, len(todo))
	seen := map[ctrl.BadReplica]bool{}
	for _, b := range todo {
		k := ctrl.BadReplica{Slab: b.slab, Server: b.server}
		if !seen[k] {
			seen[k] = true
			req = append(req, k)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	kept, err := s.ctrl.ReplicasBad(ctx, s.session.ID, req)
	cancel()
	if err != nil {
		if !errors.Is(err, ctrl.ErrNotFound) { // else the session is gone: maintain says so
			s.cfg.Logf("farmem: reporting %d bad copies to the ctrl (retrying): %v", len(req), err)
			s.badMu.Lock()
			s.bad = append(todo, s.bad...)
			s.badMu.Unlock()
		}
		return
	}
	for _, k := range kept {
		// The slab's last ready copy: the ctrl keeps it, and so do we. It misses the pages
		// whose write failed; their checksums catch it if they are read from it.
		for _, b := range todo {
			if b.slab == k.Slab && b.server == k.Server {
				s.cfg.Logf("farmem: the ctrl keeps the copy of slab %d on %s: it is the slab's last ready one", b.slab, b.addr)
				if b.rep != nil {
					b.rep.bad.Store(false)
				}
			}
		}
	}
}
