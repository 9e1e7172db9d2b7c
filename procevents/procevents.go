// Package procevents reads the kernel's process events connector (cn_proc, a netlink
// multicast group): which process has just exec'd a new image. The kernel sends the event as the
// exec completes, before the new image runs its first instruction; the reader hears it a moment
// later, while the image runs.
//
// farmem learns of most execs another way (a served process's control connection ends, the
// mapping filter hands a vfork child's exec over), but not of an image a process exec'd before it
// had a filter: a dynamic process has none until the run arms, and a shell runs most of its
// commands by vfork and exec. Without this, only a periodic look among the served processes'
// children finds such an image, and one that lives less than that period is never found.
//
// Listening needs CAP_NET_ADMIN (Listen fails without it), and a listener outside the initial
// user and pid namespaces hears nothing (the kernel says nothing of it either): the caller must
// do without, as farmem does its periodic look. The connector reports every process's forks,
// execs and exits on the machine; the kernel keeps only the execs for a listener that asks
// (Linux 6.6), and Next drops the rest on an older one.
//
// One exact encoding of the connector's messages (linux/connector.h, linux/cn_proc.h), as x/sys
// has none: a netlink header, then a cn_msg, then its data.
package procevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// From linux/connector.h and linux/cn_proc.h.
const (
	cnIdxProc = 1 // CN_IDX_PROC: the connector's id and multicast group for process events
	cnValProc = 1 // CN_VAL_PROC

	mcastListen = 1 // PROC_CN_MCAST_LISTEN

	eventExec = 0x2 // PROC_EVENT_EXEC

	nlmsgHdrLen = 16 // struct nlmsghdr
	cnMsgLen    = 20 // struct cn_msg: id {idx, val}, seq, ack, len (u16), flags (u16)
	// struct proc_event: what (u32), cpu (u32), timestamp_ns (u64), then the event's data; for
	// an exec, process_pid and process_tgid (s32 each).
	eventHdrLen = 16
	execLen     = eventHdrLen + 8
)

// Execs reads exec events; Close ends a Next that waits.
type Execs struct {
	f   *os.File // the netlink socket, non-blocking, in the runtime's poller: Close wakes a read
	buf []byte
}

// Listen subscribes to the exec events of every process on the machine. Its error says why not
// (EPERM without CAP_NET_ADMIN; EPROTONOSUPPORT in a kernel without the connector).
func Listen() (*Execs, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_CONNECTOR)
	if err != nil {
		return nil, fmt.Errorf("netlink connector socket: %w", err)
	}
	fail := func(what string, err error) (*Execs, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	// A larger buffer than the default: on a busy machine execs come in bursts, and those that
	// overflow it are lost (the read says ENOBUFS).
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: cnIdxProc}); err != nil {
		return fail("binding to the process events group", err)
	}
	// A kernel that filters (6.6) takes the op and an event type; one that does not takes only
	// the op, and ignores, without a word, a request of another length.
	if err := unix.Send(fd, listenMsg(filters()), 0); err != nil {
		return fail("subscribing to process events", err)
	}
	return &Execs{f: os.NewFile(uintptr(fd), "cn_proc"), buf: make([]byte, 4096)}, nil
}

// filters reports whether the kernel filters process events by type for a listener (6.6 on).
func filters() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	return major > 6 || major == 6 && minor >= 6
}

// listenMsg is a subscription: with the exec filter (op and event type), or the op alone.
func listenMsg(filtered bool) []byte {
	data := 4
	if filtered {
		data = 8
	}
	b := make([]byte, nlmsgHdrLen+cnMsgLen+data)
	le := binary.LittleEndian
	le.PutUint32(b[0:], uint32(len(b)))       // nlmsg_len
	le.PutUint16(b[4:], unix.NLMSG_DONE)      // nlmsg_type
	le.PutUint32(b[12:], uint32(os.Getpid())) // nlmsg_pid
	c := b[nlmsgHdrLen:]
	le.PutUint32(c[0:], cnIdxProc)
	le.PutUint32(c[4:], cnValProc)
	le.PutUint16(c[16:], uint16(data)) // len
	le.PutUint32(c[cnMsgLen:], mcastListen)
	if filtered {
		le.PutUint32(c[cnMsgLen+4:], eventExec)
	}
	return b
}

// event returns the proc_event inside one netlink message from the connector.
func event(msg []byte) ([]byte, bool) {
	if len(msg) < nlmsgHdrLen+cnMsgLen {
		return nil, false
	}
	c := msg[nlmsgHdrLen:]
	le := binary.LittleEndian
	if le.Uint32(c[0:]) != cnIdxProc || le.Uint32(c[4:]) != cnValProc {
		return nil, false
	}
	n := int(le.Uint16(c[16:]))
	if len(c) < cnMsgLen+n {
		return nil, false
	}
	return c[cnMsgLen : cnMsgLen+n], true
}

// ErrLost is Next's error when the socket's buffer overflowed: some execs were not told.
var ErrLost = errors.New("process events lost: the socket's buffer overflowed")

// Next waits for the next exec and returns the process that made it (its thread group id). Its
// error after Close is os.ErrClosed; ErrLost says events were dropped, and reading may go on.
func (e *Execs) Next() (int, error) {
	for {
		n, err := e.f.Read(e.buf)
		if errors.Is(err, unix.ENOBUFS) {
			return 0, ErrLost
		}
		if err != nil {
			return 0, err
		}
		if tgid, ok := execOf(e.buf[:n]); ok {
			return tgid, nil
		}
	}
}

// execOf returns the thread group id of the process of an exec event.
func execOf(msg []byte) (int, bool) {
	ev, ok := event(msg)
	if !ok || len(ev) < execLen || binary.LittleEndian.Uint32(ev) != eventExec {
		return 0, false
	}
	return int(int32(binary.LittleEndian.Uint32(ev[eventHdrLen+4:]))), true
}

// Close stops listening; a Next waiting returns.
func (e *Execs) Close() error { return e.f.Close() }
