package launcher

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/inject"
	"github.com/farmem/farmem/runtime"
	"github.com/farmem/farmem/uffd"
)

// A process of the run that runs as another user than root (runuser, su, a server that drops
// root and exec's) is served as a root one is, with no capability of its own: what it may not do,
// farmem, root, does for it (probes/uffdasuser.c).
//
//   - It may not open /dev/userfaultfd (0600), and the system call gives it only a uffd that
//     handles user-mode faults (vm.unprivileged_userfaultfd=0), under which a read(2) into an
//     evicted page fails with EFAULT. The device checks permission only at open: farmem opens it
//     and sends the descriptor (MSG_UFFD_DEV, before the HELLO), and the shim makes its uffds on
//     it (agent.h, ask_uffd_dev). A process farmem enters from outside (a static image, an
//     attached process) asks the same way, by calls farmem makes in it (receiveUffdDev).
//   - EVENT_FORK needs CAP_SYS_PTRACE of the task making UFFDIO_API. The shim sends its uffd
//     without the call (helloAPILeft) and farmem makes it. Without fork events a fork child
//     would read evicted pages as zeros, so a uffd farmem cannot give them is not served.
//   - The mapping filter needs CAP_SYS_ADMIN or no_new_privs, which farmem does not set: it
//     would change what a later exec of a setuid binary does. Such a process is served without
//     the filter, as a run without the privilege is (runtime/mapfilter.go), and named on stderr.
//
// The shim's directory and libfarmem.so are readable by anyone (they hold nothing secret), and
// the socket is abstract (no permission to connect).

// sendUffdDev answers a process's MSG_UFFD_DEV on c with a descriptor of /dev/userfaultfd, if
// the process is one of the run's: the socket's name can be read by anyone in /proc/net/unix,
// and the descriptor lets a process make a uffd handling kernel-mode faults, which the host's
// vm.unprivileged_userfaultfd=0 denies other users. An error ends the connection.
func sendUffdDev(c *conn, rt *runtime.Runtime, pid int) error {
	cred, err := unix.GetsockoptUcred(connFD(c), unix.SOL_SOCKET, unix.SO_PEERCRED)
	status := uint64(0)
	dev := -1
	switch {
	case err != nil:
		return err
	case int(cred.Pid) != pid || !ofTheRun(rt, pid) && !beingEntered(pid):
		fmt.Fprintf(os.Stderr, "farmem: process %d (user %d), which is not one of the run's, asked for a userfaultfd: refused\n", cred.Pid, cred.Uid)
		status = uint64(unix.EPERM)
	default:
		if dev, err = unix.Open("/dev/userfaultfd", unix.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
			fmt.Fprintf(os.Stderr, "farmem: process %d runs as user %d and needs farmem's /dev/userfaultfd: %v\n", pid, cred.Uid, err)
			status = uint64(err.(unix.Errno))
		}
	}
	err = c.send(msg{Type: msgUffdDevOK, A: status}, dev)
	if dev >= 0 {
		unix.Close(dev)
	}
	return err
}

// connFD returns the descriptor of c's socket, for a getsockopt.
func connFD(c *conn) int {
	fd := -1
	if rc, err := c.c.SyscallConn(); err == nil {
		rc.Control(func(f uintptr) { fd = int(f) })
	}
	return fd
}

// ofTheRun reports whether process pid is one of the run's: served (an image a served process
// exec'd keeps its pid), or a descendant of farmem's.
func ofTheRun(rt *runtime.Runtime, pid int) bool {
	if rt.Lookup(pid) != nil {
		return true
	}
	me := os.Getpid()
	for p := pid; p > 1; {
		pp, ok := parentOf(p)
		if !ok {
			return false
		}
		if pp == me {
			return true
		}
		p = pp
	}
	return false
}

// parentOf returns the parent pid of process pid (field 4 of /proc/PID/stat).
func parentOf(pid int) (int, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, false
	}
	pp, err := strconv.Atoi(f[1])
	return pp, err == nil
}

// handshakeFor makes the UFFDIO_API call on a process's uffd that it could not make with fork
// events itself (helloAPILeft); the features are the shim's own (uffdFeatures).
func handshakeFor(fd int) error {
	if _, _, err := uffd.API(fd, uffdFeatures); err != nil {
		return fmt.Errorf("UFFDIO_API on its behalf: %w (it runs as another user, and fork events are a must)", err)
	}
	return nil
}

// entering holds the pids of the processes farmem is putting its agent into right now: stopped,
// running only the calls farmem makes in them, one of which may be a MSG_UFFD_DEV
// (receiveUffdDev) from a process not yet of the run (one being attached).
var entering sync.Map

func beingEntered(pid int) bool {
	_, ok := entering.Load(pid)
	return ok
}

// receiveUffdDev has the tracee ask farmem for a descriptor of /dev/userfaultfd, as a shim running
// as another user does (agent.h, ask_uffd_dev), by calls farmem makes in it: it connects to
// farmem's socket sock, sends MSG_UFFD_DEV and receives the descriptor, which it keeps; its
// connection is closed again. It returns the descriptor's number in the tracee. scratch is a page
// of the tracee's memory it may use.
func receiveUffdDev(tr *inject.Tracee, scratch uint64, sock string) (uint64, error) {
	// The scratch page: the socket's address, the message, its iovec, the msghdr, the cmsg.
	const addrAt, msgAt, iovAt, hdrAt, cmsgAt = 0, 128, 192, 256, 320
	name := []byte(sock)
	if len(name) == 0 || len(name) > 107 {
		return 0, fmt.Errorf("socket name %q", sock)
	}
	if name[0] == '@' {
		name[0] = 0 // the abstract namespace
	}
	cmsgLen := unix.CmsgSpace(4)
	page := make([]byte, cmsgAt+cmsgLen)
	binary.LittleEndian.PutUint16(page[addrAt:], unix.AF_UNIX)
	copy(page[addrAt+2:], name)
	m := msg{Type: msgUffdDev, Version: protoVersion, Pid: int32(tr.Pid())}
	m.encode(page[msgAt:])
	binary.LittleEndian.PutUint64(page[iovAt:], scratch+msgAt)
	binary.LittleEndian.PutUint64(page[iovAt+8:], msgSize)
	binary.LittleEndian.PutUint64(page[hdrAt+16:], scratch+iovAt)   // msg_iov (msg_name and namelen 0)
	binary.LittleEndian.PutUint64(page[hdrAt+24:], 1)               // msg_iovlen
	binary.LittleEndian.PutUint64(page[hdrAt+32:], scratch+cmsgAt)  // msg_control
	binary.LittleEndian.PutUint64(page[hdrAt+40:], uint64(cmsgLen)) // msg_controllen
	if err := tr.Write(scratch, page); err != nil {
		return 0, err
	}
	s, err := tr.Syscall(unix.SYS_SOCKET, unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("socket: %w", err)
	}
	defer tr.Syscall(unix.SYS_CLOSE, s)
	entering.Store(tr.Pid(), true)
	defer entering.Delete(tr.Pid())
	if _, err := tr.Syscall(unix.SYS_CONNECT, s, scratch+addrAt, uint64(2+len(name))); err != nil {
		return 0, fmt.Errorf("connect to farmem's socket: %w", err)
	}
	if n, err := tr.Syscall(unix.SYS_WRITE, s, scratch+msgAt, msgSize); err != nil || n != msgSize {
		return 0, fmt.Errorf("sending MSG_UFFD_DEV: %d bytes, %v", n, err)
	}
	n, err := tr.Syscall(unix.SYS_RECVMSG, s, scratch+hdrAt, unix.MSG_CMSG_CLOEXEC)
	if err != nil || n != msgSize {
		return 0, fmt.Errorf("receiving farmem's answer: %d bytes, %v", n, err)
	}
	if err := tr.Read(scratch, page); err != nil {
		return 0, err
	}
	answer, err := decode(page[msgAt:])
	if err != nil {
		return 0, err
	}
	if answer.Type != msgUffdDevOK {
		return 0, fmt.Errorf("farmem answered MSG_UFFD_DEV with message %d", answer.Type)
	}
	if answer.A != 0 {
		return 0, fmt.Errorf("farmem refused it /dev/userfaultfd: %w", unix.Errno(answer.A))
	}
	controlLen := binary.LittleEndian.Uint64(page[hdrAt+40:]) // what recvmsg filled in
	cmsgs, err := unix.ParseSocketControlMessage(page[cmsgAt : cmsgAt+min(int(controlLen), cmsgLen)])
	if err != nil || len(cmsgs) != 1 {
		return 0, fmt.Errorf("farmem's answer came with no descriptor (%v)", err)
	}
	fds, err := unix.ParseUnixRights(&cmsgs[0])
	if err != nil || len(fds) != 1 {
		return 0, fmt.Errorf("farmem's answer came with no descriptor (%v)", err)
	}
	return uint64(fds[0]), nil
}
