package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// SHMClient is the shm transport, for a memory server on this host: one-sided, with no server
// CPU on the data path. It speaks the protocol over the server's unix socket for control only
// (the same handshake; Create and Free as over tcp, grant-checked the same way) and asks for
// each slab's memfd with Map; it maps the memfd shared, and Read and Write are memcpy out of and
// into that mapping: no syscall, no message, per page.
//
// Ownership is the server's, as over tcp: only the session's own slabs can be mapped, and a
// page of any other slab is refused with StatusNoSlab; a page beyond a slab's end with
// StatusRange; a refused Write writes nothing.
//
// Lifetime: a mapped slab's memory lives until this client unmaps it (Free, Close), even if the
// server frees the slab meanwhile (the ctrl said so, or the server closed or died): a memfd's
// pages belong to the file, which lives while anyone maps it. Such a slab no longer counts in
// the server's UsedPages. That is expected; what the client must not do is keep using a server
// that is gone, so the client watches one idle connection to the server, and once it closes
// (the server exited or was killed) every call fails, exactly as a tcp connection that reset.
type SHMClient struct {
	ctl   *TCPClient // control connections on the unix socket
	path  string
	watch net.Conn
	gone  atomic.Pointer[error] // set once the server is gone, or the client closed

	mu    sync.RWMutex      // readers copy pages; the write lock changes slabs
	slabs map[uint64][]byte // protected by mu; mapped slabs
}

// DialSHM connects to the memory server's unix socket at path (what `farmem memserver --shm`
// serves) and authenticates. Its errors say what is wrong in a user's terms, like DialTCP's.
func DialSHM(path string, cfg DialConfig) (*SHMClient, error) {
	ctl, err := dialPool("unix", path, cfg)
	if err != nil {
		return nil, err
	}
	wc, err := ctl.dial()
	if err != nil {
		ctl.Close()
		return nil, err
	}
	watch, err := net.FileConn(wc.file) // a dup in the runtime's poller: no thread waits on it
	wc.file.Close()
	if err != nil {
		ctl.Close()
		return nil, err
	}
	t := &SHMClient{ctl: ctl, path: path, watch: watch, slabs: map[uint64][]byte{}}
	go t.watchServer()
	return t, nil
}

// watchServer waits on an idle connection: the server sends nothing on it unasked, so a read
// returns only when the connection closes.
func (t *SHMClient) watchServer() {
	var b [1]byte
	_, err := t.watch.Read(b[:])
	gone := fmt.Errorf("the memory server at %s is gone (its connection closed: %v)", t.path, err)
	t.gone.CompareAndSwap(nil, &gone)
}

// Instance implements Transport.
func (t *SHMClient) Instance() string { return t.ctl.instance }

// Path is the server's unix socket.
func (t *SHMClient) Path() string { return t.path }

// Close implements Transport: it unmaps every slab (the server keeps them: Free them first to
// give them up).
func (t *SHMClient) Close() error {
	closed := errors.New("fabric: the shm transport is closed")
	t.gone.Store(&closed)
	t.watch.Close()
	t.mu.Lock()
	for id, mem := range t.slabs {
		unix.Munmap(mem)
		delete(t.slabs, id)
	}
	t.mu.Unlock()
	return t.ctl.Close()
}

func (t *SHMClient) err() error {
	if e := t.gone.Load(); e != nil {
		return *e
	}
	return nil
}

// Create implements Transport: the server creates the slab against the grant, then this client
// maps it.
func (t *SHMClient) Create(g *Grant) error {
	if err := t.err(); err != nil {
		return err
	}
	if err := t.ctl.Create(g); err != nil {
		return err
	}
	return t.mapSlab(OpCreate, g.Slab)
}

// Free implements Transport: unmap, then tell the server.
func (t *SHMClient) Free(slab uint64) error {
	if err := t.err(); err != nil {
		return err
	}
	t.mu.Lock()
	mem := t.slabs[slab]
	delete(t.slabs, slab)
	t.mu.Unlock()
	if mem != nil {
		unix.Munmap(mem)
	}
	return t.ctl.Free(slab)
}

// mapSlab asks the server for a slab's memfd and maps it. A refusal is reported as one of op.
func (t *SHMClient) mapSlab(op Op, slab uint64) error {
	var fd int
	var pages uint32
	err := t.ctl.do(func(c *clientConn) error {
		var err error
		fd, pages, err = c.mapSlab(slab)
		return err
	})
	var re *RemoteError
	if errors.As(err, &re) {
		return &RemoteError{Op: op, Status: re.Status, Message: re.Message}
	}
	if err != nil {
		return err
	}
	mem, err := unix.Mmap(fd, 0, int(pages)*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	unix.Close(fd)
	if err != nil {
		return fmt.Errorf("mapping slab %d of the memory server at %s: %w", slab, t.path, err)
	}
	t.mu.Lock()
	if t.slabs[slab] != nil || t.err() != nil { // mapped meanwhile by another call, or closed
		unix.Munmap(mem)
	} else {
		t.slabs[slab] = mem
	}
	t.mu.Unlock()
	return nil
}

// mapSlab is one Map request: the answer's payload is the slab's pages, its ancillary data the
// memfd.
func (c *clientConn) mapSlab(slab uint64) (int, uint32, error) {
	var req [8]byte
	binary.LittleEndian.PutUint64(req[:], slab)
	c.id++
	(&Header{Op: OpMap, ID: c.id, Len: 8}).Put(c.hdr[:])
	c.bufs = append(c.bufs[:0], c.hdr[:], req[:])
	if err := c.writev(c.bufs); err != nil {
		return -1, 0, err
	}
	var b [HeaderSize + 4]byte
	var fds []int
	defer func() { // every descriptor but the one returned
		for _, fd := range fds {
			if fd >= 0 {
				unix.Close(fd)
			}
		}
	}()
	got := 0
	for got < HeaderSize {
		n, more, err := c.recvFDs(b[got:], fds)
		fds = more
		if err != nil {
			return -1, 0, err
		}
		got += n
	}
	h, err := ParseHeader(b[:])
	if err != nil {
		return -1, 0, err
	}
	if h.ID != c.id || h.Op != OpMap {
		return -1, 0, fmt.Errorf("%w: answer %v #%d to request %v #%d", ErrMalformed, h.Op, h.ID, OpMap, c.id)
	}
	if h.Status != StatusOK {
		msg := make([]byte, h.Len)
		have := copy(msg, b[HeaderSize:got])
		if err := c.readFull(msg[have:]); err != nil {
			return -1, 0, err
		}
		return -1, 0, &RemoteError{Op: OpMap, Status: h.Status, Message: string(msg)}
	}
	if h.Len != 4 {
		return -1, 0, fmt.Errorf("%w: %d-byte map answer", ErrMalformed, h.Len)
	}
	for got < len(b) {
		n, more, err := c.recvFDs(b[got:], fds)
		fds = more
		if err != nil {
			return -1, 0, err
		}
		got += n
	}
	if len(fds) != 1 {
		return -1, 0, fmt.Errorf("%w: map answer with %d descriptors", ErrMalformed, len(fds))
	}
	fd := fds[0]
	fds[0] = -1
	return fd, binary.LittleEndian.Uint32(b[HeaderSize:]), nil
}

// Write implements Transport.
func (t *SHMClient) Write(addrs []Addr, pages []byte) error {
	if err := checkPages(addrs, pages); err != nil {
		return err
	}
	return t.access(OpWrite, addrs, pages)
}

// Read implements Transport.
func (t *SHMClient) Read(addrs []Addr, pages []byte) error {
	if err := checkPages(addrs, pages); err != nil {
		return err
	}
	return t.access(OpRead, addrs, pages)
}

// access copies the pages once every address checks out (mapping slabs not mapped yet).
func (t *SHMClient) access(op Op, addrs []Addr, pages []byte) error {
	for {
		if err := t.err(); err != nil {
			return err
		}
		t.mu.RLock()
		missing, unmapped, err := t.check(op, addrs)
		if !unmapped && err == nil {
			var last uint64
			var mem []byte
			for i, a := range addrs {
				if mem == nil || a.Slab != last {
					last, mem = a.Slab, t.slabs[a.Slab]
				}
				p := mem[int(a.Page)*PageSize : int(a.Page+1)*PageSize]
				if op == OpRead {
					copy(pages[i*PageSize:(i+1)*PageSize], p)
				} else {
					copy(p, pages[i*PageSize:(i+1)*PageSize])
				}
			}
		}
		t.mu.RUnlock()
		if !unmapped {
			return err
		}
		if err := t.mapSlab(op, missing); err != nil {
			return err
		}
	}
}

// check finds the first slab of addrs not mapped yet, or the first page out of range. Called
// with mu held.
func (t *SHMClient) check(op Op, addrs []Addr) (slab uint64, unmapped bool, err error) {
	var last uint64
	var mem []byte
	for _, a := range addrs {
		if mem == nil || a.Slab != last {
			last, mem = a.Slab, t.slabs[a.Slab]
			if mem == nil {
				return a.Slab, true, nil
			}
		}
		if n := uint32(len(mem) / PageSize); a.Page >= n {
			return 0, false, &RemoteError{Op: op, Status: StatusRange, Message: fmt.Sprintf("page %d is beyond slab %d's %d pages", a.Page, a.Slab, n)}
		}
	}
	return 0, false, nil
}
