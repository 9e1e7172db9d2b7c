package inject

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"

	"golang.org/x/sys/unix"
)

// Group is a running process that farmem stopped, every thread of it, to work in it (farmem
// attach): PTRACE_SEIZE and PTRACE_INTERRUPT of each thread, the way CRIU freezes a process it
// dumps. Its Leader is a Tracee like Start's; the other threads are only held stopped, so that
// nothing of the program runs while farmem changes what the process holds. Detach lets them all
// go. Seizing sets no trace option: threads and processes the held ones make while farmem works
// are not traced, and farmem's agent thread runs untraced.
//
// A thread stopped in a system call (a read, a futex wait) is interrupted out of it, and the
// kernel restarts the call when the thread goes on (Syscall restores the registers that say
// so). A signal that stops a thread before farmem's interrupt does is kept and sent to that
// thread again once it is let go.
type Group struct {
	pid     int
	leader  *Tracee
	threads map[int][]unix.Signal // every held thread but the leader -> the signals kept for it
}

// ErrNotPermitted is wrapped by Seize's error when the kernel refuses to let farmem trace the
// process (Yama's ptrace_scope, another user's process, no CAP_SYS_PTRACE, already traced).
var ErrNotPermitted = errors.New("not permitted to trace it")

// Seize stops every thread of the running process pid but those in skip (farmem's own agent
// thread, which must go on serving farmem meanwhile), traced by the calling thread, which must be
// locked to its goroutine (runtime.LockOSThread) until Detach. On failure nothing stays held.
func Seize(pid int, skip ...int) (*Group, error) {
	g := &Group{pid: pid, threads: map[int][]unix.Signal{}}
	held := map[int]bool{}
	var order []int
	fail := func(err error) (*Group, error) {
		for _, tid := range order {
			unix.PtraceDetach(tid)
		}
		return nil, err
	}
	// Threads the held ones were making as they were seized appear in the next listing: list
	// again until one finds none new. A held thread makes no more.
	for {
		tids, err := threadsOf(pid)
		if err != nil {
			return fail(err)
		}
		fresh := 0
		for _, tid := range tids {
			if held[tid] || slices.Contains(skip, tid) {
				continue
			}
			if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_SEIZE, uintptr(tid), 0, 0, 0, 0); e != 0 {
				if e == unix.ESRCH {
					continue // it exited meanwhile
				}
				if e == unix.EPERM {
					return fail(fmt.Errorf("PTRACE_SEIZE of thread %d: %w (%v)", tid, ErrNotPermitted, e))
				}
				return fail(fmt.Errorf("inject: PTRACE_SEIZE of thread %d: %w", tid, e))
			}
			held[tid] = true
			order = append(order, tid)
			fresh++
			if err := unix.PtraceInterrupt(tid); err != nil && err != unix.ESRCH {
				return fail(fmt.Errorf("inject: PTRACE_INTERRUPT of thread %d: %w", tid, err))
			}
			kept, err := waitInterrupted(tid)
			if err != nil {
				var ended *ExitedError
				if errors.As(err, &ended) && tid == pid {
					// The process ended as it was seized, and its status, reported to farmem's
					// tracing thread, was taken here: the caller, maybe its parent, needs it.
					ended.Pid = pid
					return fail(err)
				}
				if errors.Is(err, errThreadGone) || errors.As(err, &ended) {
					delete(held, tid)
					continue
				}
				return fail(err)
			}
			if tid == pid {
				g.leader = &Tracee{pid: pid, tracer: unix.Gettid(), kept: kept}
			} else {
				g.threads[tid] = kept
			}
		}
		if fresh == 0 {
			break
		}
	}
	if g.leader == nil {
		return fail(fmt.Errorf("process %d has no main thread left to work in (it exited, or its main thread did)", pid))
	}
	return g, nil
}

var errThreadGone = errors.New("the thread exited")

// waitInterrupted waits for seized thread tid's interrupt stop and returns the signals that
// stopped it first (each suppressed, to be sent again at Detach); an *ExitedError if it ended
// instead, errThreadGone if it was gone.
func waitInterrupted(tid int) ([]unix.Signal, error) {
	var kept []unix.Signal
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(tid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err == unix.ECHILD {
			return nil, errThreadGone
		}
		if err != nil {
			return nil, fmt.Errorf("inject: wait for thread %d: %w", tid, err)
		}
		if ws.Exited() || ws.Signaled() {
			return nil, &ExitedError{Pid: tid, Status: ws}
		}
		if !ws.Stopped() {
			continue
		}
		if ws.TrapCause() == unix.PTRACE_EVENT_STOP {
			// Our interrupt's stop (SIGTRAP), or a group stop (the process was stopped by a
			// signal): either way the thread is held here until Detach.
			return kept, nil
		}
		// A signal reached it first: kept, and the thread goes on to the interrupt's stop.
		kept = append(kept, ws.StopSignal())
		if err := unix.PtraceCont(tid, 0); err != nil {
			if err == unix.ESRCH {
				return nil, errThreadGone
			}
			return nil, fmt.Errorf("inject: PTRACE_CONT of thread %d: %w", tid, err)
		}
	}
}

// threadsOf lists the threads of pid, the main thread first.
func threadsOf(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, fmt.Errorf("process %d: %w", pid, err)
	}
	out := []int{pid}
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil && tid != pid {
			out = append(out, tid)
		}
	}
	return out, nil
}

// Leader is the process's main thread, in which farmem makes system calls and runs code.
func (g *Group) Leader() *Tracee { return g.leader }

// Pid is the process's id.
func (g *Group) Pid() int { return g.pid }

// Detach lets every held thread go, each with the signals kept for it sent again. The leader's
// ended error, if it was killed meanwhile, is returned.
func (g *Group) Detach() error {
	var first error
	for tid, kept := range g.threads {
		if unix.PtraceDetach(tid) == unix.ESRCH {
			// Killed meanwhile: its end is reported to us, and its process's main thread is
			// not reported to its parent until it is reaped.
			var ws unix.WaitStatus
			unix.Wait4(tid, &ws, unix.WALL|unix.WNOHANG, nil)
			continue
		}
		for _, s := range kept {
			unix.Tgkill(g.pid, tid, s)
		}
	}
	g.threads = nil
	if g.leader.ended != nil || g.leader.detached {
		return g.leader.ended
	}
	kept := g.leader.kept
	g.leader.kept = nil
	if err := g.leader.Detach(); err != nil {
		first = err
	}
	for _, s := range kept {
		unix.Tgkill(g.pid, g.pid, s)
	}
	return first
}
