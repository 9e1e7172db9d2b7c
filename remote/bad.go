package remote

import (
	"context"
	"errors"
	"time"

	"github.com/farmem/farmem/ctrl"
)

// badCopy is a copy of a slab the ctrl must re-place: a write to it failed while its server
// may well be alive (so no death will drop it), or it could not even be created.
type badCopy struct {
	slab   uint64
	server string   // instance id
	addr   string   // for the log
	rep    *replica // our copy, if we hold one: un-marked if the ctrl keeps it
}

// replicaBad marks r bad (it is read and written no more) and queues the report to the ctrl;
// maintain sends it. Once per copy: a copy already marked is already reported.
func (s *Store) replicaBad(sl *slab, r *replica, why error) {
	if r.bad.Swap(true) {
		return
	}
	s.cfg.Logf("farmem: a write to the copy of slab %d on %s failed (%v): telling the ctrl, which places a replacement", sl.id, r.srv.addr, why)
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

// sendBad reports the queued bad copies to the ctrl; those it could not reach it keeps for the
// next round. Called by maintain only.
func (s *Store) sendBad() {
	s.badMu.Lock()
	todo := s.bad
	s.bad = nil
	s.badMu.Unlock()
	var keep []badCopy
	for i, b := range todo {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.ctrl.ReplicaBad(ctx, s.session.ID, b.slab, b.server)
		cancel()
		switch {
		case err == nil, errors.Is(err, ctrl.ErrNotFound):
			// Re-placed (the next slab map shows the replacement), or the slab is gone.
		case errors.Is(err, ctrl.ErrConflict):
			// The slab's last ready copy: the ctrl keeps it, and so do we. It misses the pages
			// whose write failed; their checksums catch it if they are read from it.
			s.cfg.Logf("farmem: the ctrl keeps the copy of slab %d on %s: %v", b.slab, b.addr, err)
			if b.rep != nil {
				b.rep.bad.Store(false)
			}
		default:
			s.cfg.Logf("farmem: reporting the bad copy of slab %d on %s to the ctrl (retrying): %v", b.slab, b.addr, err)
			keep = append(keep, todo[i:]...)
			s.badMu.Lock()
			s.bad = append(keep, s.bad...)
			s.badMu.Unlock()
			return
		}
	}
}
