package remote

import (
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
	down error            // protected by mu; the failure that made us stop preferring it

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
		sv.down = err
		return nil, err
	}
	if t.Instance() != sv.id {
		t.Close()
		err := fmt.Errorf("memory server at %s is instance %s, not %s: it restarted and its pages are gone", sv.addr, t.Instance(), sv.id)
		sv.down = err
		return nil, err
	}
	sv.t, sv.kind = t, transportName(t)
	return t, nil
}

func (sv *server) failed(err error) error {
	sv.mu.Lock()
	if sv.down == nil {
		sv.down = err
	}
	sv.mu.Unlock()
	return err
}

// transportName is how this server is reached now (tcp, shm, rdma; "" before it is dialed).
func (sv *server) transportName() string {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.kind
}

func (sv *server) isDown() bool {
	sv.mu.Lock()
	defer sv.mu.Unlock()
	return sv.down != nil
}

func (sv *server) write(addrs []fabric.Addr, data []byte) error {
	t, err := sv.transport()
	if err != nil {
		return err
	}
	if err := t.Write(addrs, data); err != nil {
		return sv.failed(err)
	}
	return nil
}

// free frees a slab on the server if we are connected to it and it has not failed: best
// effort, the ctrl has the server free it anyway.
func (sv *server) free(slab uint64) {
	sv.mu.Lock()
	t := sv.t
	if sv.down != nil {
		t = nil
	}
	sv.mu.Unlock()
	if t != nil {
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
	if err != nil {
		return sv.failed(err)
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
