package remote

import (
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/fabric"
)

// slab is one of the session's slabs and its copies.
type slab struct {
	owner *Store // reports bad copies (nil in tests that make slabs alone)
	id    uint64
	pages uint32
	used  uint32   // protected by Store.mu: pages handed out so far (slot pages below it)
	free  []uint32 // protected by Store.mu: pages below used freed since, handed out first
	inUse uint32   // protected by Store.mu: pages handed out and not freed

	// mu is held for reading by every Store write to the slab and for writing by each chunk of a
	// rebuild copy, so a copy never interleaves with a write of the same pages (maintain.go).
	mu       sync.RWMutex
	replicas []*replica // protected by mu
	lost     error      // protected by mu; set when the ctrl says no copy is left

	// sums holds each page's CRC-32C as last stored. A page is read only after the Store that
	// wrote it returned, so a slot's sum is stable while anyone reads it.
	sums []atomic.Uint32
}

// replica is a copy of a slab on one server.
type replica struct {
	srv   *server
	ready bool // protected by slab.mu; false while it is being filled (rebuild): written to, never read from
	// bad is set once a write to this copy failed while the slab's write as a whole succeeded,
	// or its server said it no longer holds the slab: the copy misses pages, so it is neither read nor written again, and the ctrl is told
	// (Store.replicaBad) so that it places a replacement. Atomic: set under slab.mu's read lock.
	bad atomic.Bool
}

// failedWrite is a copy of sl a write failed on, and why.
type failedWrite struct {
	sl  *slab
	r   *replica
	err error
}

// usable is a copy to read from (and to copy from in a rebuild). Called with slab.mu held.
func (r *replica) usable() bool { return r.ready && !r.bad.Load() }

func newSlab(owner *Store, id uint64, pages uint32) *slab {
	return &slab{owner: owner, id: id, pages: pages, sums: make([]atomic.Uint32, pages)}
}

// goneFrom is a read's refusal that says the server no longer holds the slab for us: the copy
// is gone though the server lives (it freed it), so it is reported bad like a failed write.
func (sl *slab) goneFrom(srv *server, err error) {
	if !isGone(err) || sl.owner == nil {
		return
	}
	sl.mu.RLock()
	var gone *replica
	for _, r := range sl.replicas {
		if r.srv == srv {
			gone = r
		}
	}
	sl.mu.RUnlock()
	if gone != nil {
		sl.owner.replicaBad(sl, gone, err)
	}
}

// isGone is a server's refusal that says it holds no such slab for this session.
func isGone(err error) bool {
	var re *fabric.RemoteError
	return errors.As(err, &re) && re.Status == fabric.StatusNoSlab
}

// read fills dst with a page from the fastest ready copy whose bytes match the page's sum,
// trying the others in turn, and returns the server that answered. tc, if not nil, goes with
// every request (a traced fault's: each copy tried makes its span under the fault's fetch).
func (sl *slab) read(pg uint32, dst []byte, tc *fabric.TraceContext) (*server, error) {
	sl.mu.RLock()
	lost := sl.lost
	var cand [4]*server
	order := cand[:0]
	for _, r := range sl.replicas {
		if r.usable() {
			order = append(order, r.srv)
		}
	}
	sl.mu.RUnlock()
	if lost != nil {
		return nil, lost
	}
	sortByPreference(order)
	want := sl.sums[pg].Load()
	var msgs []string
	for _, srv := range order {
		err := srv.read(fabric.Addr{Slab: sl.id, Page: pg}, dst, tc)
		if err == nil {
			if crc32.Checksum(dst, crcTable) == want {
				return srv, nil
			}
			srv.corrupt.Add(1)
			err = fmt.Errorf("memory server %s returned page %d of slab %d with a wrong checksum", srv.addr, pg, sl.id)
		} else {
			sl.goneFrom(srv, err)
		}
		msgs = append(msgs, err.Error())
	}
	if len(order) == 0 {
		msgs = append(msgs, "no ready copy")
	}
	return nil, fmt.Errorf("remote: page %d of slab %d cannot be read from any copy: %s", pg, sl.id, strings.Join(msgs, "; "))
}

// replicaOf is srv's copy's index in the slab (-1: none now, it was dropped meanwhile).
func (sl *slab) replicaOf(srv *server) int {
	sl.mu.RLock()
	defer sl.mu.RUnlock()
	for i, r := range sl.replicas {
		if r.srv == srv {
			return i
		}
	}
	return -1
}

// preferredCopy is the server of the slab's preferred ready copy, the one a batch reads.
func (sl *slab) preferredCopy() (*server, error) {
	sl.mu.RLock()
	defer sl.mu.RUnlock()
	if sl.lost != nil {
		return nil, sl.lost
	}
	var best *server
	for _, r := range sl.replicas {
		if r.usable() && (best == nil || preferred(r.srv, best)) {
			best = r.srv
		}
	}
	if best == nil {
		return nil, fmt.Errorf("remote: no ready copy of slab %d", sl.id)
	}
	return best, nil
}

// batchPage is a page of a batch read: its slab, its page there, and the server read from.
type batchPage struct {
	sl  *slab
	pg  uint32
	srv *server
}

// readRun reads pages, all from one server, into dst in one request and checks every page's
// sum.
func readRun(pages []batchPage, dst []byte) error {
	var stack [32]fabric.Addr // a prefetch batch: no allocation
	addrs := stack[:0]
	for _, p := range pages {
		addrs = append(addrs, fabric.Addr{Slab: p.sl.id, Page: p.pg})
	}
	srv := pages[0].srv
	if err := srv.readMany(addrs, dst, nil); err != nil {
		// A server refuses the whole request when one of its slabs is gone, without saying
		// which: only a run of one slab names it. Otherwise the caller's page-by-page loads
		// find it.
		if oneSlab(addrs) {
			pages[0].sl.goneFrom(srv, err)
		}
		return err
	}
	for i, p := range pages {
		if crc32.Checksum(dst[i*backend.PageSize:(i+1)*backend.PageSize], crcTable) != p.sl.sums[p.pg].Load() {
			srv.corrupt.Add(1)
			return fmt.Errorf("memory server %s returned page %d of slab %d with a wrong checksum", srv.addr, p.pg, p.sl.id)
		}
	}
	return nil
}
