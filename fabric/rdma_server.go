//go:build rdma

package fabric

import (
	"encoding/binary"
	"fmt"
	"sync"
)

// The memory server's side of the rdma transport. A connection that asks for RDMA gets its own
// protection domain; its queue pairs (RDMAConnect) and its session's slab registrations
// (RDMARegister) live in it, so a key handed to one client opens nothing through another
// client's queue pairs. The server's CPU is on the control path only: pages move by the
// clients' one-sided READs and WRITEs.
//
// Lifetimes: a registration holds a reference on its slab (slab.refs), taken before the
// region is registered and dropped after it is deregistered, so a slab's memory is never
// unmapped while the device may still touch it. A registration ends when the slab is freed
// (FreeSlab calls revokeRDMA: whoever frees it, its session or the ctrl through the server) or
// when its connection closes (closeRDMA); queue pairs end with their connection, or when the
// client retires one.
//
// Lock order: Server.connMu -> rdmaConn.mu (revokeRDMA finds every connection's state under
// connMu). Server.mu is never held while either is taken, and never taken under rdmaConn.mu:
// register looks the slab up and takes its reference under Server.mu, drops it, registers and
// records the region under rdmaConn.mu, drops that, and only then checks under Server.mu that
// the slab was not freed meanwhile (FreeSlab deletes the slab from the map before it revokes,
// so either that check sees the slab gone or the revocation sees the region).

// rdmaMaxQPs bounds the queue pairs of one connection.
const rdmaMaxQPs = 64

// rdmaConn is a connection's RDMA state on the server.
type rdmaConn struct {
	dev *verbsDevice
	pd  verbsPD

	mu     sync.Mutex
	closed bool                    // protected by mu
	qps    map[uint32]*verbsQP     // protected by mu; by queue pair number
	mrs    map[uint64]rdmaRegistry // protected by mu; by slab id
}

// rdmaRegistry is one slab's registration on one connection.
type rdmaRegistry struct {
	sl     *slab
	mr     verbsMR
	region rdmaRegion // what the client is told (read from mr when registered: mr may go first)
}

// RDMACompiled says whether this build has the rdma transport.
const RDMACompiled = true

// serveRDMA answers RDMAConnect and RDMARegister.
func (c *serverConn) serveRDMA(h Header) error {
	p, err := c.readPayload(h.Len)
	if err != nil {
		return err
	}
	switch h.Op {
	case OpRDMAConnect:
		in, err := decodeRDMAQPInfo(p)
		if err != nil {
			return err
		}
		r, st, msg := c.rdmaConnect(in)
		if st != StatusOK {
			return c.refuse(h, st, msg)
		}
		var b [rdmaQPInfoSize]byte
		return c.send(Header{Op: h.Op, ID: h.ID}, r.encode(b[:0]))
	case OpRDMARegister:
		if len(p) != 8 {
			return fmt.Errorf("%w: %d-byte rdma register", ErrMalformed, len(p))
		}
		r, st, msg := c.rdmaRegister(binary.LittleEndian.Uint64(p))
		if st != StatusOK {
			return c.refuse(h, st, msg)
		}
		var b [rdmaRegionSize]byte
		return c.send(Header{Op: h.Op, ID: h.ID}, r.encode(b[:0]))
	}
	return fmt.Errorf("%w: unknown op %v", ErrMalformed, h.Op)
}

// rdmaState is the connection's RDMA state, made on first use.
func (c *serverConn) rdmaState() (*rdmaConn, error) {
	c.srv.connMu.Lock()
	r := c.rdma
	c.srv.connMu.Unlock()
	if r != nil {
		return r, nil
	}
	dev, err := openVerbsDevice()
	if err != nil {
		return nil, err
	}
	pd, err := dev.allocPD()
	if err != nil {
		return nil, err
	}
	r = &rdmaConn{dev: dev, pd: pd, qps: map[uint32]*verbsQP{}, mrs: map[uint64]rdmaRegistry{}}
	c.srv.connMu.Lock()
	c.rdma = r // only this connection's goroutine sets it
	c.srv.connMu.Unlock()
	return r, nil
}

// rdmaConnect makes a queue pair connected to the client's.
func (c *serverConn) rdmaConnect(in rdmaQPInfo) (rdmaQPInfo, Status, string) {
	r, err := c.rdmaState()
	if err != nil {
		return rdmaQPInfo{}, StatusUnsupported, "this memory server has no usable RDMA device: " + err.Error()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if q := r.qps[in.Retire]; in.Retire != 0 && q != nil {
		delete(r.qps, in.Retire)
		q.destroy()
	}
	if len(r.qps) >= rdmaMaxQPs {
		return rdmaQPInfo{}, StatusCapacity, fmt.Sprintf("%d rdma queue pairs on one connection already", len(r.qps))
	}
	// A responder only: one work request (none are ever posted), no buffer.
	q, err := r.dev.createQP(r.pd, accessRemote, 1, 0)
	if err != nil {
		return rdmaQPInfo{}, StatusCapacity, err.Error()
	}
	psn := randomPSN()
	if err := r.dev.connect(q, psn, in, r.dev.initDepth()); err != nil {
		q.destroy()
		return rdmaQPInfo{}, StatusUnsupported, err.Error()
	}
	r.qps[q.num()] = q
	return r.dev.info(q, psn, r.dev.respDepth()), StatusOK, ""
}

// rdmaRegister registers a slab of this connection's session, once per connection.
func (c *serverConn) rdmaRegister(id uint64) (rdmaRegion, Status, string) {
	r, err := c.rdmaState()
	if err != nil {
		return rdmaRegion{}, StatusUnsupported, "this memory server has no usable RDMA device: " + err.Error()
	}
	noSlab := fmt.Sprintf("no slab %d for this session", id)
	srv := c.srv
	srv.mu.RLock()
	sl := srv.slabs[id]
	if sl != nil && sl.owner == c.session {
		sl.refs.Add(1) // the registration's reference
	} else {
		sl = nil
	}
	srv.mu.RUnlock()
	if sl == nil {
		return rdmaRegion{}, StatusNoSlab, noSlab
	}

	var reg rdmaRegistry
	for {
		r.mu.Lock()
		old, ok := r.mrs[id]
		if ok && old.sl != sl {
			// A freed slab's registration under the same id, whose revocation is under way:
			// finish it here, then register the new slab.
			r.mu.Unlock()
			r.revoke(old.sl)
			continue
		}
		if r.closed {
			r.mu.Unlock()
			sl.unref()
			return rdmaRegion{}, StatusNoSlab, noSlab
		}
		if ok { // registered already: one registration per connection and slab
			r.mu.Unlock()
			sl.unref()
			reg = old
			break
		}
		mr, err := r.pd.register(sl.mem)
		if err != nil {
			r.mu.Unlock()
			sl.unref()
			return rdmaRegion{}, StatusCapacity, err.Error()
		}
		reg = rdmaRegistry{sl: sl, mr: mr, region: rdmaRegion{Addr: mr.addr(), RKey: mr.rkey(), Pages: sl.pages()}}
		r.mrs[id] = reg
		r.mu.Unlock()
		break
	}

	// Freed meanwhile? FreeSlab deletes from the map before revoking: if the slab is still in the
	// map now, a later FreeSlab will find this registration.
	srv.mu.RLock()
	live := srv.slabs[id] == sl
	srv.mu.RUnlock()
	if !live {
		r.revoke(sl)
		return rdmaRegion{}, StatusNoSlab, noSlab
	}
	return reg.region, StatusOK, ""
}

// revoke deregisters sl on this connection, if registered, and drops the registration's
// reference. Idempotent.
func (r *rdmaConn) revoke(sl *slab) {
	r.mu.Lock()
	reg, ok := r.mrs[sl.id]
	if ok && reg.sl == sl {
		delete(r.mrs, sl.id)
	} else {
		ok = false
	}
	r.mu.Unlock()
	if ok {
		reg.mr.deregister() // the device is done with the memory once this returns
		sl.unref()
	}
}

// revokeRDMA deregisters a slab that leaves the server from every connection's domain. Called by
// FreeSlab after the slab left the map and before the map's reference goes.
func (s *Server) revokeRDMA(sl *slab) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	for c := range s.conns {
		if c.rdma != nil {
			c.rdma.revoke(sl)
		}
	}
}

// closeRDMA ends the connection's RDMA state: its queue pairs, then its registrations (each
// dropping its slab reference), then its protection domain. Called once the connection left
// the server's set, so no revocation can find it after.
func (c *serverConn) closeRDMA() {
	c.srv.connMu.Lock()
	r := c.rdma
	c.srv.connMu.Unlock()
	if r == nil {
		return
	}
	r.mu.Lock()
	r.closed = true
	qps, mrs := r.qps, r.mrs
	r.qps, r.mrs = nil, nil
	r.mu.Unlock()
	for _, q := range qps {
		q.destroy()
	}
	for _, reg := range mrs {
		reg.mr.deregister()
		reg.sl.unref()
	}
	r.pd.free()
}
