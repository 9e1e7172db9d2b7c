package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Transport is how a runtime reaches one memory server. Every method may be called from many
// goroutines at once; each is one synchronous request (the fault path wants the answer now),
// and concurrency comes from a few connections per server.
type Transport interface {
	// Instance is the server's instance id (what the ctrl's grants name).
	Instance() string
	Create(g *Grant) error
	// Write stores len(addrs) pages from pages (len(addrs)*PageSize bytes).
	Write(addrs []Addr, pages []byte) error
	// Read fills pages (len(addrs)*PageSize bytes) with the pages at addrs.
	Read(addrs []Addr, pages []byte) error
	Free(slab uint64) error
	Close() error
}

// TracedReader is a Transport whose reads can carry the trace context of the client span they
// are part of (FlagTraced), so that the server's span of the read joins the client's trace. Only
// the tcp transport has it: shm and rdma reads make no request the server's CPU serves, so
// there is nothing on the server to trace.
type TracedReader interface {
	ReadTraced(addrs []Addr, pages []byte, tc TraceContext) error
}

// DialConfig says who is calling and how patiently.
type DialConfig struct {
	Token   Token
	Session SessionID
	// Conns is the number of connections kept to the server (default 2): one request each at a
	// time, so it bounds the requests in flight to one server. The tcp transport keeps one more
	// for one-page reads (TCPClient's lane).
	Conns int
	// Timeout bounds connecting and every request (default 2s). A request that times out
	// fails, and the caller tries another replica.
	Timeout time.Duration
	// Spin is how long a request polls for its answer before it sleeps (0: it sleeps at once).
	// Where waking a sleeping thread costs more than the round trip itself (a VM without
	// halt-polling, a CPU other than the server's), polling wins: see results/fabric.md.
	Spin time.Duration
}

func (c *DialConfig) defaults() {
	if c.Conns <= 0 {
		c.Conns = 2
	}
	if c.Timeout <= 0 {
		c.Timeout = 2 * time.Second
	}
}

// TCPClient is the tcp transport: blocking syscalls on raw sockets, one request per connection
// at a time, each request one writev and (usually) one readv.
type TCPClient struct {
	network  string // "tcp"; "unix" for the shm transport's control connections
	addr     string
	cfg      DialConfig
	instance string
	pool     chan *clientConn // Conns entries; nil: to be dialed on next use
	// lane is one more connection, for one-page reads (a fault's; tcp only, else nil): such a
	// read never waits for a pooled connection busy with an eviction batch's write or a
	// prefetch batch, and the server's thread for it, serving little else, is usually still
	// polling (ServerConfig.Spin) when the next fault's read comes, rather than asleep. A
	// one-page read takes a pooled connection only while the lane is busy. One entry; nil: to
	// be dialed on next use.
	lane chan *clientConn
}

// DialTCP connects to the memory server at addr and authenticates. Its errors say what is wrong
// in a user's terms: unreachable, another protocol version, a wrong token.
func DialTCP(addr string, cfg DialConfig) (*TCPClient, error) {
	return dialPool("tcp", addr, cfg)
}

// dialPool makes a pool of connections to a server on a stream socket and dials the first.
func dialPool(network, addr string, cfg DialConfig) (*TCPClient, error) {
	cfg.defaults()
	t := &TCPClient{network: network, addr: addr, cfg: cfg, pool: make(chan *clientConn, cfg.Conns)}
	c, err := t.dial()
	if err != nil {
		return nil, err
	}
	t.instance = c.instance
	t.pool <- c
	for i := 1; i < cfg.Conns; i++ {
		t.pool <- nil
	}
	if network == "tcp" {
		t.lane = make(chan *clientConn, 1)
		t.lane <- nil
	}
	return t, nil
}

// Instance implements Transport.
func (t *TCPClient) Instance() string { return t.instance }

// Addr is the server's address.
func (t *TCPClient) Addr() string { return t.addr }

// Close implements Transport.
func (t *TCPClient) Close() error {
	for i := 0; i < t.cfg.Conns; i++ {
		if c := <-t.pool; c != nil {
			c.file.Close()
		}
	}
	if t.lane != nil {
		if c := <-t.lane; c != nil {
			c.file.Close()
		}
	}
	return nil
}

// clientConn is one authenticated connection.
type clientConn struct {
	rawConn
	file     *os.File
	instance string
	id       uint64
	hdr      [HeaderSize]byte
	rhdr     [HeaderSize]byte
	addrs    []byte // MaxPages*AddrSize
	tc       [TraceContextSize]byte
	bufs     [][]byte
}

func (t *TCPClient) dial() (*clientConn, error) {
	nc, err := net.DialTimeout(t.network, t.addr, t.cfg.Timeout)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the memory server at %s: %w", t.addr, err)
	}
	f, err := blockingFile(nc)
	if err != nil {
		return nil, err
	}
	c := &clientConn{file: f}
	c.fd = int(f.Fd())
	if t.network == "tcp" {
		c.addrs = make([]byte, MaxPages*AddrSize)
		unix.SetsockoptInt(c.fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	}
	if err := c.setTimeout(t.cfg.Timeout); err != nil {
		f.Close()
		return nil, err
	}
	c.spin = t.cfg.Spin
	if err := c.handshake(t.addr, t.cfg); err != nil {
		f.Close()
		return nil, err
	}
	return c, nil
}

func (c *clientConn) handshake(addr string, cfg DialConfig) error {
	if err := c.readFull(c.rhdr[:]); err != nil {
		return fmt.Errorf("memory server at %s: no challenge: %w", addr, err)
	}
	h, err := ParseHeader(c.rhdr[:])
	if err != nil || h.Op != OpChallenge {
		return fmt.Errorf("%s does not speak the farmem fabric protocol (is it a memory server?): %v", addr, err)
	}
	p := make([]byte, h.Len)
	if err := c.readFull(p); err != nil {
		return fmt.Errorf("memory server at %s: %w", addr, err)
	}
	ch, err := decodeChallenge(p)
	if err != nil {
		return fmt.Errorf("memory server at %s: %w", addr, err)
	}
	if ch.Version != Version {
		return fmt.Errorf("the memory server at %s speaks fabric protocol v%d, this farmem speaks v%d: run the same farmem version on both", addr, ch.Version, Version)
	}
	c.instance = ch.Instance
	hl := hello{Version: Version, Session: cfg.Session, MAC: helloMAC(cfg.Token, ch.Nonce, cfg.Session, ch.Instance)}
	if err := c.call(OpHello, 0, [][]byte{hl.encode(nil)}, nil); err != nil {
		var re *RemoteError
		if errors.As(err, &re) && re.Status == StatusAuth {
			return fmt.Errorf("the memory server at %s refused the cluster token: --token-file must be the same file on ctrl, memory servers and clients", addr)
		}
		return fmt.Errorf("memory server at %s: %w", addr, err)
	}
	return nil
}

// call sends one request (header plus payload buffers) and reads its answer into dst, which
// must be exactly the size of a successful answer's payload.
func (c *clientConn) call(op Op, count int, payload [][]byte, dst []byte) error {
	return c.callFlags(op, 0, count, payload, dst)
}

// callFlags is call with header flags (FlagTraced: payload begins with the trace context).
func (c *clientConn) callFlags(op Op, flags uint32, count int, payload [][]byte, dst []byte) error {
	c.id++
	n := 0
	for _, b := range payload {
		n += len(b)
	}
	(&Header{Op: op, Flags: flags, Count: uint32(count), ID: c.id, Len: uint32(n)}).Put(c.hdr[:])
	c.bufs = append(append(c.bufs[:0], c.hdr[:]), payload...)
	if err := c.writev(c.bufs); err != nil {
		return err
	}
	return c.recv(op, dst)
}

// recv reads an answer. One readv into [header, dst] usually takes all of it; the answer is
// the only data in flight on the connection, so a short read never takes another's bytes.
func (c *clientConn) recv(op Op, dst []byte) error {
	got := 0
	for got < HeaderSize {
		n, err := c.readvOnce(c.rhdr[got:], dst[max(got-HeaderSize, 0):])
		if err != nil {
			return err
		}
		got += n
	}
	h, err := ParseHeader(c.rhdr[:])
	if err != nil {
		return err
	}
	if h.ID != c.id || h.Op != op {
		return fmt.Errorf("%w: answer %v #%d to request %v #%d", ErrMalformed, h.Op, h.ID, op, c.id)
	}
	if h.Flags != 0 {
		return fmt.Errorf("%w: %v answer with flags %#x (only requests carry a trace context)", ErrMalformed, op, h.Flags)
	}
	have := got - HeaderSize
	if h.Status != StatusOK {
		msg := make([]byte, h.Len)
		copy(msg, dst[:min(have, len(dst))])
		if err := c.readFull(msg[min(have, len(msg)):]); err != nil {
			return err
		}
		return &RemoteError{Op: op, Status: h.Status, Message: string(msg)}
	}
	if int(h.Len) != len(dst) {
		return fmt.Errorf("%w: %v answer of %d bytes, want %d", ErrMalformed, op, h.Len, len(dst))
	}
	return c.readFull(dst[have:])
}

// readvOnce is one readv into a and b: whatever has arrived, at least one byte. With c.spin set
// it first polls for up to that long (see rawConn.spin) before it sleeps in readv.
func (c *rawConn) readvOnce(a, b []byte) (int, error) {
	c.iovs = c.iovs[:0]
	for _, p := range [2][]byte{a, b} {
		if len(p) > 0 {
			c.iovs = append(c.iovs, unix.Iovec{Base: &p[0], Len: uint64(len(p))})
		}
	}
	if c.spin > 0 {
		if n, err := c.poll(); n != 0 || err != nil {
			return n, err
		}
	}
	for {
		n, _, e := unix.Syscall(unix.SYS_READV, uintptr(c.fd), uintptr(unsafe.Pointer(&c.iovs[0])), uintptr(len(c.iovs)))
		switch {
		case e == unix.EINTR:
			continue
		case e != 0:
			return 0, e
		case n == 0:
			return 0, io.ErrUnexpectedEOF
		}
		return int(n), nil
	}
}

// poll tries non-blocking receives into c.iovs, yielding the CPU between tries, for up to
// c.spin: (0, nil) if nothing arrived by then.
func (c *rawConn) poll() (int, error) {
	c.msg.Iov = &c.iovs[0]
	c.msg.SetIovlen(len(c.iovs))
	start := time.Now()
	for {
		n, _, e := unix.Syscall(unix.SYS_RECVMSG, uintptr(c.fd), uintptr(unsafe.Pointer(&c.msg)), unix.MSG_DONTWAIT)
		switch {
		case e == 0 && n == 0:
			return 0, io.ErrUnexpectedEOF
		case e == 0:
			return int(n), nil
		case e != unix.EAGAIN && e != unix.EINTR:
			return 0, e
		}
		if time.Since(start) >= c.spin {
			return 0, nil
		}
		// Whatever else wants this CPU runs first: the peer itself, if it shares the CPU.
		unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
	}
}

// do runs f on a pooled connection, dialing it if needed. A connection that failed is closed
// and its place redialed on a later call.
func (t *TCPClient) do(f func(c *clientConn) error) error {
	return t.doOn(false, f)
}

// doOn is do, on the lane if onePage and the lane is free (see TCPClient.lane).
func (t *TCPClient) doOn(onePage bool, f func(c *clientConn) error) error {
	var c *clientConn
	from := t.pool
	switch {
	case !onePage || t.lane == nil:
		c = <-t.pool
	default:
		select {
		case c = <-t.lane:
			from = t.lane
		default:
			select {
			case c = <-t.lane:
				from = t.lane
			case c = <-t.pool:
			}
		}
	}
	if c == nil {
		var err error
		if c, err = t.dial(); err != nil {
			from <- nil
			return err
		}
	}
	err := f(c)
	var re *RemoteError
	if err != nil && !errors.As(err, &re) {
		c.file.Close()
		from <- nil
		if err == unix.EAGAIN {
			return fmt.Errorf("the memory server at %s did not answer within %v", t.addr, t.cfg.Timeout)
		}
		return fmt.Errorf("memory server at %s: %w", t.addr, err)
	}
	from <- c
	return err
}

// Create implements Transport.
func (t *TCPClient) Create(g *Grant) error {
	return t.do(func(c *clientConn) error {
		return c.call(OpCreate, 0, [][]byte{encodeGrant(nil, g)}, nil)
	})
}

// Free implements Transport.
func (t *TCPClient) Free(slab uint64) error {
	return t.do(func(c *clientConn) error {
		var b [8]byte
		binary.LittleEndian.PutUint64(b[:], slab)
		return c.call(OpFree, 0, [][]byte{b[:]}, nil)
	})
}

// Write implements Transport.
func (t *TCPClient) Write(addrs []Addr, pages []byte) error {
	return t.transfer(OpWrite, addrs, pages, nil)
}

// Read implements Transport.
func (t *TCPClient) Read(addrs []Addr, pages []byte) error {
	return t.transfer(OpRead, addrs, pages, nil)
}

// ReadTraced implements TracedReader: Read, each request carrying tc (a request per MaxPages
// pages, so the server makes a span for each, all children of tc's span).
func (t *TCPClient) ReadTraced(addrs []Addr, pages []byte, tc TraceContext) error {
	return t.transfer(OpRead, addrs, pages, &tc)
}

// WriteTraced is Write with each request carrying tc, as ReadTraced.
func (t *TCPClient) WriteTraced(addrs []Addr, pages []byte, tc TraceContext) error {
	return t.transfer(OpWrite, addrs, pages, &tc)
}

// transfer moves pages in requests of at most MaxPages: a Write's pages follow its addresses,
// a Read's come back as the answer. tc, if not nil, is sent before the addresses (FlagTraced).
func (t *TCPClient) transfer(op Op, addrs []Addr, pages []byte, tc *TraceContext) error {
	if err := checkPages(addrs, pages); err != nil {
		return err
	}
	if tc != nil && !tc.Valid() {
		return fmt.Errorf("fabric: %v with a zero trace context", op)
	}
	return t.doOn(op == OpRead && len(addrs) == 1, func(c *clientConn) error {
		var flags uint32
		if tc != nil {
			tc.put(c.tc[:])
			flags = FlagTraced
		}
		for len(addrs) > 0 {
			n := min(len(addrs), MaxPages)
			a := c.addrs[:n*AddrSize]
			PutAddrs(a, addrs[:n])
			var err error
			switch {
			case op == OpWrite && tc != nil:
				err = c.callFlags(op, flags, n, [][]byte{c.tc[:], a, pages[:n*PageSize]}, nil)
			case op == OpWrite:
				err = c.call(op, n, [][]byte{a, pages[:n*PageSize]}, nil)
			case tc != nil:
				err = c.callFlags(op, flags, n, [][]byte{c.tc[:], a}, pages[:n*PageSize])
			default:
				err = c.call(op, n, [][]byte{a}, pages[:n*PageSize])
			}
			if err != nil {
				return err
			}
			addrs, pages = addrs[n:], pages[n*PageSize:]
		}
		return nil
	})
}

func checkPages(addrs []Addr, pages []byte) error {
	if len(pages) != len(addrs)*PageSize {
		return fmt.Errorf("fabric: %d addresses for %d bytes of pages", len(addrs), len(pages))
	}
	return nil
}
