package fabric

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Server is a memory server: it holds slabs for client sessions and serves their pages.
//
// Lock order: Server.mu, then nothing. mu guards the slab map only: a request takes a reference
// on each slab it touches under the read lock and does its I/O after dropping it, so that a
// slow or stalled client never holds up another's creates and frees. A slab's memory goes when
// its last reference does (slab.unref). The rdma transport adds connMu -> rdmaConn.mu, taken
// by FreeSlab after it dropped mu (rdma_server.go).
type Server struct {
	token    Token
	instance string
	capacity int64 // pages
	logf     func(format string, args ...any)
	spin     time.Duration
	trace    func(*TracedRequest)

	mu    sync.RWMutex
	slabs map[uint64]*slab // protected by mu
	used  atomic.Int64     // pages of all slabs; written under mu's write lock

	connMu sync.Mutex
	conns  map[*serverConn]bool // protected by connMu
	lns    []net.Listener       // protected by connMu
	closed bool                 // protected by connMu
	active sync.WaitGroup       // connection goroutines; Close waits for them
}

// ServerConfig configures a memory server.
type ServerConfig struct {
	Token         Token
	CapacityPages int64
	// Logf reports connection-level trouble (refused peers, malformed frames); nil: discard.
	Logf func(format string, args ...any)
	// Spin is how long a connection polls for the client's next request after answering one,
	// before it sleeps (0: it sleeps at once); see DialConfig.Spin. With Spin set, the process's
	// GOMAXPROCS grows with the connections (procsForPollers).
	Spin time.Duration
	// Trace, if set, is told of every traced request (FlagTraced: tcp Reads and Writes of a
	// client's sampled faults) once it is answered, on the connection's goroutine: it must be
	// quick (hand the record on) and must not keep the pointer. This is the whole of tracing in
	// this package: the spans are made by the caller (package telemetry), so that fabric, under
	// everything else, does not depend on OpenTelemetry.
	Trace func(r *TracedRequest)
}

// TracedRequest is one traced request as the server served it.
type TracedRequest struct {
	Context    TraceContext // the client's span the request is part of: the parent
	Op         Op           // OpRead or OpWrite
	Session    SessionID
	Peer       string
	Start, End time.Time // from its header read to its answer written
	Pages      int
	Slab       uint64 // the first page's slab (0 for no pages)
	Slabs      int    // its runs of pages in one slab: the slabs it touched, as clients group them (0 if refused)
	Status     Status // StatusOK, or why it was refused
	Message    string // the refusal's message
	Err        error  // the connection failed while serving it (the client may not have the answer)
}

// handshakeTimeout bounds how long a connection may take to authenticate.
const handshakeTimeout = 10 * time.Second

// NewServer returns a memory server with a fresh instance id.
func NewServer(cfg ServerConfig) *Server {
	var id [8]byte
	rand.Read(id[:])
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Server{token: cfg.Token, instance: hex.EncodeToString(id[:]), capacity: cfg.CapacityPages,
		logf: logf, spin: cfg.Spin, trace: cfg.Trace, slabs: map[uint64]*slab{}, conns: map[*serverConn]bool{}}
}

// Instance is this server process's id: the ctrl's grants name it, so a restarted server (a new
// instance, its memory gone) cannot be handed slabs that lived in its predecessor.
func (s *Server) Instance() string { return s.instance }

// CapacityPages and UsedPages are what the server reports to the ctrl.
func (s *Server) CapacityPages() int64 { return s.capacity }
func (s *Server) UsedPages() int64     { return s.used.Load() }

// Slabs lists the slabs held.
func (s *Server) Slabs() []uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]uint64, 0, len(s.slabs))
	for id := range s.slabs {
		out = append(out, id)
	}
	return out
}

// FreeSlab drops a slab whatever its owner (the ctrl says it is no longer placed here).
func (s *Server) FreeSlab(id uint64) {
	s.mu.Lock()
	sl := s.slabs[id]
	if sl != nil {
		delete(s.slabs, id)
		s.used.Add(-int64(sl.pages()))
	}
	s.mu.Unlock()
	if sl != nil {
		s.revokeRDMA(sl) // deregisters it from the device before its memory can go
		sl.unref()
	}
}

// Serve accepts connections on ln until Close: a tcp listener (the tcp transport) or a unix
// socket listener (the shm transport: the same protocol plus Map, which hands a session its
// slabs' memfds). A server may serve several listeners at once.
func (s *Server) Serve(ln net.Listener) error {
	s.connMu.Lock()
	if s.closed {
		s.connMu.Unlock()
		return net.ErrClosed
	}
	s.lns = append(s.lns, ln)
	s.connMu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.connMu.Lock()
			closed := s.closed
			s.connMu.Unlock()
			if closed {
				return nil
			}
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				continue
			}
			return err
		}
		sc := &serverConn{srv: s, peer: c.RemoteAddr().String()}
		if uc, ok := c.(*net.UnixConn); ok {
			sc.unix = true
			sc.peer = "unix socket " + uc.LocalAddr().String()
		}
		sc.file, err = blockingFile(c)
		if err != nil {
			s.logf("fabric: accept: %v", err)
			continue
		}
		sc.fd = int(sc.file.Fd())
		if !sc.unix {
			unix.SetsockoptInt(sc.fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
		}
		s.connMu.Lock()
		if s.closed {
			s.connMu.Unlock()
			sc.file.Close()
			return nil
		}
		s.conns[sc] = true
		s.active.Add(1)
		if s.spin > 0 {
			procsForPollers(len(s.conns))
		}
		s.connMu.Unlock()
		go sc.run()
	}
}

// procsForPollers gives the process a Go scheduler slot (a P) per connection beyond one per
// CPU. A connection polling for its next request (ServerConfig.Spin) holds its P throughout:
// with no more Ps than pollers, a connection woken from a blocking read by a request would
// wait for a poller's spin to end before it could answer it. The number only grows (a change
// stops the world), and an idle P costs next to nothing.
func procsForPollers(conns int) {
	if want := runtime.NumCPU() + conns; runtime.GOMAXPROCS(0) < want {
		runtime.GOMAXPROCS(want)
	}
}

// Close stops accepting, shuts every connection, waits for their goroutines and frees every
// slab.
func (s *Server) Close() error {
	s.connMu.Lock()
	s.closed = true
	for _, ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		unix.Shutdown(c.fd, unix.SHUT_RDWR) // wakes its blocked read; run closes the file
	}
	s.connMu.Unlock()
	s.active.Wait()
	for _, id := range s.Slabs() {
		s.FreeSlab(id)
	}
	return nil
}

// serverConn is one client connection, served by one goroutine with blocking syscalls.
type serverConn struct {
	rawConn
	srv     *Server
	file    *os.File
	peer    string
	unix    bool      // a unix socket: Map is served
	rdma    *rdmaConn // the rdma transport's state (rdma_server.go); set under srv.connMu
	session SessionID

	hdr     [HeaderSize]byte
	payload []byte        // requests' addresses and control payloads
	bufs    [][]byte      // scratch for vectored I/O
	scratch []byte        // where the pages of a refused write go
	held    []*slab       // slabs the current request holds references on
	traced  TracedRequest // the traced request being served, for Server.trace
}

func (c *serverConn) run() {
	defer func() {
		if r := recover(); r != nil {
			// A bug, not the peer's fault alone; the connection goes, the server stays.
			c.srv.logf("fabric: connection from %s: internal error: %v\n%s", c.peer, r, debug.Stack())
		}
		c.srv.connMu.Lock()
		delete(c.srv.conns, c)
		c.srv.connMu.Unlock()
		c.closeRDMA()
		c.file.Close()
		c.srv.active.Done()
	}()
	if err := c.handshake(); err != nil {
		c.srv.logf("fabric: refused %s: %v", c.peer, err)
		return
	}
	if err := c.loop(); err != nil {
		c.srv.logf("fabric: closing %s: %v", c.peer, err)
	}
}

// loop serves requests until the peer goes (nil) or sends something that ends the connection.
func (c *serverConn) loop() error {
	for {
		n, err := c.readvOnce(c.hdr[:], nil) // polls first, with spin set
		if err == nil {
			err = c.readFull(c.hdr[n:])
		}
		if err != nil {
			if err == io.ErrUnexpectedEOF || err == unix.ECONNRESET {
				return nil
			}
			return err
		}
		h, err := ParseHeader(c.hdr[:])
		if err == nil {
			err = c.serve(h)
		}
		if err != nil {
			return err
		}
	}
}

// handshake sends the challenge and checks the hello.
func (c *serverConn) handshake() error {
	c.setTimeout(handshakeTimeout)
	ch := challenge{Version: Version, Instance: c.srv.instance}
	rand.Read(ch.Nonce[:])
	if err := c.send(Header{Op: OpChallenge}, ch.encode()); err != nil {
		return err
	}
	if err := c.readFull(c.hdr[:]); err != nil {
		return err
	}
	h, err := ParseHeader(c.hdr[:])
	if err != nil {
		return err
	}
	if h.Op != OpHello {
		return fmt.Errorf("%w: %v before hello", ErrMalformed, h.Op)
	}
	p, err := c.readPayload(h.Len)
	if err != nil {
		return err
	}
	hl, err := decodeHello(p)
	if err != nil {
		return err
	}
	if hl.Version != Version {
		msg := fmt.Sprintf("this memory server speaks fabric protocol v%d, the client v%d", Version, hl.Version)
		c.refuse(h, StatusVersion, msg)
		return errors.New(msg)
	}
	if want := helloMAC(c.srv.token, ch.Nonce, hl.Session, c.srv.instance); subtle.ConstantTimeCompare(want[:], hl.MAC[:]) != 1 {
		c.refuse(h, StatusAuth, "wrong cluster token: --token-file must be the same file on ctrl, memory servers and clients")
		return errors.New("wrong cluster token")
	}
	c.session = hl.Session
	c.setTimeout(0)
	c.spin = c.srv.spin
	return c.send(Header{Op: OpHello, ID: h.ID}, nil)
}

func (c *serverConn) readPayload(n uint32) ([]byte, error) {
	if cap(c.payload) < int(n) {
		c.payload = make([]byte, n)
	}
	p := c.payload[:n]
	return p, c.readFull(p)
}

// send writes one frame.
func (c *serverConn) send(h Header, payload []byte) error {
	h.Len = uint32(len(payload))
	h.Put(c.hdr[:])
	c.bufs = append(c.bufs[:0], c.hdr[:], payload)
	return c.writev(c.bufs)
}

// refuse answers a request with an error status.
func (c *serverConn) refuse(req Header, st Status, msg string) error {
	if len(msg) > maxControlPayload {
		msg = msg[:maxControlPayload]
	}
	if req.Flags&FlagTraced != 0 {
		c.traced.Status, c.traced.Message = st, msg
	}
	return c.send(Header{Op: req.Op, Status: st, ID: req.ID}, []byte(msg))
}

// serve answers one request. An error return closes the connection: the stream can no longer be
// trusted (or written).
func (c *serverConn) serve(h Header) error {
	if h.Status != StatusOK {
		return fmt.Errorf("%w: a request with status %d", ErrMalformed, h.Status)
	}
	var start time.Time
	if h.Flags&FlagTraced != 0 && c.srv.trace != nil { // an untraced request reads no clock
		start = time.Now()
	}
	switch h.Op {
	case OpCreate:
		p, err := c.readPayload(h.Len)
		if err != nil {
			return err
		}
		g, err := decodeGrant(p)
		if err != nil {
			return err
		}
		if st, msg := c.srv.create(&g, c.session); st != StatusOK {
			return c.refuse(h, st, msg)
		}
		return c.send(Header{Op: h.Op, ID: h.ID}, nil)
	case OpFree:
		p, err := c.readPayload(h.Len)
		if err != nil {
			return err
		}
		if len(p) != 8 {
			return fmt.Errorf("%w: %d-byte free", ErrMalformed, len(p))
		}
		if st, msg := c.srv.free(binary.LittleEndian.Uint64(p), c.session); st != StatusOK {
			return c.refuse(h, st, msg)
		}
		return c.send(Header{Op: h.Op, ID: h.ID}, nil)
	case OpRead:
		if h.Len != traceContextLen(h)+h.Count*AddrSize {
			return fmt.Errorf("%w: read of %d pages with %d bytes of addresses", ErrMalformed, h.Count, h.Len)
		}
		p, err := c.readPayload(h.Len)
		if err != nil {
			return err
		}
		if h.Flags&FlagTraced != 0 {
			return c.serveTraced(h, p, start)
		}
		return c.read(h, p)
	case OpMap:
		if !c.unix {
			return fmt.Errorf("%w: map over a socket that cannot pass a memfd", ErrMalformed)
		}
		p, err := c.readPayload(h.Len)
		if err != nil {
			return err
		}
		if len(p) != 8 {
			return fmt.Errorf("%w: %d-byte map", ErrMalformed, len(p))
		}
		return c.mapSlab(h, binary.LittleEndian.Uint64(p))
	case OpRDMAConnect, OpRDMARegister:
		return c.serveRDMA(h) // rdma_server.go; rdma_stub.go refuses them
	case OpWrite:
		if h.Len != traceContextLen(h)+h.Count*(AddrSize+PageSize) {
			return fmt.Errorf("%w: write of %d pages with %d bytes", ErrMalformed, h.Count, h.Len)
		}
		p, err := c.readPayload(traceContextLen(h) + h.Count*AddrSize)
		if err != nil {
			return err
		}
		if h.Flags&FlagTraced != 0 {
			return c.serveTraced(h, p, start)
		}
		return c.write(h, p)
	}
	return fmt.Errorf("%w: unknown op %v", ErrMalformed, h.Op)
}

// traceContextLen is the length of h's trace context: TraceContextSize if it has one.
func traceContextLen(h Header) uint32 {
	if h.Flags&FlagTraced != 0 {
		return TraceContextSize
	}
	return 0
}

// serveTraced serves a traced Read or Write whose payload p (trace context and addresses) has
// been read, and tells Server.trace how it went. start is when its header was read.
func (c *serverConn) serveTraced(h Header, p []byte, start time.Time) error {
	tc, err := parseTraceContext(p)
	if err != nil {
		return err
	}
	addrs := p[TraceContextSize:]
	c.traced = TracedRequest{Context: tc, Op: h.Op, Session: c.session, Peer: c.peer, Start: start, Pages: int(h.Count)}
	if h.Count > 0 {
		c.traced.Slab = addrAt(addrs, 0).Slab
	}
	if h.Op == OpRead {
		err = c.read(h, addrs)
	} else {
		err = c.write(h, addrs)
	}
	if c.srv.trace != nil {
		c.traced.End, c.traced.Err = time.Now(), err
		c.srv.trace(&c.traced)
	}
	return err
}

// acquire resolves the request's addresses to pages, for this session only, taking a reference
// on every slab involved (release drops them). On refusal it holds nothing.
func (c *serverConn) acquire(h Header, addrs []byte) (Status, string) {
	c.srv.mu.RLock()
	defer c.srv.mu.RUnlock()
	c.held = c.held[:0]
	var last *slab
	for i := 0; i < int(h.Count); i++ {
		a := addrAt(addrs, i)
		sl := last
		if sl == nil || sl.id != a.Slab {
			sl = c.srv.slabs[a.Slab]
			if sl == nil || sl.owner != c.session {
				c.release()
				return StatusNoSlab, fmt.Sprintf("no slab %d for this session", a.Slab)
			}
			sl.refs.Add(1)
			c.held = append(c.held, sl)
			last = sl
		}
		if a.Page >= sl.pages() {
			c.release()
			return StatusRange, fmt.Sprintf("page %d is beyond slab %d's %d pages", a.Page, a.Slab, sl.pages())
		}
		c.bufs = append(c.bufs, sl.page(a.Page))
	}
	if h.Flags&FlagTraced != 0 {
		c.traced.Slabs = len(c.held)
	}
	return StatusOK, ""
}

func (c *serverConn) release() {
	for _, sl := range c.held {
		sl.unref()
	}
	c.held = c.held[:0]
}

// read answers with the pages straight from slab memory (one writev, no copy in between).
func (c *serverConn) read(h Header, addrs []byte) error {
	c.hdr = [HeaderSize]byte{}
	c.bufs = append(c.bufs[:0], c.hdr[:])
	if st, msg := c.acquire(h, addrs); st != StatusOK {
		return c.refuse(h, st, msg)
	}
	defer c.release()
	(&Header{Op: h.Op, Count: h.Count, ID: h.ID, Len: h.Count * PageSize}).Put(c.hdr[:])
	return c.writev(c.bufs)
}

// write reads the pages straight into slab memory once every address checks out; otherwise it
// reads them into scratch (the stream must stay in step) and refuses.
func (c *serverConn) write(h Header, addrs []byte) error {
	c.bufs = c.bufs[:0]
	if st, msg := c.acquire(h, addrs); st != StatusOK {
		if c.scratch == nil {
			c.scratch = make([]byte, PageSize)
		}
		c.bufs = c.bufs[:0]
		for i := 0; i < int(h.Count); i++ {
			c.bufs = append(c.bufs, c.scratch)
		}
		if err := c.readv(c.bufs); err != nil {
			return err
		}
		return c.refuse(h, st, msg)
	}
	err := c.readv(c.bufs)
	c.release()
	if err != nil {
		return err
	}
	return c.send(Header{Op: h.Op, Count: h.Count, ID: h.ID}, nil)
}

// mapSlab answers a Map: the slab's size and, as SCM_RIGHTS, its memfd; the session's own slabs
// only.
func (c *serverConn) mapSlab(h Header, id uint64) error {
	c.srv.mu.RLock()
	sl := c.srv.slabs[id]
	if sl != nil && sl.owner == c.session {
		sl.refs.Add(1) // the fd stays open until it has been sent
	} else {
		sl = nil
	}
	c.srv.mu.RUnlock()
	if sl == nil {
		return c.refuse(h, StatusNoSlab, fmt.Sprintf("no slab %d for this session", id))
	}
	defer sl.unref()
	var b [HeaderSize + 4]byte
	(&Header{Op: h.Op, ID: h.ID, Len: 4}).Put(b[:])
	binary.LittleEndian.PutUint32(b[HeaderSize:], sl.pages())
	return c.sendFD(b[:], sl.fd)
}

// create makes the slab g allows, for session s.
func (s *Server) create(g *Grant, sess SessionID) (Status, string) {
	if !s.token.Valid(g) {
		return StatusBadGrant, "the grant is not signed by this cluster's ctrl"
	}
	if g.Server != s.instance {
		return StatusBadGrant, fmt.Sprintf("the grant is for memory server %s, this is %s", g.Server, s.instance)
	}
	if g.Session != sess {
		return StatusBadGrant, "the grant is for another session"
	}
	if g.Pages == 0 || g.Pages > 1<<26 {
		return StatusBadGrant, fmt.Sprintf("a slab of %d pages", g.Pages)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sl := s.slabs[g.Slab]; sl != nil {
		if sl.owner == sess && sl.pages() == g.Pages {
			return StatusOK, "" // a retried create
		}
		return StatusBadGrant, fmt.Sprintf("slab %d exists already", g.Slab)
	}
	if s.used.Load()+int64(g.Pages) > s.capacity {
		return StatusCapacity, fmt.Sprintf("full: %d of %d pages used, %d asked", s.used.Load(), s.capacity, g.Pages)
	}
	sl, err := newSlab(g.Slab, sess, g.Pages)
	if err != nil {
		return StatusCapacity, err.Error()
	}
	s.slabs[g.Slab] = sl
	s.used.Add(int64(g.Pages))
	return StatusOK, ""
}

// free drops a slab of session sess.
func (s *Server) free(id uint64, sess SessionID) (Status, string) {
	s.mu.RLock()
	sl := s.slabs[id]
	s.mu.RUnlock()
	if sl == nil || sl.owner != sess {
		return StatusNoSlab, fmt.Sprintf("no slab %d for this session", id)
	}
	s.FreeSlab(id)
	return StatusOK, ""
}
