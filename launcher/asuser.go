package launcher

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

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
//     it (agent.h, ask_uffd_dev).
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
	case int(cred.Pid) != pid || !ofTheRun(rt, pid):
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
