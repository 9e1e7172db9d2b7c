package remote

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
)

// allocate asks the ctrl for a slab and creates it on its replicas. A replica that cannot be
// created is left out and reported bad: its server may be dying, but it may as well stay alive
// (a link that flapped, a server out of memory), and then no death would ever make the ctrl
// replace it — the slab would keep a copy fewer while the ctrl counts it whole. The ctrl
// places a replacement on another server, which maintain creates and fills. With no replica
// created at all the slab is given back and another asked for, until the ctx ends.
func (s *Store) allocate(ctx context.Context) (*slab, error) {
	s.growMu.Lock()
	defer s.growMu.Unlock()
	var errs []string // why the last slab got no replica
	var ctrlErr error // the last ctrl failure worth another try
	for {
		actx, cancel := context.WithTimeout(ctx, allocAttempt)
		cs, err := s.ctrl.AllocSlab(actx, s.session.ID, s.cfg.Replicas)
		cancel()
		if err != nil && ctx.Err() == nil && allocRetryable(err) {
			// A ctrl that cannot save (cut off from its store: it steps down once its lease
			// ends) or that did not answer in time: ask again, and the client moves on to the
			// leader once this one refuses. The program waits meanwhile rather than stop.
			if ctrlErr == nil {
				s.cfg.Logf("farmem: allocating a slab: %v; asking again", err)
			}
			ctrlErr = err
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			if ctx.Err() != nil && len(errs) > 0 {
				// The time ran out between two tries (so this request failed at once): the
				// servers' refusals are the cause, not the ctrl.
				return nil, fmt.Errorf("no memory server could take a slab: %s", strings.Join(errs, "; "))
			}
			return nil, fmt.Errorf("no room for evicted pages in the cluster: %w", err)
		}
		sl := newSlab(s, cs.ID, cs.Pages)
		errs = errs[:0]
		var failed []ctrl.Replica
		for _, r := range cs.Replicas {
			srv := s.servers.get(r.Server, r.Addr)
			if err := s.create(srv, &r.Grant); err != nil {
				errs = append(errs, err.Error())
				failed = append(failed, r)
				continue
			}
			sl.replicas = append(sl.replicas, &replica{srv: srv, ready: true})
		}
		if len(sl.replicas) > 0 {
			if len(errs) > 0 {
				s.cfg.Logf("farmem: slab %d placed with %d of %d copies for now, asking the ctrl to re-place the others: %s", cs.ID, len(sl.replicas), len(cs.Replicas), strings.Join(errs, "; "))
			}
			for _, r := range failed {
				s.queueBad(badCopy{slab: cs.ID, server: r.Server, addr: r.Addr})
			}
			return sl, nil
		}
		s.ctrl.FreeSlab(ctx, s.session.ID, cs.ID)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("no memory server could take a slab: %s", strings.Join(errs, "; "))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// allocAttempt bounds one request for a slab: a ctrl that holds it longer is cut off from its
// store, and another ctrl leads, or soon will.
const allocAttempt = 5 * time.Second

// allocRetryable is an AllocSlab failure that another try may not meet: the ctrl could not
// save, did not answer, could not be reached, or no ctrl leads yet. No room, a session the ctrl
// ended and a refused token are final.
func allocRetryable(err error) bool {
	for _, final := range []error{ctrl.ErrNoRoom, ctrl.ErrNotFound, ctrl.ErrUnauthorized, ctrl.ErrBadRequest} {
		if errors.Is(err, final) {
			return false
		}
	}
	return true
}

func (s *Store) create(srv *server, g *fabric.Grant) error {
	t, err := srv.transport()
	if err != nil {
		return err
	}
	if err := srv.answered(t.Create(g)); err != nil {
		return fmt.Errorf("memory server at %s: %w", srv.addr, err)
	}
	return nil
}

// maintain keeps the session alive and follows the slab map: replicas dropped with a dead
// server or reported bad, replacements to fill, slabs lost. housekeep does the rest.
func (s *Store) maintain() {
	defer s.done.Done()
	interval := s.session.Interval()
	if interval <= 0 {
		interval = ctrl.SessionInterval
	}
	// Look for map changes more often than the session must heartbeat: a replacement replica
	// placed a little sooner is a shorter window with one copy fewer.
	tick := time.NewTicker(min(interval, 250*time.Millisecond))
	defer tick.Stop()
	var gen uint64
	var ctrlErr error
	for {
		select {
		case <-s.stop:
			return
		case <-tick.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		g, err := s.ctrl.SessionHeartbeat(ctx, s.session.ID)
		if err == nil && g != gen {
			var slabs []ctrl.Slab
			if g, slabs, err = s.ctrl.Slabs(ctx, s.session.ID); err == nil {
				s.apply(slabs)
				gen = g
			}
		}
		cancel()
		switch {
		case errors.Is(err, ctrl.ErrNotFound):
			s.reportLost(fmt.Errorf("the ctrl at %s ended this session (it did not hear from us in time): its pages on the memory servers are being freed", s.cfg.Ctrl))
			return
		case err != nil && ctrlErr == nil:
			s.cfg.Logf("farmem: lost contact with the ctrl (pages in memory servers stay served; no failover until it is back): %v", err)
		case err == nil && ctrlErr != nil:
			s.cfg.Logf("farmem: the ctrl at %s is back", s.cfg.Ctrl)
		}
		ctrlErr = err
	}
}

// housekeep keeps a spare slab ready so that no eviction waits on the ctrl, reports bad copies
// and gives emptied slabs back: beside maintain, because each of these waits on the ctrl (on a
// ctrl cut off from its store, until the request times out), and the session's heartbeats must
// go on meanwhile, or the ctrl ends the session.
func (s *Store) housekeep() {
	defer s.done.Done()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	for {
		s.keepSpare()
		s.sendBad()
		s.releaseEmpty()
		select {
		case <-s.stop:
			return
		case <-tick.C:
		case <-s.wake: // a bad copy to report: the sooner it is re-placed, the shorter the window with a copy fewer
		}
	}
}

// keepSpare allocates the next slab once none is spare and the current ones are half used.
func (s *Store) keepSpare() {
	s.spareMu.Lock()
	have := s.spare != nil
	s.spareMu.Unlock()
	if have {
		return
	}
	s.mu.Lock()
	var total, used uint64
	for _, sl := range s.slabs {
		if sl != nil {
			total += uint64(sl.pages)
			used += uint64(sl.inUse)
		}
	}
	s.mu.Unlock()
	if used*2 < total {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	sl, err := s.allocate(ctx)
	if err != nil {
		s.cfg.Logf("farmem: could not allocate a spare slab ahead of need: %v", err)
		return
	}
	s.spareMu.Lock()
	s.spare = sl // only housekeep sets the spare
	s.spareMu.Unlock()
}

// apply brings our slabs in line with the ctrl's map.
func (s *Store) apply(slabs []ctrl.Slab) {
	s.mu.Lock()
	mine := make(map[uint64]*slab, len(s.slabs)+1)
	for _, sl := range s.slabs {
		if sl != nil {
			mine[sl.id] = sl
		}
	}
	s.mu.Unlock()
	s.spareMu.Lock()
	if sl := s.spare; sl != nil {
		mine[sl.id] = sl
	}
	s.spareMu.Unlock()
	for _, cs := range slabs {
		sl := mine[cs.ID]
		if sl == nil {
			continue
		}
		if cs.Lost {
			err := fmt.Errorf("pages lost: every copy of slab %d is gone with memory server(s) %s", cs.ID, strings.Join(cs.LostServers, ", "))
			sl.mu.Lock()
			sl.lost = err
			sl.mu.Unlock()
			s.reportLost(err)
			continue
		}
		s.applySlab(sl, cs)
	}
}

// applySlab drops the replicas the ctrl no longer lists, adds (then fills) the new ones, and
// reports bad the ready ones it lists that we do not hold.
func (s *Store) applySlab(sl *slab, cs ctrl.Slab) {
	listed := map[string]ctrl.Replica{}
	for _, r := range cs.Replicas {
		listed[r.Server] = r
	}
	sl.mu.Lock()
	have := map[string]bool{}
	kept := sl.replicas[:0]
	for _, r := range sl.replicas {
		if _, ok := listed[r.srv.id]; ok {
			kept = append(kept, r)
			have[r.srv.id] = true
		}
	}
	sl.replicas = kept
	sl.mu.Unlock()
	for _, r := range cs.Replicas {
		if !have[r.Server] && r.State == ctrl.Ready {
			// A copy the ctrl counts that we never made (its create failed): whatever became
			// of the report that said so, say it again rather than run a copy short.
			s.queueBad(badCopy{slab: cs.ID, server: r.Server, addr: r.Addr})
		}
		if have[r.Server] || r.State != ctrl.Rebuilding {
			continue
		}
		srv := s.servers.get(r.Server, r.Addr)
		if err := s.create(srv, &r.Grant); err != nil {
			// Left as it is, the ctrl would wait for it forever: ask for another.
			s.cfg.Logf("farmem: cannot create replacement copy of slab %d on %s, asking the ctrl for another: %v", cs.ID, r.Addr, err)
			s.queueBad(badCopy{slab: cs.ID, server: r.Server, addr: r.Addr})
			continue
		}
		// From here on every Store of this slab writes the new copy too; the pages stored
		// before are copied below.
		nr := &replica{srv: srv}
		sl.mu.Lock()
		sl.replicas = append(sl.replicas, nr)
		sl.mu.Unlock()
		s.done.Add(1)
		go func() {
			defer s.done.Done()
			s.fill(sl, nr)
		}()
	}
}

// Filling a replacement copy waits this long after a failed try, doubling up to the cap.
const (
	fillRetryFirst = 100 * time.Millisecond
	fillRetryMax   = 5 * time.Second
)

// fill copies the slab into the replacement copy nr and tells the ctrl it is ready. A copy
// that cannot be written is reported bad (the ctrl places another). A source that cannot be
// read (timed out, unreachable) is tried again, with backoff, until it can be, nr is dropped
// or reported bad, the slab is lost or the store closes: given up on, nr would stay listed and
// never ready, the slab a copy short for good, since the ctrl's maps show nr as held already
// and nothing would fill it again.
func (s *Store) fill(sl *slab, nr *replica) {
	wait := fillRetryFirst
	for try := 1; ; try++ {
		err := s.rebuild(sl, nr)
		if err == nil {
			if try > 1 {
				s.cfg.Logf("farmem: the replacement copy of slab %d on %s is filled (try %d)", sl.id, nr.srv.addr, try)
			}
			break
		}
		var de destError
		switch {
		case errors.As(err, &de):
			s.replicaBad(sl, nr, de.err) // the ctrl places another
			return
		case errors.Is(err, errClosed) || errors.Is(err, errFillMoot):
			return
		}
		if try == 1 {
			s.cfg.Logf("farmem: filling the replacement copy of slab %d on %s failed (trying again until it can be filled): %v", sl.id, nr.srv.addr, err)
		}
		select {
		case <-s.stop:
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, fillRetryMax)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.ctrl.ReplicaReady(ctx, s.session.ID, sl.id, nr.srv.id); err != nil {
		s.cfg.Logf("farmem: telling the ctrl slab %d is whole again: %v", sl.id, err)
	}
}

// rebuildChunk is how many pages one copy step moves while it keeps the slab's Stores out.
const rebuildChunk = 256

// rebuild copies every page handed out so far from a ready copy to nr, chunk by chunk, each
// under the slab's write lock: a Store of those pages either finished before the chunk is read
// (and is copied) or starts after it is written (and writes nr itself). Pages handed out after
// `used` is read below are written to nr by their Stores, since nr was added first.
func (s *Store) rebuild(sl *slab, nr *replica) error {
	s.mu.Lock()
	used := sl.used
	s.mu.Unlock()
	buf := make([]byte, rebuildChunk*backend.PageSize)
	addrs := make([]fabric.Addr, rebuildChunk)
	for off := uint32(0); off < used; off += rebuildChunk {
		select {
		case <-s.stop:
			return errClosed
		default:
		}
		n := min(rebuildChunk, int(used-off))
		for i := range n {
			addrs[i] = fabric.Addr{Slab: sl.id, Page: off + uint32(i)}
		}
		if err := s.copyChunk(sl, nr, addrs[:n], buf[:n*backend.PageSize]); err != nil {
			return err
		}
	}
	sl.mu.Lock()
	nr.ready = true
	sl.mu.Unlock()
	return nil
}

func (s *Store) copyChunk(sl *slab, nr *replica, addrs []fabric.Addr, buf []byte) error {
	sl.mu.Lock()
	defer sl.mu.Unlock()
	if sl.lost != nil || nr.bad.Load() || !slices.Contains(sl.replicas, nr) {
		return errFillMoot
	}
	var err error
	for _, r := range sl.replicas {
		if !r.usable() {
			continue
		}
		var t fabric.Transport
		if t, err = r.srv.transport(); err != nil {
			continue
		}
		if err = r.srv.answered(t.Read(addrs, buf)); err != nil {
			if isGone(err) {
				s.replicaBad(sl, r, err) // the source copy is gone from its server
			}
			continue
		}
		if err = nr.srv.write(addrs, buf); err != nil {
			return destError{err}
		}
		return nil
	}
	if err == nil {
		err = errors.New("no ready copy to copy from")
	}
	return err
}

// errFillMoot: the copy being filled was dropped or reported bad meanwhile, or the slab is
// lost: there is nothing left to fill.
var errFillMoot = errors.New("the copy was reported bad or dropped meanwhile, or the slab is lost")

// destError is a rebuild's failure to write the copy it fills (not to read the one it copies).
type destError struct{ err error }

func (e destError) Error() string { return e.err.Error() }
