package runtime

import (
	"errors"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Lifelines of farmem's making, for fork children that have none of their own.
//
// Every process farmem serves holds a lifeline, a pipe whose read end SIGKILLs it once no writer
// is left, and farmem holds the only write end: if farmem dies, the process dies rather than read
// zeros where its evicted pages were (docs/DESIGN.md, "Exit and death"). The shim makes it in the
// process and hands farmem the write end with its hello. A fork child that says no hello has
// none: one made by a raw clone (no atfork handler runs) in a process that has no mapping filter
// to hand its forks to farmem (one running as another user, served without it). It is served on
// its FORK event alone, on a uffd only farmem holds, and the lifeline it inherited signals its
// parent. So once farmem finds such a child (below), it makes it a lifeline itself: the
// owner of a pipe's read end, whom its O_ASYNC signal goes to, can be any process (F_SETOWN, by
// root), and the read end can stay in farmem. When farmem dies the kernel releases its open
// files last descriptor first (close_files queues each release as task work, which runs last
// queued first), so the write end, kept on the higher descriptor, goes while the read end is
// still open to be signalled; the other way round, the read end's signal goes with it.
// TestAsUserSilentForkChildDiesWithFarmem fails if a kernel changes that. farmem lets a
// lifeline go, once its process has exited, read end first, which signals nobody.
//
// A process is guarded when it is not served by pid and its vDSO is where that of a fork child
// served on its FORK event alone, with no pid yet, is (its parent's, which fork copies; an exec
// places it anew). That is looked at as the kernel's process events tell of a fork by a served
// process, for a moment after (guardForked, where farmem may listen to them), whoever the parent
// is by then (it may have exited at once, and have been retired before farmem reads the event:
// servedOfLate), and when the rescan finds one among a served process's children. A child that
// says its hello later has two lifelines, which is harmless. Not guarded: the children such a
// child forks, and, where farmem hears no process events, one whose parent was gone before the
// rescan looked (it is no longer among the served processes' children).

// lifeline is one of farmem's making: the pipe's two ends, and the pidfd of the process it
// guards, which says when it has exited.
type lifeline struct{ r, w, pidfd int }

// lifelines are the runtime's lifelines of farmem's making. Each has a goroutine that lets it go
// once its process has exited, or once the runtime closes (stop).
type lifelines struct {
	mu   sync.Mutex
	byID map[int]*lifeline // protected by mu; by the pid each guards; nil once closed
	stop int               // an eventfd, made readable by close: every goroutine lets go
	wg   sync.WaitGroup
}

func newLifelines() *lifelines { return &lifelines{byID: map[int]*lifeline{}, stop: -1} }

// guardIfSilent gives process c a lifeline of farmem's making if it may be a fork child served
// on its FORK event alone (see above), and reports whether c has one.
func (rt *Runtime) guardIfSilent(c int) bool {
	if rt.Lookup(c) != nil {
		return false
	}
	return rt.lifelines.guard(c, func() bool {
		v, err := vdso(c) // after the pidfd is open: c is the process it names, or gone
		return err == nil && rt.anyServed(func(p *Process) bool { return silent(p) && p.probe == v })
	})
}

// silent reports whether p is a fork child served on its FORK event with no pid yet: one that
// has not said hello, or never will.
func silent(p *Process) bool { return p.forkParent != nil && p.Pid() == 0 }

// forkGuardWait is how long guardForked looks, every forkGuardStep, for a process just forked
// to turn out to be a fork child with no lifeline: its parent's fault thread applies its FORK
// event (which clones the parent's page table) a moment after the kernel tells of the fork, or
// the child says its hello.
const (
	forkGuardStep = 20 * time.Millisecond
	forkGuardWait = 500 * time.Millisecond
)

// guardForked guards c, a process a served process has just forked, if it turns out to be a fork
// child that may have no lifeline; it stops looking once c says its hello or is gone.
func (rt *Runtime) guardForked(c int) {
	for waited := time.Duration(0); waited < forkGuardWait; waited += forkGuardStep {
		time.Sleep(forkGuardStep)
		if rt.Lookup(c) != nil || unix.Kill(c, 0) == unix.ESRCH {
			return // it said hello, or it is gone
		}
		if rt.anyServed(silent) && rt.guardIfSilent(c) {
			return
		}
	}
}

// guard makes process pid a lifeline if needs says so once pid's pidfd is open, unless it has
// one of farmem's making already, and reports whether it has one. Failing (the process is gone,
// or farmem is out of descriptors), it makes none: the process runs as before.
func (ls *lifelines) guard(pid int, needs func() bool) bool {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.byID == nil {
		return false
	}
	if ls.byID[pid] != nil {
		return true
	}
	if ls.stop < 0 {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			return false
		}
		ls.stop = fd
	}
	l := &lifeline{r: -1, w: -1, pidfd: -1}
	if err := l.make(pid, needs); err != nil {
		l.close()
		return false
	}
	ls.byID[pid] = l
	ls.wg.Add(1)
	go func() {
		defer ls.wg.Done()
		fds := []unix.PollFd{{Fd: int32(l.pidfd), Events: unix.POLLIN}, {Fd: int32(ls.stop), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err != unix.EINTR {
				break
			}
		}
		ls.mu.Lock()
		if ls.byID != nil {
			delete(ls.byID, pid)
		}
		ls.mu.Unlock()
		l.close()
	}()
	return true
}

// errNotNeeded: the process guard was asked about needs no lifeline.
var errNotNeeded = errors.New("no lifeline needed")

// make opens the pidfd of process pid and, if needs says so then, the pipe, its write end on a
// higher descriptor than its read end, which is set to SIGKILL pid once no writer is left.
func (l *lifeline) make(pid int, needs func() bool) error {
	var err error
	if l.pidfd, err = unix.PidfdOpen(pid, 0); err != nil {
		return err
	}
	if !needs() {
		return errNotNeeded
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		return err
	}
	l.r = p[0]
	l.w, err = unix.FcntlInt(uintptr(p[1]), unix.F_DUPFD_CLOEXEC, max(p[0], p[1])+1)
	unix.Close(p[1])
	if err != nil {
		return err
	}
	if _, err := unix.FcntlInt(uintptr(l.r), unix.F_SETOWN, pid); err != nil {
		return err
	}
	if _, err := unix.FcntlInt(uintptr(l.r), unix.F_SETSIG, int(unix.SIGKILL)); err != nil {
		return err
	}
	if _, err := unix.FcntlInt(uintptr(l.r), unix.F_SETFL, unix.O_ASYNC|unix.O_NONBLOCK); err != nil {
		return err
	}
	// The owner is a pid: it names the process the pidfd does only while that one lives.
	return unix.PidfdSendSignal(l.pidfd, 0, nil, 0)
}

// close lets the lifeline go without signalling: the read end first.
func (l *lifeline) close() {
	for _, fd := range []*int{&l.r, &l.w, &l.pidfd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// close lets every lifeline go, and waits until each has: the runtime is closing, and farmem
// may exit next (closing the write ends first, which would signal).
func (ls *lifelines) close() {
	ls.mu.Lock()
	ls.byID = nil
	if ls.stop >= 0 {
		var one [8]byte
		one[0] = 1
		unix.Write(ls.stop, one[:])
	}
	ls.mu.Unlock()
	ls.wg.Wait()
	if ls.stop >= 0 {
		unix.Close(ls.stop)
		ls.stop = -1
	}
}
