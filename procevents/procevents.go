// Package procevents reads the kernel's process events connector (cn_proc, a netlink
// multicast group): which process has just exec'd a new image, and which has just forked a new
// one. The kernel sends an exec's event as the exec completes, before the new image runs its
// first instruction, and a fork's once the child is made; the reader hears either a moment
// later, while the process runs.
//
// farmem learns of most execs another way (a served process's control connection ends, the
// mapping filter hands a vfork child's exec over), but not of an image a process exec'd before it
// had a filter: a dynamic process has none until the run arms, and a shell runs most of its
// commands by vfork and exec. Nor of a fork child that says no hello (a raw clone in a process
// with no filter), whose parent may exit at once. Without this, only a periodic look among the
// served processes' children finds either, and misses one that lives less than that period, or
// whose parent does.
//
// Listening needs CAP_NET_ADMIN (Listen fails without it), and a listener outside the initial
// user and pid namespaces hears nothing (the kernel says nothing of it either): the caller must
// do without, as farmem does its periodic look. The connector reports every process's forks
// (every new thread's too), execs and exits on the machine; the kernel keeps only the forks and
// execs for a listener that asks (Linux 6.6), and Next drops the rest on an older one, and the
// forks that made threads.
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

	eventFork = 0x1 // PROC_EVENT_FORK
	eventExec = 0x2 // PROC_EVENT_EXEC

	nlmsgHdrLen = 16 // struct nlmsghdr
	cnMsgLen    = 20 // struct cn_msg: id {idx, val}, seq, ack, len (u16), flags (u16)
	// struct proc_event: what (u32), cpu (u32), timestamp_ns (u64), then the event's data; for
	// an exec, process_pid and process_tgid (s32 each); for a fork, parent_pid, parent_tgid,
	// child_pid and child_tgid.
	eventHdrLen = 16
	execLen     = eventHdrLen + 8
	forkLen     = eventHdrLen + 16
)

// Kind is what an Event tells of.
type Kind int

const (
	Exec Kind = iota + 1 // Pid exec'd a new image
	Fork                 // Parent forked Pid, a new process (not a thread)
)

// Event is one process event: processes by their thread group ids.
type Event struct {
	Kind   Kind
	Pid    int
	Parent int // Fork's only
}

// Events reads process events; Close ends a Next that waits.
type Events struct {
	f   *os.File // the netlink socket, non-blocking, in the runtime's poller: Close wakes a read
	buf []byte
}

// Listen subscribes to the fork and exec events of every process on the machine. Its error says
// why not (EPERM without CAP_NET_ADMIN; EPROTONOSUPPORT in a kernel without the connector).
func Listen() (*Events, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK, unix.NETLINK_CONNECTOR)
	if err != nil {
		return nil, fmt.Errorf("netlink connector socket: %w", err)
	}
	fail := func(what string, err error) (*Events, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	// A larger buffer than the default: on a busy machine events come in bursts, and those that
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
	return &Events{f: os.NewFile(uintptr(fd), "cn_proc"), buf: make([]byte, 4096)}, nil
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

// listenMsg is a subscription: with the filter (op and event types), or the op alone.
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
		le.PutUint32(c[cnMsgLen+4:], eventFork|eventExec)
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

// ErrLost is Next's error when the socket's buffer overflowed: some events were not told.
var ErrLost = errors.New("process events lost: the socket's buffer overflowed")

// Next waits for the next exec, or fork of a new process. Its error after Close is
// os.ErrClosed; ErrLost says events were dropped, and reading may go on.
func (e *Events) Next() (Event, error) {
	for {
		n, err := e.f.Read(e.buf)
		if errors.Is(err, unix.ENOBUFS) {
			return Event{}, ErrLost
		}
		if err != nil {
			return Event{}, err
		}
		if ev, ok := parse(e.buf[:n]); ok {
			return ev, nil
		}
	}
}

// parse returns the exec or process fork one connector message tells of.
func parse(msg []byte) (Event, bool) {
	ev, ok := event(msg)
	if !ok || len(ev) < eventHdrLen {
		return Event{}, false
	}
	le := binary.LittleEndian
	s32 := func(off int) int { return int(int32(le.Uint32(ev[eventHdrLen+off:]))) }
	switch le.Uint32(ev) {
	case eventExec:
		if len(ev) >= execLen {
			return Event{Kind: Exec, Pid: s32(4)}, true
		}
	case eventFork:
		if len(ev) < forkLen {
			break
		}
		// A new thread is a fork too, of a child in its parent's thread group.
		if parent, child, childTgid := s32(4), s32(8), s32(12); child == childTgid && childTgid != parent {
			return Event{Kind: Fork, Pid: childTgid, Parent: parent}, true
		}
	}
	return Event{}, false
}

// Close stops listening; a Next waiting returns.
func (e *Events) Close() error { return e.f.Close() }
