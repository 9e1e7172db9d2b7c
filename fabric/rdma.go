//go:build rdma

package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// RDMAClient is the rdma transport: pages move by one-sided RDMA READ and WRITE over
// libibverbs, with no server CPU on the data path. One tcp connection to the memory server is
// the control connection: the usual handshake (token, session), Create and Free, and the two
// rdma requests (wire.go): RDMAConnect connects each of the client's queue pairs to one the
// server makes for it, RDMARegister gets the address and key of a slab of this session. The
// server decides ownership there, exactly as for a tcp read: a key is only ever handed out for
// the session's own slabs, and it opens them only through this connection's queue pairs.
//
// Each queue pair (cfg.Conns of them, one request each at a time, like tcp connections) has a
// registered 4 MiB bounce buffer: a Write copies the pages into it and posts one RDMA WRITE
// per page, a Read posts one RDMA READ per page and copies them out; a batch is one chain of
// work requests with only the last signaled, waited for by spinning briefly on the completion
// queue, then sleeping on its channel. Nothing is allocated per page or per request.
//
// Refusals are the server's (StatusNoSlab comes from RDMARegister) except StatusRange, which
// the client gives from the slab size the server told it (the region ends there, so the device
// would refuse the access anyway); every address is checked before any page moves, so a
// refused request moves nothing.
//
// Failures: a queue pair that fails is destroyed and a new one connected on next use. On a
// remote access error (the slab was freed on the server, which deregisters it) the request
// forgets its regions and is retried once, registering again, which the server refuses if the
// slab is gone. Any other failure (the server's queue pair unreachable: retries exhausted
// after about 0.5 s, or no completion within cfg.Timeout) fails the request and drops the
// control connection too. A control connection that broke is redialed on next use, and a new
// one is a new generation: the server dropped everything of the old one, so the regions are
// forgotten and every queue pair is connected anew.
//
// Lock order: a queue pair slot (taken from pool) -> ctlMu -> slabMu.
type RDMAClient struct {
	addr     string
	cfg      DialConfig
	instance string
	dialer   *TCPClient // dials the control connection (its pool is unused)
	dev      *verbsDevice
	pd       verbsPD // the client's queue pairs and buffers

	ctlMu sync.Mutex
	ctl   *clientConn   // protected by ctlMu; nil: dial on next use
	gen   atomic.Uint64 // written under ctlMu: the control connection's generation

	slabMu sync.RWMutex
	slabs  map[uint64]rdmaRegion // protected by slabMu; written under ctlMu too

	pool chan *rdmaQP // cfg.Conns slots: a live queue pair, a dead one's remains, or nil
}

// rdmaQP is one of the client's queue pairs, or what is left of it once it failed: q nil, and
// remote (the server's queue pair) to retire when a new one is connected.
type rdmaQP struct {
	q      *verbsQP
	gen    uint64 // the control connection it was connected on
	remote uint32 // the server's queue pair
	raddr  []uint64
	rkey   []uint32
}

// rdmaBufPages is the bounce buffer of one queue pair: one request's worth of pages.
const rdmaBufPages = MaxPages

// DialRDMA connects to the memory server at addr (its tcp address), authenticates, opens this
// host's RDMA device (FARMEM_RDMA_DEVICE, FARMEM_RDMA_GID_INDEX: rdma_wire.go) and connects a
// first queue pair, so that a server or a host without working RDMA is reported here, in a
// user's terms.
func DialRDMA(addr string, cfg DialConfig) (Transport, error) {
	cfg.defaults()
	t := &RDMAClient{addr: addr, cfg: cfg, dialer: &TCPClient{network: "tcp", addr: addr, cfg: cfg},
		slabs: map[uint64]rdmaRegion{}, pool: make(chan *rdmaQP, cfg.Conns)}
	t.ctlMu.Lock()
	c, err := t.ctlConnLocked()
	t.ctlMu.Unlock()
	if err != nil {
		return nil, err
	}
	t.instance = c.instance
	if t.dev, err = openVerbsDevice(); err == nil {
		t.pd, err = t.dev.allocPD()
	}
	if err != nil {
		c.file.Close()
		return nil, err
	}
	q, err := t.ready(nil)
	if err != nil {
		c.file.Close()
		t.pd.free()
		return nil, t.wrap(OpRDMAConnect, err)
	}
	t.pool <- q
	for i := 1; i < cfg.Conns; i++ {
		t.pool <- nil
	}
	return t, nil
}

// Instance implements Transport.
func (t *RDMAClient) Instance() string { return t.instance }

// Addr is the server's (tcp) address.
func (t *RDMAClient) Addr() string { return t.addr }

// Device is the local RDMA device's name.
func (t *RDMAClient) Device() string { return t.dev.name() }

// Close implements Transport: it waits for the requests in flight, destroys the queue pairs and
// closes the control connection (the server then drops its queue pairs and registrations; the
// slabs stay: Free them first to give them up).
func (t *RDMAClient) Close() error {
	for i := 0; i < t.cfg.Conns; i++ {
		if q := <-t.pool; q != nil && q.q != nil {
			q.q.destroy()
		}
	}
	t.dropControl()
	t.pd.free()
	return nil
}

// ctlConnLocked is the control connection, dialed if needed. A new one is a new generation:
// the server has forgotten the old one's queue pairs and registrations, and so do we.
func (t *RDMAClient) ctlConnLocked() (*clientConn, error) {
	if t.ctl != nil {
		return t.ctl, nil
	}
	c, err := t.dialer.dial()
	if err != nil {
		return nil, err
	}
	t.ctl = c
	t.gen.Add(1)
	t.slabMu.Lock()
	clear(t.slabs)
	t.slabMu.Unlock()
	return c, nil
}

// ctlCallLocked sends one request on the control connection and reads its answer into dst
// (exactly the answer's size). A failure other than a refusal ends the connection.
func (t *RDMAClient) ctlCallLocked(op Op, payload, dst []byte) error {
	c, err := t.ctlConnLocked()
	if err != nil {
		return err
	}
	err = c.call(op, 0, [][]byte{payload}, dst)
	var re *RemoteError
	if err != nil && !errors.As(err, &re) {
		c.file.Close()
		t.ctl = nil
	}
	return err
}

// dropControl closes the control connection; the next call dials a new one.
func (t *RDMAClient) dropControl() {
	t.ctlMu.Lock()
	if t.ctl != nil {
		t.ctl.file.Close()
		t.ctl = nil
	}
	t.ctlMu.Unlock()
}

func (t *RDMAClient) control(op Op, payload, dst []byte) error {
	t.ctlMu.Lock()
	defer t.ctlMu.Unlock()
	return t.wrap(op, t.ctlCallLocked(op, payload, dst))
}

// wrap says which server an error came from, like the tcp transport's; refusals pass as they
// are.
func (t *RDMAClient) wrap(op Op, err error) error {
	if err == nil {
		return nil
	}
	var re *RemoteError
	switch {
	case errors.As(err, &re):
		return err
	case errors.Is(err, errWCTimeout) || errors.Is(err, unix.EAGAIN):
		return fmt.Errorf("the memory server at %s did not answer within %v (rdma %v)", t.addr, t.cfg.Timeout, op)
	}
	return fmt.Errorf("memory server at %s: rdma %v: %w", t.addr, op, err)
}

// Create implements Transport.
func (t *RDMAClient) Create(g *Grant) error {
	return t.control(OpCreate, encodeGrant(nil, g), nil)
}

// Free implements Transport. The server deregisters the slab from every connection as it frees
// it; the client forgets its region.
func (t *RDMAClient) Free(slab uint64) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], slab)
	err := t.control(OpFree, b[:], nil)
	t.slabMu.Lock()
	delete(t.slabs, slab)
	t.slabMu.Unlock()
	return err
}

// region is a slab's registration, asked for if not known.
func (t *RDMAClient) region(slab uint64) (rdmaRegion, error) {
	t.slabMu.RLock()
	r, ok := t.slabs[slab]
	t.slabMu.RUnlock()
	if ok {
		return r, nil
	}
	t.ctlMu.Lock()
	defer t.ctlMu.Unlock()
	var b [8]byte
	var ans [rdmaRegionSize]byte
	binary.LittleEndian.PutUint64(b[:], slab)
	if err := t.ctlCallLocked(OpRDMARegister, b[:], ans[:]); err != nil {
		return r, err
	}
	r = decodeRDMARegion(ans[:])
	t.slabMu.Lock()
	t.slabs[slab] = r
	t.slabMu.Unlock()
	return r, nil
}

// ready returns a connected queue pair of the current generation for slot q: q itself if it is
// one, else a new one (retiring q's server side). On failure it returns what to put back.
func (t *RDMAClient) ready(q *rdmaQP) (*rdmaQP, error) {
	gen := t.gen.Load()
	if q != nil && q.q != nil && q.gen == gen {
		return q, nil
	}
	if q != nil {
		q.kill()
	}
	depth := min(rdmaBufPages, t.dev.maxDepth())
	v, err := t.dev.createQP(t.pd, accessNone, depth, rdmaBufPages)
	if err != nil {
		return q, err
	}
	psn := randomPSN()
	me := t.dev.info(v, psn, t.dev.initDepth())
	var ans [rdmaQPInfoSize]byte
	t.ctlMu.Lock()
	if _, err = t.ctlConnLocked(); err == nil {
		gen = t.gen.Load() // current now (a redial made a new generation)
		if q != nil && q.gen == gen {
			me.Retire = q.remote // the failed queue pair's server side, on this same connection
		}
		err = t.ctlCallLocked(OpRDMAConnect, me.encode(nil), ans[:])
	}
	t.ctlMu.Unlock()
	if err != nil {
		v.destroy()
		return q, err
	}
	srv, err := decodeRDMAQPInfo(ans[:])
	if err != nil {
		v.destroy()
		return q, err
	}
	if err := t.dev.connect(v, psn, srv, min(t.dev.initDepth(), int(srv.RDAtomic))); err != nil {
		v.destroy()
		return &rdmaQP{gen: gen, remote: srv.QPN}, err
	}
	if q == nil || q.raddr == nil {
		q = &rdmaQP{raddr: make([]uint64, rdmaBufPages), rkey: make([]uint32, rdmaBufPages)}
	}
	q.q, q.gen, q.remote = v, gen, srv.QPN
	return q, nil
}

// kill destroys a failed queue pair, keeping what is needed to retire its server side.
func (q *rdmaQP) kill() {
	if q.q != nil {
		q.q.destroy()
		q.q = nil
	}
}

// errStale: a region was forgotten between the check and the transfer (the control connection
// was redialed meanwhile).
var errStale = errors.New("slab registration forgotten")

// Write implements Transport.
func (t *RDMAClient) Write(addrs []Addr, pages []byte) error { return t.rw(OpWrite, addrs, pages) }

// Read implements Transport.
func (t *RDMAClient) Read(addrs []Addr, pages []byte) error { return t.rw(OpRead, addrs, pages) }

func (t *RDMAClient) rw(op Op, addrs []Addr, pages []byte) error {
	if err := checkPages(addrs, pages); err != nil || len(addrs) == 0 {
		return err
	}
	q := <-t.pool
	var err error
	for attempt := 0; attempt < 2; attempt++ {
		if err = t.check(op, addrs); err != nil {
			break
		}
		if q, err = t.ready(q); err != nil {
			break
		}
		if err = t.transfer(q, op == OpWrite, addrs, pages); err == nil {
			break
		}
		q.kill()
		var we wcError
		if !(errors.As(err, &we) && we.remoteAccess()) && err != errStale {
			// The server's queue pair is gone or unreachable: the server died, or it dropped
			// this client's state with the control connection. Start over on the next call:
			// a new control connection (or a quick "cannot reach") rather than a dead one.
			t.dropControl()
			break
		}
		// A region we used is no longer registered: the slab was freed (the server revoked
		// it) or the server forgot this client. Ask again: the server refuses a gone slab.
		t.forget(addrs)
	}
	t.pool <- q
	return t.wrap(op, err)
}

// check resolves every slab of the request (registering the ones not known yet) and checks
// every page against its slab's size.
func (t *RDMAClient) check(op Op, addrs []Addr) error {
	var r rdmaRegion
	for i, a := range addrs {
		if i == 0 || a.Slab != addrs[i-1].Slab {
			var err error
			if r, err = t.region(a.Slab); err != nil {
				return err
			}
		}
		if a.Page >= r.Pages {
			return &RemoteError{Op: op, Status: StatusRange,
				Message: fmt.Sprintf("page %d is beyond slab %d's %d pages", a.Page, a.Slab, r.Pages)}
		}
	}
	return nil
}

// forget drops the regions of the request's slabs.
func (t *RDMAClient) forget(addrs []Addr) {
	t.slabMu.Lock()
	for _, a := range addrs {
		delete(t.slabs, a.Slab)
	}
	t.slabMu.Unlock()
}

// transfer moves the pages through q's buffer, a buffer's worth at a time.
func (t *RDMAClient) transfer(q *rdmaQP, write bool, addrs []Addr, pages []byte) error {
	timeout := t.cfg.Timeout.Nanoseconds()
	for len(addrs) > 0 {
		n := min(len(addrs), rdmaBufPages)
		var r rdmaRegion
		ok := true
		t.slabMu.RLock()
		for i, a := range addrs[:n] {
			if i == 0 || a.Slab != addrs[i-1].Slab {
				if r, ok = t.slabs[a.Slab]; !ok {
					break
				}
			}
			q.raddr[i] = r.Addr + uint64(a.Page)*PageSize
			q.rkey[i] = r.RKey
		}
		t.slabMu.RUnlock()
		if !ok {
			return errStale
		}
		b := pages[:n*PageSize]
		if write {
			copy(q.q.buf, b)
		}
		if err := q.q.rw(write, n, q.raddr, q.rkey, timeout); err != nil {
			return err
		}
		if !write {
			copy(b, q.q.buf)
		}
		addrs, pages = addrs[n:], pages[n*PageSize:]
	}
	return nil
}

func randomPSN() uint32 { return rand.Uint32() & 0xffffff }
