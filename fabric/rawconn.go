package fabric

import (
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// rawConn is a connected stream socket used with blocking syscalls on the calling thread. The
// data path avoids Go's netpoller on purpose: a parked goroutine's wakeup costs tens of
// microseconds here (docs/DESIGN.md, "Latency": the netpoller's wakeup is slow), more than a
// loopback round trip.
type rawConn struct {
	fd   int
	iovs []unix.Iovec // scratch for readv/writev
	// spin is how long a wait for the peer's next bytes (an answer; on a server, the next
	// request) polls with non-blocking receives, yielding the CPU between tries, before it
	// sleeps in a blocking one: waking a sleeping thread from another CPU costs tens of
	// microseconds on a VM without halt-polling, more than a loopback round trip.
	spin time.Duration
	msg  unix.Msghdr // scratch for poll
}

// iovMax is the kernel's limit on iovecs per call (UIO_MAXIOV).
const iovMax = 1024

// setTimeout bounds every blocking send and receive (0: none). A call that times out fails
// with EAGAIN, which the callers treat like a broken connection.
func (c *rawConn) setTimeout(d time.Duration) error {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	if err := unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	return unix.SetsockoptTimeval(c.fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv)
}

func (c *rawConn) close() error { return unix.Close(c.fd) }

// readFull reads exactly len(b) bytes.
func (c *rawConn) readFull(b []byte) error {
	for len(b) > 0 {
		n, err := unix.Read(c.fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		if n == 0 {
			return io.ErrUnexpectedEOF
		}
		b = b[n:]
	}
	return nil
}

// readv fills the buffers in order, exactly.
func (c *rawConn) readv(bufs [][]byte) error {
	return c.vec(bufs, func(iov []unix.Iovec) (int, error) {
		n, _, e := unix.Syscall(unix.SYS_READV, uintptr(c.fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		if e != 0 {
			return 0, e
		}
		if n == 0 {
			return 0, io.ErrUnexpectedEOF
		}
		return int(n), nil
	})
}

// writev writes the buffers in order, exactly.
func (c *rawConn) writev(bufs [][]byte) error {
	return c.vec(bufs, func(iov []unix.Iovec) (int, error) {
		n, _, e := unix.Syscall(unix.SYS_WRITEV, uintptr(c.fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)))
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	})
}

// vec runs a readv/writev-like call until every byte of bufs has moved, resuming after short
// transfers and splitting at iovMax.
func (c *rawConn) vec(bufs [][]byte, call func([]unix.Iovec) (int, error)) error {
	for len(bufs) > 0 {
		c.iovs = c.iovs[:0]
		for _, b := range bufs[:min(len(bufs), iovMax)] {
			if len(b) > 0 {
				c.iovs = append(c.iovs, unix.Iovec{Base: &b[0], Len: uint64(len(b))})
			}
		}
		if len(c.iovs) == 0 {
			return nil
		}
		n, err := call(c.iovs)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		// Drop what moved: whole buffers, then the moved front of the next one. The caller's
		// slice headers are rewritten in place, which is why bufs is the callee's scratch.
		for n > 0 {
			if n >= len(bufs[0]) {
				n -= len(bufs[0])
				bufs = bufs[1:]
				continue
			}
			bufs[0] = bufs[0][n:]
			n = 0
		}
		for len(bufs) > 0 && len(bufs[0]) == 0 {
			bufs = bufs[1:]
		}
	}
	return nil
}

// sendFD writes b with fd attached to it (SCM_RIGHTS), exactly.
func (c *rawConn) sendFD(b []byte, fd int) error {
	oob := unix.UnixRights(fd)
	for {
		n, err := unix.SendmsgN(c.fd, b, oob, nil, unix.MSG_NOSIGNAL)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
		break
	}
	if len(b) == 0 {
		return nil
	}
	return c.writev([][]byte{b})
}

// recvFDs reads what has arrived into b, at least one byte, appending the file descriptors
// passed with it to fds.
func (c *rawConn) recvFDs(b []byte, fds []int) (int, []int, error) {
	var oob [64]byte // room for a few descriptors; the protocol passes one
	for {
		n, oobn, _, _, err := unix.Recvmsg(c.fd, b, oob[:], unix.MSG_CMSG_CLOEXEC)
		if err == unix.EINTR {
			continue
		}
		if oobn > 0 {
			if msgs, perr := unix.ParseSocketControlMessage(oob[:oobn]); perr == nil {
				for _, m := range msgs {
					if got, perr := unix.ParseUnixRights(&m); perr == nil {
						fds = append(fds, got...)
					}
				}
			}
		}
		if err != nil {
			return 0, fds, err
		}
		if n == 0 {
			return 0, fds, io.ErrUnexpectedEOF
		}
		return n, fds, nil
	}
}

// blockingFile takes a connection's socket out of Go's runtime poller: it returns a blocking
// descriptor of its own and closes c. Not conn.File(): that dup is registered with the poller
// (epoll, edge-triggered), and although Fd() then makes it blocking it stays registered, so
// every segment that arrives also wakes the runtime's poller thread — a second wakeup, often
// on another CPU, for each request and each answer (see results/fabric.md).
func blockingFile(c net.Conn) (*os.File, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("fabric: a %T has no descriptor", c)
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		c.Close()
		return nil, err
	}
	fd := -1
	var derr error
	if err := rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }); err != nil {
		derr = err
	}
	c.Close() // removes its own descriptor from the poller; the dup keeps the socket
	if derr != nil {
		return nil, derr
	}
	// Blocking before os.NewFile: a blocking descriptor is not added to the poller.
	if err := unix.SetNonblock(fd, false); err != nil {
		unix.Close(fd)
		return nil, err
	}
	return os.NewFile(uintptr(fd), "fabric-conn"), nil
}
