package runtime

import (
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/procfs"
	"github.com/farmem/farmem/seccomp"
)

// An image exec'd by a vfork child: posix_spawn, vfork+exec, and shells that spawn that way.
//
// The child shares its parent's memory until its exec succeeds: fork raises no FORK event for it
// and runs no atfork handler, so it never says hello, and it has no control connection whose end
// would tell of its exec (ControlEnded). Without more, the image it exec's would run unknown to
// farmem: uncapped and unnamed. The mapping filter hands over every execve and execveat
// (launcher/shim/agent.h), and the runtime notes the ones made by a vfork child of a process it
// serves, while the caller is still held and so still shares its parent's memory (kcmp says so:
// the one fact that tells a vfork child from a fork child, which has memory of its own). The call
// is let through, and once the child's memory is no longer its parent's (its exec succeeded),
// its image is served as any exec'd image is (serveImage): it says hello, or it is entered, or it
// is named on stderr and counted.
//
// What it cannot see: an exec from a vfork child of a dynamic process before the run arms (such a
// process installs its filter when the run arms), which the rescan loop finds after
// (unseenimages.go), and one from a process that is not served.

// kcmpVM is KCMP_VM of linux/kcmp.h: whether two processes share one mm.
const kcmpVM = 1

// serveExec answers an execve or execveat the filter handed over: always let through, and
// watched (watchVforkExec) if the caller is a vfork child of a process of the run.
func (rt *Runtime) serveExec(fd int, n seccomp.Notif) {
	pid, parent := rt.vforkChild(int(n.Pid))
	watch := pid != 0 && rt.claimVforkExec(pid)
	seccomp.Respond(fd, &seccomp.Resp{ID: n.ID, Flags: seccomp.FlagContinue})
	if watch {
		rt.watchVforkExec(pid, parent)
	}
}

// vforkChild returns, if thread tid belongs to a process the run does not serve that shares the
// memory of its parent, which it does, that process's pid and its parent's; else 0, 0.
func (rt *Runtime) vforkChild(tid int) (pid, parent int) {
	pid, err := procfs.Tgid(tid)
	if err != nil || rt.Lookup(pid) != nil {
		return 0, 0 // gone, or served: its exec ends its control connection (ControlEnded)
	}
	parent, err = procfs.PPid(pid)
	if err != nil || rt.Lookup(parent) == nil {
		return 0, 0
	}
	if same, err := sameMemory(pid, parent); err != nil || !same {
		return 0, 0 // a fork child before its hello, or one that never says hello (a raw clone)
	}
	return pid, parent
}

// claimVforkExec reports whether pid's exec is not watched yet, and marks it watched: a child
// that searches its PATH (posix_spawnp, execvp) tries one execve after another.
func (rt *Runtime) claimVforkExec(pid int) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.vforkExecs[pid] {
		return false
	}
	rt.vforkExecs[pid] = true
	return true
}

// watchVforkExec waits until vfork child pid no longer shares parent's memory, and serves the
// image it exec'd then; if it exited instead (its every exec failed), there is nothing to serve.
func (rt *Runtime) watchVforkExec(pid, parent int) {
	defer func() {
		rt.mu.Lock()
		delete(rt.vforkExecs, pid)
		rt.mu.Unlock()
	}()
	for {
		time.Sleep(execPoll)
		select {
		case <-rt.stop:
			return
		default:
		}
		same, err := sameMemory(pid, parent)
		if err != nil {
			return // gone
		}
		if !same {
			break
		}
	}
	if _, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil {
		return // it exited: a zombie has no memory to share
	}
	rt.serveImage(pid, nil, func() bool { return true })
}

// sameMemory reports whether processes a and b share one address space (kcmp KCMP_VM).
func sameMemory(a, b int) (bool, error) {
	r, _, e := unix.Syscall6(unix.SYS_KCMP, uintptr(a), uintptr(b), kcmpVM, 0, 0, 0)
	if e != 0 {
		return false, e
	}
	return r == 0, nil
}
