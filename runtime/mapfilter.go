package runtime

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/procfs"
	"github.com/farmem/farmem/seccomp"
)

// The mapping filter: how an armed run sees the mappings LD_PRELOAD cannot.
//
// glibc's malloc maps its large blocks, reserves its thread arenas and grows its main heap with
// internal mmap and brk calls that never reach the shim's interposed mmap. The rescan finds them
// within a poll, but what the program writes there meanwhile is in the kernel's count with no
// fault to hold it back: a program filling fresh malloc blocks can put a whole burst over its
// cap. So once armed, each process's agent installs a seccomp filter (launcher/shim/shim.c) that
// turns those calls into user notifications; serveMapping has the agent make the call,
// registers the new range, and only then answers the caller, so the program returns from mmap
// or brk into memory that is already ours. A glibc arena's PROT_NONE reservation is registered
// too: registration survives the mprotect that later opens it for writing, while brk growth
// never joins the registered heap (the new part is a VMA of its own).
//
// A statically linked program has no interposed mmap at all: its agent, injected by the launcher,
// installs the filter before the program runs (Process.InstallFilter), and the filter also hands
// over its forks (ServeForks), whose children the launcher enters. Until the run arms, its calls
// are answered CONTINUE.
//
// Cost: a notification and an agent round trip per call, paid only once armed and only by mmaps
// of at least MinRegister bytes and by brk. Without the privilege to install a filter (seccomp
// needs CAP_SYS_ADMIN, and farmem does not set no_new_privs behind the program's back) the run
// goes on with the rescan alone and the evictor's burst reserve.

// filterMappings has p's agent install the mapping filter, once, and serves its notifications
// until the run stops or every process the filter applies to is gone. It is called when the run
// arms and for each process whose agent says hello after. A fork child or an exec'd image
// inherits its parent's filter, and the kernel allows one listener per chain of filters (EBUSY):
// it is served on the listener of the process that installed it, which finds it by its threads
// (answering CONTINUE until it said hello).
func (rt *Runtime) filterMappings(p *Process) {
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	if a == nil || !p.filtered.CompareAndSwap(false, true) {
		return
	}
	if rt.cfg.NoFilter {
		close(p.filterDone) // InstallFilter: nothing to install, and nothing failed
		return
	}
	// Forks are handed over by every process's filter, not only by a static program's: an image
	// a dynamic process exec's without the shim inherits this filter and can get no other (one
	// listener per chain), and its forks must reach its fork server (ServeForks) once farmem has
	// entered it (ControlEnded). A process with no fork server has its forks let through
	// (serveFork): one notification each, and clone3 fails with ENOSYS, as under docker's
	// default filter (libcs fall back to clone).
	fd, err := a.Filter(rt.cfg.MinRegister, true)
	if errors.Is(err, unix.EBUSY) || err != nil && p.filterInherited.Load() {
		// A filter inherited from a parent has a listener already: ours, serving it. A process
		// that may not install one (it runs as another user) is EACCES even so.
		err = nil
		fd = -1
	}
	p.filterErr = err
	close(p.filterDone)
	if err != nil {
		if p.forks.Load() == nil {
			rt.Stats.Unfiltered.Add(1) // a process with a fork server is not served without
		}
		if p.forks.Load() == nil && rt.filterFailed.CompareAndSwap(false, true) {
			fmt.Fprintf(os.Stderr, "farmem: %s: the mappings made out of the shim's sight (glibc's internal ones; in a static program, all) are found by polling, and the cap may be overshot until they are\n", filterRefusal(p.Pid(), err))
		}
		return
	}
	if fd < 0 {
		return
	}
	rt.finished.Add(1)
	go func() {
		defer rt.finished.Done()
		defer unix.Close(fd)
		rt.serveNotifications(fd)
	}()
}

// InheritFilter records that p came with from's mapping filter (from: the image p replaced with
// an exec, or the parent p forked from), if from has one of farmem's: filters are kept across
// exec and fork, and served on the listener of the process that installed it. A child served on
// its FORK event inherits from the parent of that event, whatever from is: a child whose parent
// exited before its hello names init as its parent.
func (p *Process) InheritFilter(from *Process) {
	if p.forkParent != nil {
		from = p.forkParent
	}
	switch {
	case from == nil:
	case from.filterInherited.Load():
		p.filterInherited.Store(true) // a fork child that exec'd before its agent said hello, say
	case from.filtered.Load():
		select {
		case <-from.filterDone:
			if from.filterErr == nil {
				p.filterInherited.Store(true)
			}
		default: // being installed as it exec'd or forked: not known
		}
	}
}

// ForkServer enters a fork child of a process that cannot do it itself: tid is the thread about
// to fork, held in its fork call; proceed lets the fork go on. An error returned before proceed
// was called refuses the fork (it fails with ENOSYS); after, the child is the server's to
// stop.
type ForkServer func(tid int, proceed func() error) error

// ServeForks hands the process's forks to f once its filter is installed (InstallFilter); it must
// be called before the process's agent says hello, and its fork children inherit f. It is for a
// process with no shim (a statically linked program): its child would otherwise be served on the
// FORK event's uffd alone, whose only copy farmem holds, with nobody to say its hello, so that
// farmem's death, or the retirement of a child that never said hello, would leave it reading
// zeros where its evicted pages were. Threads and vfork (one mm) are not forks.
func (p *Process) ServeForks(f ForkServer) { p.forks.Store(&f) }

// InstallFilter has the process's agent install the mapping filter now, armed or not, unless it
// was (SetAgent installs it in an armed run), and returns how the installation went. Before the
// run arms the filter lets every call through (serveMapping), at the cost of a notification.
func (p *Process) InstallFilter() error {
	p.rt.filterMappings(p)
	if !p.filtered.Load() {
		return errors.New("the process has no agent")
	}
	<-p.filterDone // the arming may be installing it right now
	return p.filterErr
}

// serveFork answers a fork the filter handed over: let through, unless the process has a fork
// server (ServeForks), or it is a raw fork (RawFork) and the run has a server for those
// (Config.RawForks): the server enters the child or refuses the fork.
func (rt *Runtime) serveFork(fd int, n seccomp.Notif) {
	p := rt.lookupThread(int(n.Pid))
	var f *ForkServer
	if p != nil {
		f = p.forks.Load()
		if f == nil && rt.cfg.RawForks != nil && RawFork(n.Data) {
			f = &rt.cfg.RawForks
		}
	}
	if f == nil {
		seccomp.Respond(fd, &seccomp.Resp{ID: n.ID, Flags: seccomp.FlagContinue})
		return
	}
	// No batch moves the process's pages while it forks (Process.forkGate). A move under way
	// ends first: it waits on nothing of the forking thread's, held here before its fork.
	p.forkGate.Lock()
	defer p.forkGate.Unlock()
	proceeded := false
	var cont error // the answer that let the fork go on
	err := (*f)(int(n.Pid), func() error {
		proceeded = true
		cont = seccomp.Respond(fd, &seccomp.Resp{ID: n.ID, Flags: seccomp.FlagContinue})
		return cont
	})
	if proceeded {
		// ENOENT: the forking thread had left its call before the answer (as below): no fork.
		if err != nil && !errors.Is(cont, unix.ENOENT) {
			fmt.Fprintf(os.Stderr, "farmem: process %d forked, and its child could not be served: %v\n", p.Pid(), err)
		}
		return
	}
	if rerr := seccomp.Respond(fd, &seccomp.Resp{ID: n.ID, Error: -int32(unix.ENOSYS)}); errors.Is(rerr, unix.ENOENT) || errors.Is(err, unix.ESRCH) {
		// The forking thread left its call while farmem tried to take its child, or was gone
		// by the time farmem traced it (ESRCH): killed with its process (an exit while another
		// thread forks), or interrupted by a signal, and then the call is made again. No fork
		// was refused: nothing to say.
		return
	}
	if p.forkSaid.CompareAndSwap(false, true) {
		fmt.Fprintf(os.Stderr, "farmem: process %d tried to fork, and farmem could not take its child (%v): its forks fail (ENOSYS)\n", p.Pid(), err)
	}
}

// RawFork reports whether a fork the filter handed over (fork, or clone without CLONE_VM) is made
// by the system call itself rather than by libc's fork(), which runs the shim's atfork handlers:
// glibc's fork() clones with CLONE_CHILD_SETTID and CLONE_CHILD_CLEARTID (the child's thread id
// kept in its thread descriptor), a raw clone(SIGCHLD) or fork system call does not. glibc's
// _Fork() clones as fork() does and runs no atfork handler: the shim interposes it and re-arms its
// child itself.
func RawFork(call seccomp.Data) bool {
	const libcFork = unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID
	return call.Nr == unix.SYS_FORK || call.Nr == unix.SYS_CLONE && call.Args[0]&libcFork != libcFork
}

func (rt *Runtime) serveNotifications(fd int) {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		select {
		case <-rt.stop:
			return
		default:
		}
		n, err := unix.Poll(pfd, 100)
		if errors.Is(err, unix.EINTR) || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return
		}
		if pfd[0].Revents&unix.POLLHUP != 0 {
			return // every process the filter applied to is gone
		}
		var call seccomp.Notif
		if err := seccomp.Receive(fd, &call); err != nil {
			continue // ENOENT: the caller was interrupted meanwhile
		}
		switch call.Data.Nr {
		case unix.SYS_FORK, unix.SYS_CLONE:
			go rt.serveFork(fd, call) // the server waits for the child
			continue
		case unix.SYS_EXECVE, unix.SYS_EXECVEAT:
			go rt.serveExec(fd, call) // a vfork child's exec is watched
			continue
		}
		// Each on its own: an agent round trip must not hold up other processes' calls, and a
		// fork child's agent is itself filtered (its calls are answered CONTINUE below).
		go rt.serveMapping(fd, call)
	}
}

// serveMapping answers one notified mmap or brk.
func (rt *Runtime) serveMapping(fd int, n seccomp.Notif) {
	resp := seccomp.Resp{ID: n.ID, Flags: seccomp.FlagContinue}
	answered := false
	defer func() {
		if !answered {
			seccomp.Respond(fd, &resp)
		}
	}()
	p := rt.lookupThread(int(n.Pid))
	if p == nil || !rt.Armed() || int32(n.Pid) == p.agentTid.Load() {
		return // unknown (exec'd image before its hello), not yet armed, or the agent itself
	}
	if n.Data.Nr == unix.SYS_MMAP {
		// One at a time, from the check that the caller still waits to its answer. A signal
		// (a Go program's preemption signal, often) may interrupt the caller after that check;
		// it makes the call again, and that second call, served first, would hand it memory
		// that this call's mmap (MAP_FIXED: over it) or its undo then replaced.
		p.mapMu.Lock()
		defer p.mapMu.Unlock()
	}
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	if a == nil || !seccomp.IDValid(fd, n.ID) {
		return
	}
	var err error
	switch n.Data.Nr {
	case unix.SYS_MMAP:
		var addr int64
		addr, err = a.Syscall(unix.SYS_MMAP, n.Data.Args)
		if err != nil {
			return // the agent is gone, and its process with it: the call was not made
		}
		resp = seccomp.Resp{ID: n.ID, Val: addr}
		if addr < 0 && addr > -4096 {
			resp = seccomp.Resp{ID: n.ID, Error: int32(addr)}
			return
		}
		if n.Data.Args[3]&unix.MAP_FIXED != 0 {
			// It replaced whatever was there (a Go heap's reservation, registered when it was
			// made), and the UNMAP event that says so is read before the call returns but
			// handled by the fault thread in its own time: a registration of the same range
			// still on record would make Register skip this one, leaving the new memory
			// unregistered once the event is handled.
			p.forgetRange(uint64(addr), uint64(addr)+pageUp(n.Data.Args[1]))
		}
		p.Register(uint64(addr), pageUp(n.Data.Args[1]))
		rt.Stats.MappingsSeen.Add(1)
		if seccomp.Respond(fd, &resp) != nil && n.Data.Args[3]&unix.MAP_FIXED == 0 {
			// The caller was interrupted and will make the call again: undo ours. Not a
			// MAP_FIXED one: the call made again replaces it, where an unmap would leave a
			// hole in what the program had there (a Go heap's reservation).
			a.Syscall(unix.SYS_MUNMAP, [6]uint64{uint64(addr), n.Data.Args[1]})
		}
		answered = true
	case unix.SYS_BRK:
		// Once the filter is in, every brk of the process is made here, one at a time (the
		// agent's lock), so the break it left is the one the next call starts from.
		p.brkMu.Lock()
		defer p.brkMu.Unlock()
		old := p.brk
		if old == 0 {
			if old, err = a.Syscall(unix.SYS_BRK, [6]uint64{}); err != nil {
				return
			}
		}
		brk, err := a.Syscall(unix.SYS_BRK, n.Data.Args)
		if err != nil {
			return
		}
		p.brk = brk
		resp = seccomp.Resp{ID: n.ID, Val: brk}
		if lo, hi := pageUp(uint64(old)), pageUp(uint64(brk)); hi > lo {
			p.Register(lo, hi-lo)
			rt.Stats.MappingsSeen.Add(1)
		}
		// brk is idempotent: a caller interrupted meanwhile simply makes it again.
	}
}

// lookupThread returns the process thread tid belongs to.
func (rt *Runtime) lookupThread(tid int) *Process {
	if p := rt.Lookup(tid); p != nil {
		return p // the main thread
	}
	tgid, err := procfs.Tgid(tid)
	if err != nil {
		return nil
	}
	return rt.Lookup(tgid)
}

// filterRefusal says why process pid's agent could not install the mapping filter. A process
// running as another user than root may not without no_new_privs, which farmem does not set: it
// would change what the program's own exec of a setuid binary does.
func filterRefusal(pid int, err error) string {
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		if uid, ok := effectiveUID(pid); ok && uid != 0 {
			return fmt.Sprintf("process %d runs as user %d, which may not install the mapping filter without no_new_privs (farmem does not set it): it is served without the filter", pid, uid)
		}
	}
	return fmt.Sprintf("cannot install the mapping filter (%v)", err)
}

// effectiveUID returns process pid's effective user id (the second of /proc/PID/status's Uid).
func effectiveUID(pid int) (int, bool) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			if f := strings.Fields(v); len(f) >= 2 {
				uid, err := strconv.Atoi(f[1])
				return uid, err == nil
			}
		}
	}
	return 0, false
}
