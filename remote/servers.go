package remote

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/fabric"
)

// servers is the memory servers this session talks to, by instance id.
type servers struct {
	cfg  fabric.DialConfig
	dial func(addr string, cfg fabric.DialConfig) (fabric.Transport, error)

	mu   sync.Mutex
	byID map[string]*server // protected by mu
}

func newServers(cfg fabric.DialConfig, dial func(string, fabric.DialConfig) (fabric.Transport, error)) *servers {
	return &servers{cfg: cfg, dial: dial, byID: map[string]*server{}}
}

// get returns the server with this instance id, creating its entry (not yet dialed).
func (ss *servers) get(id, addr string) *server {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	sv := ss.byID[id]
	if sv == nil {
		sv = &server{ss: ss, id: id, addr: addr}
		ss.byID[id] = sv
	}
	return sv
}

func (ss *servers) close() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for _, sv := range ss.byID {
		sv.mu.Lock()
		if sv.t != nil {
			sv.t.Close()
			sv.t = nil
		}
		sv.mu.Unlock()
	}
}

// server is one memory server.
type server struct {
	ss   *servers
	id   string
	addr string

	mu   sync.Mutex
	t    fabric.Transport // protected by mu; nil until first used
	kind string           // protected by mu; t's transport by name (tcp, shm, rdma), set with t

	// down is set when a request to it could not be made or was not answered (unreachable,
	// timed out, another instance), and cleared when one is answered: a down server is read
	// from last, counted down by Health, and not sent frees. Atomic: every read ranks by it.
	down atomic.Bool

	latency atomic.Int64 // EWMA of a page read, ns
	corrupt atomic.Int64 // pages it returned with a wrong checksum
}

func (sv *server) transport() (fabric.Transport, error) {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	if sv.t != nil {
		return sv.t, nil
	}
	t, err := sv.ss.dial(sv.addr, sv.ss.cfg)
	if err != nil {
		sv.down.Store(true)
		return nil, err
	}
	if t.Instance() != sv.id {
		t.Close()
		sv.down.Store(true)
		return nil, fmt.Errorf("memory server at %s is instance %s, not %s: it restarted and its pages are gone", sv.addr, t.Instance(), sv.id)
	}
	sv.t, sv.kind = t, transportName(t)
	return t, nil
}

// answered records how a request to the server ended and returns err. A refusal
// (fabric.RemoteError: no such slab, full, a bad grant) is an answer: the server is up, and
// what it refused is the caller's to handle (a gone slab is one bad copy, not a bad server).
// Anything else (a timeout, a dropped connection) marks it down.
func (sv *server) answered(err error) error {
	var re *fabric.RemoteError
	switch {
	case err == nil || errors.As(err, &re):
		if sv.down.Load() {
			sv.down.Store(false)
		}
	default:
		sv.down.Store(true)
	}
	return err
}

// transportName is how this server is reached now (tcp, shm, rdma; "" before it is dialed).
func (sv *server) transportName() string {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.kind
}

func (sv *server) isDown() bool { return sv.down.Load() }

func (sv *server) write(addrs []fabric.Addr, data []byte) error {
	t, err := sv.transport()
	if err != nil {
		return err
	}
	return sv.answered(t.Write(addrs, data))
}

// free frees a slab on the server if we are connected to it and it has not failed: best
// effort, the ctrl has the server free it anyway.
func (sv *server) free(slab uint64) {
	sv.mu.Lock()
	t := sv.t
	sv.mu.Unlock()
	if t != nil && !sv.isDown() {
		t.Free(slab)
	}
}

func (sv *server) read(a fabric.Addr, dst []byte, tc *fabric.TraceContext) error {
	addrs := [1]fabric.Addr{a}
	return sv.readMany(addrs[:], dst, tc)
}

// readMany reads the pages at addrs in one request, carrying tc (if not nil) where the
// transport can (tcp; shm and rdma reads make no request for the server to trace). Single-page
// reads (the fault path's) feed the latency the copies are ranked by; a batch's time is not
// comparable to them.
func (sv *server) readMany(addrs []fabric.Addr, dst []byte, tc *fabric.TraceContext) error {
	t, err := sv.transport()
	if err != nil {
		return err
	}
	start := time.Now()
	tr, traced := t.(fabric.TracedReader)
	if tc != nil && traced {
		err = tr.ReadTraced(addrs, dst[:len(addrs)*backend.PageSize], *tc)
	} else {
		err = t.Read(addrs, dst[:len(addrs)*backend.PageSize])
	}
	if sv.answered(err) != nil {
		return err
	}
	if len(addrs) != 1 {
		return nil
	}
	d := time.Since(start).Nanoseconds()
	old := sv.latency.Load()
	if old == 0 {
		old = d
	}
	sv.latency.Store(old + (d-old)/8)
	return nil
}

// sortByPreference orders copies to read from: servers that have not failed first, then the
// fewer corrupt pages, then the lower read latency. Failed ones stay as a last resort: a
// request that timed out once may still be answered. It runs on every backend fault, over a
// handful of copies: an insertion sort, no allocation.
func sortByPreference(order []*server) {
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && preferred(order[j], order[j-1]); j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
}

func preferred(a, b *server) bool {
	if da, db := a.isDown(), b.isDown(); da != db {
		return !da
	}
	if ca, cb := a.corrupt.Load(), b.corrupt.Load(); ca != cb {
		return ca < cb
	}
	return a.latency.Load() < b.latency.Load()
}
