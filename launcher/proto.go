package launcher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
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
	msgDetach      = 17
	msgDetachOK    = 18
	msgUffdDev     = 19
	msgUffdDevOK   = 20
	msgFaults      = 21
	msgFaultsOK    = 22

	protoVersion = 8
	msgSize      = 40
	maxRuns      = 128
	maxMovePages = 256 // pages one MOVE message may cover (shim.c's status buffer)
	pageSize     = 4096
)

// A HELLO's C: 0 for a process farmem started or entered; for a fork child, helloForkChild or'd
// with the address of its fork probe page, or 0 if it made none (runtime.AttachForked).
const helloForkChild = 1

// helloAPILeft, or'd into a HELLO's C: the uffd it carries has had no UFFDIO_API, which the process
// may not make with fork events (it runs as another user); farmem makes it (asuser.go).
const helloAPILeft = 2

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
	fd, extra := takeFDs(c.oob[:oobn])
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

// takeFDs returns the descriptors an SCM_RIGHTS message carried (-1: none): the first, and a
// second (a HELLO's lifeline), made close-on-exec. Any more are closed.
func takeFDs(oob []byte) (fd, extra int) {
	fd, extra = -1, -1
	if len(oob) == 0 {
		return
	}
	cms, err := syscall.ParseSocketControlMessage(oob)
	if err != nil || len(cms) == 0 {
		return
	}
	fds, err := syscall.ParseUnixRights(&cms[0])
	if err != nil {
		return
	}
	for i, f := range fds {
		switch i {
		case 0:
			fd = f
		case 1:
			// Close-on-exec whatever the Go version: a lifeline inherited by some child of
			// farmem's would keep the program alive after farmem's death.
			unix.CloseOnExec(f)
			extra = f
		default:
			unix.Close(f)
		}
	}
	return
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
