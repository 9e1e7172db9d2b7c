package remote

import (
	"cmp"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
	"sync"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/fabric"
)

// Writes. Every page of a Store goes to every copy of its slab not known bad. The pages of all
// the slabs that have a copy on one server go to that server in one request, whatever their
// slabs (a request may name pages of several slabs): an eviction batch's pages land in several
// slabs, since freed slots are reused from any slab, and a request per slab would cost a round
// trip each, one after the other, while the program's faults on the batch's pages wait for the
// batch to end. The servers are written in parallel.
//
// A server refuses a whole request when one of its slabs is gone (it checks every address
// before it stores a page), so a request refused for a gone slab is sent again slab by slab
// (resendBySlab): the slabs still there take their pages, and only the gone slab's copy is
// reported bad. Not a refusal that names the gone slabs: that would change the wire for a rare
// event, and the shm and rdma transports, which find a gone slab on their own side, would each
// need it too.

// serverWrite is what one server is sent: the pages of src on slabs with a copy there, in
// src's order.
type serverWrite struct {
	srv   *server
	addrs []fabric.Addr
	idx   []int // the page of src each address is written from
	err   error // the request's outcome
	// bySlab, if not nil, is each slab's own outcome: the request was refused for a gone slab
	// and sent again slab by slab.
	bySlab map[uint64]error
}

// errFor is how the write of slab id's pages to this server went.
func (w *serverWrite) errFor(id uint64) error {
	if w.bySlab != nil {
		return w.bySlab[id]
	}
	return w.err
}

// write stores page i of src (n pages) in slot slots[i], on every copy of the slot's slab not
// known bad, the slabs being order (each page's slab is slabOf[i]). It succeeds when every slab
// had at least one ready copy take its pages; the copies that failed then miss pages, and are
// reported bad. A server that fails is also not preferred for reads again.
func (s *Store) write(src []byte, slots []backend.Slot, slabOf []*slab, order []*slab) error {
	for i, sl := range slabOf {
		sl.sums[uint32(slots[i])].Store(crc32.Checksum(src[i*backend.PageSize:(i+1)*backend.PageSize], crcTable))
	}
	// Each slab's lock is held for reading across the writes, so that a rebuild's copy of a
	// chunk (which takes it for writing, one slab at a time) never interleaves with them. The
	// read locks are taken in one order (slab id), so two Stores cannot wait on each other
	// through a rebuild waiting between them.
	slices.SortFunc(order, func(a, b *slab) int { return cmp.Compare(a.id, b.id) })
	for _, sl := range order {
		sl.mu.RLock()
	}
	unlock := func() {
		for _, sl := range order {
			sl.mu.RUnlock()
		}
	}
	var writes []*serverWrite
	to := map[*slab][]*serverWrite{} // each slab's servers
	copies := map[*slab][]*replica{}
	for _, sl := range order {
		if sl.lost != nil {
			unlock()
			return sl.lost
		}
		for _, r := range sl.replicas {
			if r.bad.Load() {
				continue
			}
			var w *serverWrite
			for _, x := range writes {
				if x.srv == r.srv {
					w = x
				}
			}
			if w == nil {
				w = &serverWrite{srv: r.srv}
				writes = append(writes, w)
			}
			to[sl] = append(to[sl], w)
			copies[sl] = append(copies[sl], r)
		}
		if len(to[sl]) == 0 {
			unlock()
			return fmt.Errorf("remote: no copy of slab %d is left to write", sl.id)
		}
	}
	for i, sl := range slabOf {
		for _, w := range to[sl] {
			w.addrs = append(w.addrs, fabric.Addr{Slab: sl.id, Page: uint32(slots[i])})
			w.idx = append(w.idx, i)
		}
	}
	var wg sync.WaitGroup
	for _, w := range writes[1:] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.send(src, len(slabOf))
		}()
	}
	writes[0].send(src, len(slabOf))
	wg.Wait()

	var failed []failedWrite
	var lostErr error
	for _, sl := range order {
		ok := false
		var msgs []string
		var bad []failedWrite
		for j, r := range copies[sl] {
			if err := to[sl][j].errFor(sl.id); err != nil {
				msgs = append(msgs, err.Error())
				bad = append(bad, failedWrite{sl, r, err})
			} else if r.ready {
				ok = true
			}
		}
		switch {
		case ok:
			failed = append(failed, bad...)
		case lostErr == nil:
			lostErr = fmt.Errorf("remote: no copy of slab %d could be written: %s", sl.id, strings.Join(msgs, "; "))
		}
	}
	unlock()
	for _, f := range failed {
		s.replicaBad(f.sl, f.r, f.err)
	}
	return lostErr
}

// send writes w's pages from src (n pages): src itself when w takes every page of it in order,
// else a gathered copy.
func (w *serverWrite) send(src []byte, n int) {
	data := src[:n*backend.PageSize]
	if len(w.idx) != n {
		data = make([]byte, len(w.idx)*backend.PageSize)
		for j, i := range w.idx {
			copy(data[j*backend.PageSize:], src[i*backend.PageSize:(i+1)*backend.PageSize])
		}
	}
	w.err = w.srv.write(w.addrs, data)
	if isGone(w.err) && !oneSlab(w.addrs) {
		w.resendBySlab(data)
	}
}

// resendBySlab writes the pages of each of w's slabs (data holds w's pages, in w.addrs' order)
// in a request of their own, and records each slab's outcome. Once a request is not answered
// (timed out, the connection dropped), the slabs not sent yet fail with it rather than wait a
// timeout each: their copies miss the pages either way, and are reported bad.
func (w *serverWrite) resendBySlab(data []byte) {
	var slabs []uint64
	pos := map[uint64][]int{} // each slab's pages, by index in w.addrs
	for j, a := range w.addrs {
		if pos[a.Slab] == nil {
			slabs = append(slabs, a.Slab)
		}
		pos[a.Slab] = append(pos[a.Slab], j)
	}
	w.bySlab = make(map[uint64]error, len(slabs))
	var unanswered error
	for _, id := range slabs {
		if unanswered != nil {
			w.bySlab[id] = unanswered
			continue
		}
		addrs := make([]fabric.Addr, len(pos[id]))
		pages := make([]byte, len(pos[id])*backend.PageSize)
		for k, j := range pos[id] {
			addrs[k] = w.addrs[j]
			copy(pages[k*backend.PageSize:], data[j*backend.PageSize:(j+1)*backend.PageSize])
		}
		err := w.srv.write(addrs, pages)
		w.bySlab[id] = err
		var re *fabric.RemoteError
		if err != nil && !errors.As(err, &re) {
			unanswered = err
		}
	}
}

// oneSlab says whether every address is in one slab.
func oneSlab(addrs []fabric.Addr) bool {
	for _, a := range addrs[1:] {
		if a.Slab != addrs[0].Slab {
			return false
		}
	}
	return true
}
