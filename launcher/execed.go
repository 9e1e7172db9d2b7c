package launcher

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/inject"
	"github.com/farmem/farmem/procfs"
	"github.com/farmem/farmem/runtime"
)

// An image a served process exec's that does not load farmem's shim (a static binary, or a dynamic
// program whose LD_PRELOAD was dropped, as `env -u LD_PRELOAD` and sudo do, or a setuid one) is
// entered as `farmem attach` enters a running process, the moment farmem sees the exec
// (runtime.ControlEnded: the process's control connection ended, and its old memory is gone):
// every thread seized and interrupted (inject.Seize), the agent put in and
// started, and, unlike attach, the mapping filter installed, with its forks handed over as a static
// program's are (forkServer). A filter is fine here where attach must do without: under `farmem
// run` there is no detach, and farmem's death kills the program anyway. An armed run registers the
// image's mappings and adopts its present pages while it is still frozen, so that they count
// against the cap from then on.
//
// Why after the exec and not at it (a filter that hands over execve, and the new image entered at
// its exec stop, before its first instruction, as a static program is): a dynamic process has no
// filter until the run arms, so an exec before then could not be caught, and entering it after the
// fact would be needed anyway; one way for every exec is simpler and tested by every one. What it
// costs: the new image runs uncapped from its exec until it is frozen: the runtime's poll for the
// exec (runtime.ControlEnded) and the seizing, for an image known at once not to load the shim
// (SaysHello: it is static, or its environment does not name farmem's shim and socket, or it is
// setuid), and, if it was expected to say hello and did not, the runtime's grace for that hello.
// Its forks in that moment are not served: its children run without farmem.
//
// An image running as another user than root has its userfaultfd made on a descriptor of the
// device farmem sends it (asuser.go, receiveUffdDev), and may not install the filter: it keeps
// farmem's if it inherited it from the image it replaced (a process that switched users after the
// run armed), and is otherwise served as an attached process is (serveUnfiltered). If the image
// cannot be entered (it is traced already; farmem has no CAP_SYS_ADMIN for the filter), it runs on
// untouched and uncapped, and the runtime names it on stderr with the reason; nothing of farmem's
// is left in it, and it is never stopped for it.

// imageServer enters, for one run, the images its processes exec that do not load the shim
// (runtime.ImageServer).
type imageServer struct {
	rt     *runtime.Runtime // set before the runtime starts
	img    *agentImage
	sock   string
	shim   string // the shim's path, as LD_PRELOAD names it
	agents *staticAgents
	parent *parentThread // the program's parent thread, the one that may trace the program
	// program is the pid of the program the run started, set before known is closed: only its
	// parent thread may trace it (tracer.go). Enter waits for it: a program that exec's at
	// once may say hello and exec before the launcher has stored its pid, and traced from
	// another thread its stops could be taken by its parent's wait for its end.
	program atomic.Int32
	known   chan struct{}
	// unfilteredSaid: farmem said that an image is served without the filter (serveUnfiltered).
	unfilteredSaid atomic.Bool
}

// started records the program's pid (0: it did not start).
func (s *imageServer) started(pid int) {
	s.program.Store(int32(pid))
	close(s.known)
}

// SaysHello implements runtime.ImageServer: the image is dynamic, and its loader will load the
// shim, which finds farmem's socket; not for a setuid image (AT_SECURE), whose loader ignores a
// preload named by a path.
func (s *imageServer) SaysHello(pid int) bool {
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	if err != nil {
		return false
	}
	var preload, sock string
	for _, kv := range bytes.Split(env, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("LD_PRELOAD=")); ok {
			preload = string(v)
		} else if v, ok := bytes.CutPrefix(kv, []byte("FARMEM_SOCK=")); ok {
			sock = string(v)
		}
	}
	libs := strings.FieldsFunc(preload, func(r rune) bool { return r == ':' || r == ' ' })
	if sock != s.sock || !slices.Contains(libs, s.shim) || secure(pid) {
		return false
	}
	// A process that switched to another user (su, runuser, a server dropping root) loads it
	// too: the shim's directory is readable by anyone, and farmem does what the user may not
	// (asuser.go).
	static, err := staticExe(pid)
	return err == nil && !static
}

// secure reports whether process pid's image runs in secure-execution mode (AT_SECURE: setuid,
// setgid or with file capabilities).
func secure(pid int) bool {
	auxv, err := os.ReadFile(fmt.Sprintf("/proc/%d/auxv", pid))
	if err != nil {
		return false
	}
	const atSecure = 23
	for i := 0; i+16 <= len(auxv); i += 16 {
		if binary.LittleEndian.Uint64(auxv[i:]) == atSecure {
			return binary.LittleEndian.Uint64(auxv[i+8:]) != 0
		}
	}
	return false
}

// staticExe reports whether process pid's image has no dynamic loader (no PT_INTERP).
func staticExe(pid int) (bool, error) {
	f, err := elf.Open(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}

// Enter implements runtime.ImageServer, from the thread that may trace pid.
func (s *imageServer) Enter(pid int) error {
	// An exiting process has lost its memory too, but has no image to enter: its exe is gone.
	if _, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err != nil {
		return errors.New("it exited")
	}
	enter := func() error { return s.enter(pid) }
	<-s.known
	if pid == int(s.program.Load()) {
		err := s.parent.do(enter)
		if errors.Is(err, errGone) {
			return errors.New("it exited")
		}
		return err
	}
	goruntime.LockOSThread() // the tracer, until the image is let go
	defer goruntime.UnlockOSThread()
	return enter()
}

// enter freezes pid, puts the agent in, attaches it with its filter and fork server, registers
// its memory if the run is armed, and lets it go. On failure before the agent thread runs,
// everything put in is taken out again; after, the agent is detached (it ends its thread and
// closes what it held) and its memory unmapped.
func (s *imageServer) enter(pid int) (err error) {
	g, err := inject.Seize(pid)
	if err != nil {
		if errors.Is(err, inject.ErrNotPermitted) {
			if tracer, err := procfs.TracerPid(pid); err == nil && tracer != 0 {
				return fmt.Errorf("process %d traces it, and a process has one tracer", tracer)
			}
			return notPermitted(pid)
		}
		return err
	}
	if s.SaysHello(pid) {
		// It exec'd again, into an image that loads the shim, between the runtime's look and
		// the freezing: entered too, it would say hello twice.
		g.Detach()
		return runtime.ErrSaysHello
	}
	tr := g.Leader()
	ready := s.agents.expect(pid, true)
	a := &attachment{rt: s.rt, img: s.img, sock: s.sock, agents: s.agents, pid: pid, lifeline: -1}
	started := false // the agent thread runs
	var p *runtime.Process
	defer func() {
		if err == nil {
			return
		}
		s.agents.forget(pid)
		switch {
		case started && p != nil:
			if derr := p.DetachAgent(); derr == nil {
				tr.Syscall(unix.SYS_MUNMAP, a.mem, a.memLen)
				unix.Close(a.lifeline) // its read end is closed: no signal
			} else {
				// The agent never attached: the lifeline's read end is still armed, and its
				// close would kill the program. Held, as for any process of the run.
				holdLifeline(pid, a.lifeline)
			}
			s.rt.Let(p)
		case a.mem != 0:
			a.undoInjection(tr)
			if p != nil {
				s.rt.Let(p)
			}
		}
		g.Detach()
	}()
	mem, fd, lifeline, err := injectAgent(tr, s.img, s.sock)
	if err != nil {
		if uid, ok := fsUID(pid); ok && uid != 0 && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES)) {
			return fmt.Errorf("%w (it runs as user %d)", err, uid)
		}
		return err
	}
	a.mem, a.memLen, a.lifeline = mem, agentOffset+s.img.span, lifeline
	old := s.rt.Lookup(pid)
	if p, err = s.rt.Attach(pid, fd); err != nil { // retires the old image's process
		return err
	}
	// Filters are kept across exec: one the old image had is the new one's, served on its
	// listener, and the only one an image running as another user can have.
	p.InheritFilter(old)
	p.ServeForks(forkServer(s.img, mem, s.sock, s.agents, s.parent, int(s.program.Load())))
	if _, err := runAgentEntry(tr, mem+agentOffset+s.img.startEntry); err != nil {
		return err
	}
	started = true
	unfiltered := false
	if err := waitAttached(tr, ready); err != nil {
		var en unix.Errno
		switch {
		case filterRefused(pid, err):
			unfiltered = true
		case errors.As(err, &en) && (en == unix.EPERM || en == unix.EACCES):
			return fmt.Errorf("installing its mapping filter: %w (it needs CAP_SYS_ADMIN)", err)
		case errors.As(err, &en):
			return fmt.Errorf("installing its mapping filter: %w", err)
		default:
			return fmt.Errorf("its agent: %w", err)
		}
	}
	if s.rt.Armed() {
		// Still frozen: what it holds is registered and counted before it grows further.
		p.Rescan()
		s.rt.Evictor().Kick()
	}
	holdLifeline(pid, a.lifeline)
	if unfiltered {
		s.serveUnfiltered(a)
	}
	return g.Detach()
}

// filterRefused reports whether err is the refusal of the mapping filter to process pid because
// it runs as another user than root: it may not install one without no_new_privs, which farmem
// does not set (it would change what the program's own exec of a setuid binary does).
func filterRefused(pid int, err error) bool {
	uid, ok := fsUID(pid)
	return ok && uid != 0 && (errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES))
}

// serveUnfiltered serves an entered image that has no mapping filter (it runs as another user,
// and did not inherit farmem's) as `farmem attach` serves a process: what it maps is found by
// the rescan, and the fork children its filter would have handed over at their birth are
// entered once seen among its children, through their FORK events, a few milliseconds after
// (attachment.enterChildren); until then, and for one orphaned before it is seen, the child is
// served on its FORK event alone.
func (s *imageServer) serveUnfiltered(a *attachment) {
	s.rt.Stats.Unfiltered.Add(1)
	if s.unfilteredSaid.CompareAndSwap(false, true) {
		uid, _ := fsUID(a.pid)
		fmt.Fprintf(os.Stderr, "farmem: process %d runs as user %d, which may not install the mapping filter without "+
			"no_new_privs (farmem does not set it): it is served without the filter: what it maps is found by polling, and "+
			"the cap may be overshot until it is; its fork children are entered a few milliseconds after their birth\n", a.pid, uid)
	}
	a.known = map[int]uint64{}
	go func() {
		tick := time.NewTicker(childPoll)
		defer tick.Stop()
		for i := 1; ; i++ {
			<-tick.C
			a.enterChildren()
			// Until no process carrying its agent is served any more: the image and every
			// child entered since (each may fork) are gone, or exec'd.
			if i%lineageCheck == 0 && !a.lineageServed() {
				return
			}
		}
	}()
}

// lineageCheck is how many childPoll ticks pass between serveUnfiltered's looks for a process
// still carrying the image's agent.
const lineageCheck = 50

// lineageServed reports whether a process carrying a's agent is still served.
func (a *attachment) lineageServed() bool {
	for _, p := range a.rt.Processes() {
		if carriesAgent(p.Pid(), a.mem+agentOffset+a.img.params, a.sock) {
			return true
		}
	}
	return false
}

// holdLifeline holds the write end of process pid's lifeline until pid exits (or farmem does,
// which is when the kernel's close of it kills pid).
func holdLifeline(pid, lifeline int) {
	pfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		unix.Close(lifeline) // it is gone already
		return
	}
	go func() {
		defer unix.Close(lifeline)
		defer unix.Close(pfd)
		fds := []unix.PollFd{{Fd: int32(pfd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err != unix.EINTR {
				return
			}
		}
	}()
}

// fsUID returns the user id process pid accesses files as (the fourth of /proc/PID/status's Uid).
func fsUID(pid int) (int, bool) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, false
	}
	for _, l := range strings.Split(string(status), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			f := strings.Fields(v)
			if len(f) < 4 {
				return 0, false
			}
			uid, err := strconv.Atoi(f[3])
			return uid, err == nil
		}
	}
	return 0, false
}
