package inject

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/procfs"
)

// ErrNoFork is returned by CatchFork when the thread's call ended without a new process (the
// kernel refused the fork: EAGAIN, ENOMEM; or the thread was killed in it before a child was
// born).
var ErrNoFork = errors.New("inject: the thread made no new process")

// forkWait bounds how long CatchFork waits for the thread's fork.
const forkWait = 10 * time.Second

// CatchFork catches the child of a fork that thread tid is about to make, stopped at its birth,
// before it runs an instruction of its own: it traces tid (PTRACE_SEIZE, with fork, vfork and
// clone events), calls proceed, which must let the thread's fork go on (tid is held in the fork
// call by whoever calls CatchFork: a seccomp user notification), lets tid go again once the
// child exists, and returns the child as a Tracee of the calling thread, which must be locked
// (see the package doc). A signal that stops tid meanwhile is delivered to it as it goes on.
// If proceed fails, tid is let go and proceed's error returned. Should the caller's process die
// before it lets them go, tid and the child are killed (PTRACE_O_EXITKILL, which the child
// inherits): the child, let go by a dead tracer before farmem has put anything in it, would run
// on without the lifeline that ends it with farmem, reading zeros where its evicted pages were.
func CatchFork(tid int, proceed func() error) (*Tracee, error) {
	const opts = unix.PTRACE_O_TRACEFORK | unix.PTRACE_O_TRACEVFORK | unix.PTRACE_O_TRACECLONE | unix.PTRACE_O_EXITKILL
	if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(tid), 0, opts, 0, 0); e != 0 {
		return nil, fmt.Errorf("inject: PTRACE_SEIZE of thread %d: %w", tid, e)
	}
	if err := proceed(); err != nil {
		release(tid)
		return nil, err
	}
	// The fork either stops tid at its event (after the child exists, before the call
	// returns), or fails and returns to the program with no stop. To see the second, tid is
	// interrupted (PTRACE_INTERRUPT) once it is blocked in another call, or has run for a while:
	// the interrupt stops it only on its way back to user space, after any fork event. A fork
	// the interrupt itself cuts short is restarted by the kernel, and held by the filter again.
	patience := time.Now().Add(time.Second)
	deadline := time.Now().Add(forkWait)
	interrupted := false
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(tid, &ws, unix.WALL|unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			killBornStopped()
			return nil, fmt.Errorf("inject: wait for thread %d: %w", tid, err)
		}
		if pid == tid && (ws.Exited() || ws.Signaled()) {
			if child := killBornStopped(); child != 0 {
				return nil, fmt.Errorf("inject: thread %d was killed in its fork (its process exiting), and its child %d, "+
					"whose birth ptrace never reported, was killed before it ran", tid, child)
			}
			return nil, ErrNoFork
		}
		if pid == tid && ws.Stopped() {
			switch ws.TrapCause() {
			case unix.PTRACE_EVENT_FORK, unix.PTRACE_EVENT_VFORK, unix.PTRACE_EVENT_CLONE:
				msg, err := unix.PtraceGetEventMsg(tid)
				unix.PtraceDetach(tid)
				if err != nil {
					return nil, fmt.Errorf("inject: PTRACE_GETEVENTMSG of thread %d: %w", tid, err)
				}
				return waitChild(int(msg))
			case unix.PTRACE_EVENT_STOP:
				if interrupted && ws.StopSignal() == unix.SIGTRAP {
					unix.PtraceDetach(tid) // our interrupt's stop: the call made no child
					return nil, ErrNoFork
				}
				unix.PtraceCont(tid, 0) // a group stop: it goes on, as it would untraced
			default:
				unix.PtraceCont(tid, int(ws.StopSignal())) // a signal: delivered
			}
			continue
		}
		if now := time.Now(); !interrupted && (now.After(patience) || inOtherCall(tid)) {
			if err := unix.PtraceInterrupt(tid); err != nil {
				killBornStopped()
				return nil, fmt.Errorf("inject: PTRACE_INTERRUPT of thread %d: %w", tid, err)
			}
			interrupted = true
		}
		if time.Now().After(deadline) {
			release(tid)
			return nil, fmt.Errorf("inject: thread %d did not fork within %v", tid, forkWait)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

// waitChild waits for a new child's first stop (auto-attached by a fork event) and returns it.
func waitChild(pid int) (*Tracee, error) {
	t := &Tracee{pid: pid, tracer: unix.Gettid()}
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("inject: wait for the new process %d: %w", pid, err)
		}
		if ws.Exited() || ws.Signaled() {
			return nil, &ExitedError{Pid: pid, Status: ws}
		}
		if ws.Stopped() {
			if ws.StopSignal() != unix.SIGTRAP && ws.StopSignal() != unix.SIGSTOP {
				t.kept = append(t.kept, ws.StopSignal())
			}
			// It inherited its parent's trace options: the threads and processes it makes
			// while farmem works in it are not farmem's to trace.
			if err := unix.PtraceSetOptions(pid, 0); err != nil {
				return nil, t.fail("PTRACE_SETOPTIONS", err)
			}
			return t, nil
		}
	}
}

// killBornStopped kills the child a fork may have made as its thread, traced by the calling
// thread, was killed in it (another thread's exit ended its process). The kernel attaches such a
// child to the tracer and stops it at its birth, but stops no thread being killed for the fork
// event, so its pid never comes, and nobody would enter it or let it go: it would stay stopped,
// and served on its FORK event, until farmem's exit (PTRACE_O_EXITKILL). It is found as the
// process the calling thread traces (its status's TracerPid): CatchFork's caller is locked to the
// thread, which traces nothing else once the forking thread is gone. It never ran an
// instruction.
func killBornStopped() (child int) {
	me := unix.Gettid()
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		if tracer, err := procfs.TracerPid(pid); err != nil || tracer != me {
			continue
		}
		unix.Kill(pid, unix.SIGKILL)
		for {
			var ws unix.WaitStatus
			if _, err := unix.Wait4(pid, &ws, unix.WALL, nil); err != unix.EINTR && (err != nil || ws.Exited() || ws.Signaled()) {
				break
			}
		}
		child = pid
	}
	return child
}

// release lets a seized thread go: interrupted to a stop, then detached. A child its fork made
// meanwhile is farmem's to enter, and nobody will: it is killed before it runs, also where the
// thread can no longer be interrupted (it is exiting with its process, its fork event never
// reported), which would otherwise leave the child stopped until farmem's end, holding copies of
// its parent's descriptors (the agent's socket, whose end farmem's requests wait for).
func release(tid int) {
	if unix.PtraceInterrupt(tid) != nil {
		killBornStopped()
		return
	}
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(tid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || ws.Exited() || ws.Signaled() {
			return
		}
		sig := 0
		switch {
		case ws.TrapCause() == unix.PTRACE_EVENT_FORK || ws.TrapCause() == unix.PTRACE_EVENT_VFORK || ws.TrapCause() == unix.PTRACE_EVENT_CLONE:
			if msg, err := unix.PtraceGetEventMsg(tid); err == nil {
				if c, err := waitChild(int(msg)); err == nil {
					c.Kill()
				}
			}
		case ws.TrapCause() != unix.PTRACE_EVENT_STOP && ws.StopSignal() != unix.SIGTRAP:
			sig = int(ws.StopSignal()) // a signal stopped it first: deliver it as it goes
		}
		unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, uintptr(tid), 0, uintptr(sig), 0, 0)
		return
	}
}

// inOtherCall reports whether thread tid is blocked in a system call other than fork, vfork,
// clone and clone3, by /proc/tid/syscall ("running" while it runs, in user space or the kernel).
func inOtherCall(tid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/syscall", tid))
	if err != nil {
		return false
	}
	nr, err := strconv.Atoi(strings.Fields(string(b) + " x")[0])
	if err != nil {
		return false // running
	}
	switch nr {
	case unix.SYS_FORK, unix.SYS_VFORK, unix.SYS_CLONE, unix.SYS_CLONE3:
		return false
	}
	return true
}
