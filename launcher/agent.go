package launcher

import (
	"encoding/binary"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/evictor"
)

// agentConn carries eviction requests to a process's agent thread; one request at a time.
//
// It is a blocking socket used with plain system calls, not a net.UnixConn. The evictor asks
// from a goroutine locked to its thread; through Go's netpoller, each answer would wake a thread
// blocked in epoll, which hands the goroutine to its locked thread: two wakeups, often across
// CPUs, twice a batch (results/floor/perf-farmem-micro-random.md). Blocking in recvmsg, the
// evictor's thread is woken by the kernel directly. The other callers (the mapping filter's
// syscalls) block their thread likewise, briefly.
type agentConn struct {
	mu  sync.Mutex
	fd  int                        // protected by mu; -1 once closed
	buf [msgSize + maxRuns*16]byte // protected by mu: the request sent, then the answer
	n   int                        // protected by mu: bytes of the last answer in buf
	oob [64]byte                   // protected by mu
	// sock is the socket, for Close to shut down without mu, which a request in flight holds
	// while it waits. Set by newAgentConn, never changed; closed only after the shutdown.
	sock    int
	closing sync.Once
}

// newAgentConn takes over c, an agent's connection, for blocking use: the connection is closed
// and its socket kept on a descriptor of its own.
func newAgentConn(c *conn) (*agentConn, error) {
	defer c.c.Close() // also drops the socket from the netpoller; the duplicate keeps it open
	rc, err := c.c.SyscallConn()
	if err != nil {
		return nil, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		return nil, err
	}
	if derr != nil {
		return nil, fmt.Errorf("dup agent socket: %w", derr)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("agent socket: %w", err)
	}
	return &agentConn{fd: fd, sock: fd}, nil
}

// ask sends the agent m and returns its answer, with the fd it passed (-1: none); a.mu must be
// held. A connection that fails is the agent's death: ErrGone.
func (a *agentConn) ask(m msg) (msg, int, error) {
	m.Version = protoVersion
	m.encode(a.buf[:msgSize])
	return a.exchange(msgSize)
}

// askFD is ask with descriptor fd passed along.
func (a *agentConn) askFD(m msg, fd int) (msg, int, error) {
	m.Version = protoVersion
	m.encode(a.buf[:msgSize])
	return a.exchangeRights(msgSize, unix.UnixRights(fd))
}

// askRuns sends the agent m with runs after its header and returns the answer (its body, if any,
// is a.buf[msgSize:a.n]); a.mu must be held.
func (a *agentConn) askRuns(m msg, runs []evictor.Run) (msg, error) {
	m.Version = protoVersion
	m.encode(a.buf[:msgSize])
	for i, r := range runs {
		binary.LittleEndian.PutUint64(a.buf[msgSize+16*i:], r.Addr)
		binary.LittleEndian.PutUint64(a.buf[msgSize+16*i+8:], r.Len)
	}
	ans, _, err := a.exchange(msgSize + 16*len(runs))
	return ans, err
}

// exchange sends buf's first n bytes as one message and reads the answer into buf; a.mu must be
// held.
func (a *agentConn) exchange(n int) (msg, int, error) { return a.exchangeRights(n, nil) }

// exchangeRights is exchange with rights (unix.UnixRights) passed along the message.
func (a *agentConn) exchangeRights(n int, rights []byte) (msg, int, error) {
	if a.fd < 0 {
		return msg{}, -1, evictor.ErrGone
	}
	if err := retryEINTR(func() error { return unix.Sendmsg(a.fd, a.buf[:n], rights, nil, 0) }); err != nil {
		return msg{}, -1, evictor.ErrGone
	}
	var got, oobn int
	err := retryEINTR(func() (err error) {
		got, oobn, _, _, err = unix.Recvmsg(a.fd, a.buf[:], a.oob[:], unix.MSG_CMSG_CLOEXEC)
		return err
	})
	if err != nil || got == 0 {
		return msg{}, -1, evictor.ErrGone
	}
	a.n = got
	fd, extra := takeFDs(a.oob[:oobn])
	if extra >= 0 {
		unix.Close(extra)
	}
	ans, err := decode(a.buf[:got])
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return msg{}, -1, evictor.ErrGone
	}
	return ans, fd, nil
}

// retryEINTR runs call until it returns anything but EINTR (Go's own signals interrupt a
// blocking call).
func retryEINTR(call func() error) error {
	for {
		if err := call(); err != unix.EINTR {
			return err
		}
	}
}

// Drop implements runtime.Agent.
func (a *agentConn) Drop(commit func() []evictor.Run) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	runs := commit()
	var first error
	for len(runs) > 0 {
		k := min(len(runs), maxRuns)
		m, err := a.askRuns(msg{Type: msgEvict, N: int32(k)}, runs[:k])
		if err != nil {
			return err
		}
		if m.Type != msgEvictDone {
			return fmt.Errorf("agent answered message type %d", m.Type)
		}
		if m.A != 0 && first == nil {
			first = fmt.Errorf("agent madvise(DONTNEED): %w", unix.Errno(m.A)) // the other runs still go
		}
		runs = runs[k:]
	}
	return first
}

// Move implements runtime.Agent: the agent moves the runs' pages, in order, to consecutive
// pages from dst on, while no layout event after the layout-th is read, and answers a status
// byte per page (0 moved, else its errno).
func (a *agentConn) Move(runs []evictor.Run, dst uint64, layout uint64, status []byte) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	done := 0 // pages asked for so far
	for len(runs) > 0 {
		k, pages := 0, 0
		for k < len(runs) && k < maxRuns && pages+int(runs[k].Len/pageSize) <= maxMovePages {
			pages += int(runs[k].Len / pageSize)
			k++
		}
		if k == 0 {
			return fmt.Errorf("a run of %d pages is more than one move message takes", runs[0].Len/pageSize)
		}
		if done+pages > len(status) {
			return fmt.Errorf("%d pages to move, status for %d", done+pages, len(status))
		}
		m, err := a.askRuns(msg{Type: msgMove, N: int32(k), A: dst + uint64(done)*pageSize, B: uint64(pages), C: layout}, runs[:k])
		if err != nil {
			return err
		}
		body := a.buf[msgSize:a.n]
		if m.Type != msgMoveDone || int(m.N) != pages || len(body) < pages {
			return fmt.Errorf("agent answered message type %d (%d pages, %d status bytes) to a move of %d pages", m.Type, m.N, len(body), pages)
		}
		copy(status[done:done+pages], body)
		done += pages
		runs = runs[k:]
	}
	return nil
}

// Staging implements runtime.Agent: the agent maps the staging area and the move fence
// (agent.h, make_staging).
func (a *agentConn) Staging(bytes uint64, fence int) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, _, err := a.askFD(msg{Type: msgStaging, A: bytes}, fence)
	if err != nil {
		return 0, err
	}
	if m.Type != msgStagingOK {
		return 0, fmt.Errorf("agent answered message type %d to a staging request", m.Type)
	}
	if m.A == 0 {
		return 0, unix.Errno(m.B)
	}
	return m.A, nil
}

// Filter implements runtime.Agent: the agent installs the mapping filter (shim.c) on
// every thread of its process and sends back the filter's listener.
func (a *agentConn) Filter(minBytes uint64, guardForks bool) (int, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := msg{Type: msgFilter, A: minBytes}
	if guardForks {
		m.B = 1
	}
	m, fd, err := a.ask(m)
	if err != nil {
		return -1, err
	}
	if m.Type != msgFilterOK || (m.A == 0) != (fd >= 0) {
		if fd >= 0 {
			unix.Close(fd)
		}
		return -1, fmt.Errorf("agent answered message type %d to a filter request", m.Type)
	}
	if m.A != 0 {
		return -1, unix.Errno(m.A)
	}
	return fd, nil
}

// Syscall implements runtime.Agent: the agent makes the call in its process and returns the
// raw result (-errno on failure).
func (a *agentConn) Syscall(nr uint64, args [6]uint64) (int64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	(&msg{Type: msgSyscall, Version: protoVersion, A: nr}).encode(a.buf[:msgSize])
	for i, v := range args {
		binary.LittleEndian.PutUint64(a.buf[msgSize+8*i:], v)
	}
	m, _, err := a.exchange(msgSize + 6*8)
	if err != nil {
		return 0, err
	}
	if m.Type != msgSyscallDone {
		return 0, fmt.Errorf("agent answered message type %d to a syscall", m.Type)
	}
	return int64(m.A), nil
}

// Ready tells the agent it is attached: the thread that started it waits for this, so an armed
// run's mapping filter is in place before the program allocates (shim.c, start_agent).
func (a *agentConn) Ready() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fd < 0 {
		return evictor.ErrGone
	}
	var b [msgSize]byte
	_, err := unix.Write(a.fd, (&msg{Type: msgAgentReady, Version: protoVersion}).encode(b[:]))
	return err
}

// Close implements runtime.Agent. The shutdown ends a request in flight (its recvmsg returns
// 0, the agent's death); the descriptor is closed once that request let go of a.mu, so its
// number cannot be reused under it.
func (a *agentConn) Close() error {
	a.closing.Do(func() { unix.Shutdown(a.sock, unix.SHUT_RDWR) })
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fd < 0 {
		return nil
	}
	fd := a.fd
	a.fd = -1
	return unix.Close(fd)
}

// ServeFaults implements runtime.Agent: the agent maps the process's table of words (table,
// pubtable's memfd) and starts its fault thread, which reads the store space through store and
// sends what it does not serve on sock; the thread waits on sock for farmem's word to begin
// (agent.h, fault_thread). The descriptors stay the caller's.
func (a *agentConn) ServeFaults(table, store, sock int) (tid int, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.fd < 0 {
		return 0, evictor.ErrGone
	}
	var b [msgSize]byte
	(&msg{Type: msgFaults, Version: protoVersion}).encode(b[:])
	rights := unix.UnixRights(table, store, sock)
	if err := retryEINTR(func() error { return unix.Sendmsg(a.fd, b[:], rights, nil, 0) }); err != nil {
		return 0, evictor.ErrGone
	}
	var got int
	if err := retryEINTR(func() (err error) { got, _, _, _, err = unix.Recvmsg(a.fd, a.buf[:], nil, 0); return err }); err != nil || got == 0 {
		return 0, evictor.ErrGone
	}
	m, err := decode(a.buf[:got])
	if err != nil {
		return 0, evictor.ErrGone
	}
	if m.Type != msgFaultsOK {
		return 0, fmt.Errorf("agent answered message type %d to a fault-serving request", m.Type)
	}
	if m.A != 0 {
		return 0, unix.Errno(m.A)
	}
	return int(m.B), nil
}

// Detach implements runtime.Agent: the agent undoes what it holds in its process (agent.h,
// detach_agent) and ends its thread.
func (a *agentConn) Detach() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, _, err := a.ask(msg{Type: msgDetach})
	if err != nil {
		return err
	}
	if m.Type != msgDetachOK {
		return fmt.Errorf("agent answered message type %d to a detach", m.Type)
	}
	return nil
}
