package launcher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/evictor"
)

// Wire format shared with shim/shim.c (struct fm_msg, struct fm_run). Little-endian; one
// message per SOCK_SEQPACKET datagram.
const (
	msgHello       = 1
	msgHelloOK     = 2
	msgRegister    = 3
	msgRegisterOK  = 4
	msgAgentHello  = 5
	msgEvict       = 6
	msgEvictDone   = 7
	msgFilter      = 8
	msgFilterOK    = 9
	msgSyscall     = 10
	msgSyscallDone = 11
	msgAgentReady  = 12
	msgMove        = 13
	msgMoveDone    = 14
	msgStaging     = 15
	msgStagingOK   = 16

	protoVersion = 5
	msgSize      = 40
	maxRuns      = 128
	maxMovePages = 256 // pages one MOVE message may cover (shim.c's status buffer)
	pageSize     = 4096
)

type msg struct {
	Type, Version uint32
	Pid, N        int32
	A, B, C       uint64
}

func (m *msg) encode(b []byte) []byte {
	b = b[:msgSize]
	binary.LittleEndian.PutUint32(b[0:], m.Type)
	binary.LittleEndian.PutUint32(b[4:], m.Version)
	binary.LittleEndian.PutUint32(b[8:], uint32(m.Pid))
	binary.LittleEndian.PutUint32(b[12:], uint32(m.N))
	binary.LittleEndian.PutUint64(b[16:], m.A)
	binary.LittleEndian.PutUint64(b[24:], m.B)
	binary.LittleEndian.PutUint64(b[32:], m.C)
	return b
}

func decode(b []byte) (msg, error) {
	if len(b) < msgSize {
		return msg{}, fmt.Errorf("short message (%d bytes)", len(b))
	}
	m := msg{
		Type: binary.LittleEndian.Uint32(b[0:]), Version: binary.LittleEndian.Uint32(b[4:]),
		Pid: int32(binary.LittleEndian.Uint32(b[8:])), N: int32(binary.LittleEndian.Uint32(b[12:])),
		A: binary.LittleEndian.Uint64(b[16:]), B: binary.LittleEndian.Uint64(b[24:]), C: binary.LittleEndian.Uint64(b[32:]),
	}
	if m.Version != protoVersion {
		return m, fmt.Errorf("shim speaks protocol %d, runtime %d (mixed farmem versions?)", m.Version, protoVersion)
	}
	return m, nil
}

// errClosed is an orderly end of a shim connection: the process exited or exec'd.
var errClosed = errors.New("connection closed")

// conn is one shim connection.
type conn struct {
	c   *net.UnixConn
	buf [msgSize + maxRuns*16]byte
	n   int // bytes of the last message in buf
	oob [64]byte
}

// recv reads one message and the fd it carries (-1: none). A HELLO may carry a second fd, the
// process's lifeline: recvLifeline returns both.
func (c *conn) recv() (msg, int, error) {
	m, fd, extra, err := c.recvLifeline()
	if extra >= 0 {
		unix.Close(extra)
	}
	return m, fd, err
}

// recvLifeline is recv keeping a second fd, if the message carries one (-1: none).
func (c *conn) recvLifeline() (msg, int, int, error) {
	n, oobn, _, _, err := c.c.ReadMsgUnix(c.buf[:], c.oob[:])
	if errors.Is(err, io.EOF) {
		return msg{}, -1, -1, errClosed
	}
	if err != nil {
		return msg{}, -1, -1, err
	}
	if n == 0 {
		return msg{}, -1, -1, errClosed
	}
	c.n = n
	fd, extra := -1, -1
	if oobn > 0 {
		cms, err := syscall.ParseSocketControlMessage(c.oob[:oobn])
		if err == nil && len(cms) > 0 {
			if fds, err := syscall.ParseUnixRights(&cms[0]); err == nil && len(fds) > 0 {
				for i, f := range fds {
					switch i {
					case 0:
						fd = f
					case 1:
						// Close-on-exec whatever the Go version: a lifeline inherited by some
						// child of farmem's would keep the program alive after farmem's death.
						unix.CloseOnExec(f)
						extra = f
					default:
						unix.Close(f)
					}
				}
			}
		}
	}
	m, err := decode(c.buf[:n])
	if err != nil {
		for _, f := range []int{fd, extra} {
			if f >= 0 {
				unix.Close(f)
			}
		}
		fd, extra = -1, -1
	}
	return m, fd, extra, err
}

func (c *conn) send(m msg, fd int) error {
	m.Version = protoVersion
	var b [msgSize]byte
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	_, _, err := c.c.WriteMsgUnix(m.encode(b[:]), oob, nil)
	return err
}

// agentConn carries eviction requests to a process's agent thread; one request at a time.
type agentConn struct {
	mu sync.Mutex
	c  *conn
}

// ask sends the agent m and returns its answer, with the fd it passed (-1: none); a.mu must be
// held. A connection that fails is the agent's death: ErrGone.
func (a *agentConn) ask(m msg) (msg, int, error) {
	if a.c.send(m, -1) != nil {
		return msg{}, -1, evictor.ErrGone
	}
	ans, fd, err := a.c.recv()
	if err != nil {
		return msg{}, -1, evictor.ErrGone
	}
	return ans, fd, nil
}

// askRuns sends the agent m with runs after its header and returns the answer (its body, if any,
// is a.c.buf[msgSize:a.c.n]); a.mu must be held.
func (a *agentConn) askRuns(m msg, runs []evictor.Run) (msg, error) {
	b := make([]byte, msgSize+16*len(runs))
	m.Version = protoVersion
	m.encode(b)
	for i, r := range runs {
		binary.LittleEndian.PutUint64(b[msgSize+16*i:], r.Addr)
		binary.LittleEndian.PutUint64(b[msgSize+16*i+8:], r.Len)
	}
	if _, err := a.c.c.Write(b); err != nil {
		return msg{}, evictor.ErrGone
	}
	ans, _, err := a.c.recv()
	if err != nil {
		return msg{}, evictor.ErrGone
	}
	return ans, nil
}

// Drop implements runtime.Agent.
func (a *agentConn) Drop(runs []evictor.Run) error {
	a.mu.Lock()
	defer a.mu.Unlock()
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
// pages from dst on, and answers a status byte per page (0 moved, else its errno).
func (a *agentConn) Move(runs []evictor.Run, dst uint64, status []byte) error {
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
		m, err := a.askRuns(msg{Type: msgMove, N: int32(k), A: dst + uint64(done)*pageSize, B: uint64(pages)}, runs[:k])
		if err != nil {
			return err
		}
		body := a.c.buf[msgSize:a.c.n]
		if m.Type != msgMoveDone || int(m.N) != pages || len(body) < pages {
			return fmt.Errorf("agent answered message type %d (%d pages, %d status bytes) to a move of %d pages", m.Type, m.N, len(body), pages)
		}
		copy(status[done:done+pages], body)
		done += pages
		runs = runs[k:]
	}
	return nil
}

// Staging implements runtime.Agent: the agent maps the staging area (shim.c, make_staging).
func (a *agentConn) Staging(bytes uint64) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m, _, err := a.ask(msg{Type: msgStaging, A: bytes})
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
	var b [msgSize + 6*8]byte
	(&msg{Type: msgSyscall, Version: protoVersion, A: nr}).encode(b[:])
	for i, v := range args {
		binary.LittleEndian.PutUint64(b[msgSize+8*i:], v)
	}
	if _, err := a.c.c.Write(b[:]); err != nil {
		return 0, evictor.ErrGone
	}
	m, _, err := a.c.recv()
	if err != nil {
		return 0, evictor.ErrGone
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
	return a.c.send(msg{Type: msgAgentReady}, -1)
}

// Close implements runtime.Agent.
func (a *agentConn) Close() error { return a.c.c.Close() }
