package launcher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/inject"
	"github.com/farmem/farmem/procfs"
	"github.com/farmem/farmem/runtime"
)

// farmem attach: a process that is already running is entered the way a static program is
// (static.go: the same agent, uffd and lifeline, made by system calls farmem runs in it), except
// that it is not stopped at its first instruction but frozen where it is, every thread seized and
// interrupted (inject.Seize); its existing anonymous memory is registered and its present pages
// adopted while it is frozen (runtime.ArmNow), so that they count against the cap from the start,
// and the evictor takes what is over the cap once it runs again.
//
// It gets no mapping filter, unlike a static program: a seccomp filter cannot be taken out of a
// process, and one whose listener is gone fails the calls it catches with ENOSYS, which would break
// the process after a detach. What is lost against farmem run (runtime/attach.go): new mappings
// are found by the rescan, not as they are made, so a burst of writes into fresh memory can go
// past the cap until the next rescan; and forks are not handed over as they happen. A fork child
// is found through the FORK event its parent's uffd raises (served from then on, on the event's
// uffd) and entered as soon as farmem sees it among its parent's children, within a few
// milliseconds: it is then given its own copy of its uffd and its lifeline (the agent's fork
// entry, as in a static program's child). Until it is entered, farmem holds its uffd's only copy:
// had farmem died in that moment, the child could read zeros where its evicted pages were.
//
// A fork child is matched with its own FORK event (the events carry no pid), not by order alone:
// the agent's fork entry says the child's hello with its fork probe (runtime.AttachForked).
//
// On SIGINT, SIGTERM or SIGHUP farmem detaches: it freezes every process it serves (entering the
// children born until then first, so that none is born while pages come back), stops evicting,
// faults every evicted page back in (runtime.Process.BringBack), has each agent close what it held
// and end its thread, unregisters every range (which lifts the write protection), unmaps the
// agent's memory, and lets the processes go: they run on as before, with nothing of farmem's in
// them.
//
// If farmem dies while attached, the kernel closes its end of each process's lifeline, and the
// process is killed (SIGKILL), as a run's program is: it never reads zeros.

// attachment is one farmem attach.
type attachment struct {
	rt     *runtime.Runtime
	img    *agentImage
	sock   string
	agents *staticAgents
	pid    int
	// mem and memLen are the agent's memory, at the same address in every fork child.
	mem, memLen uint64
	// lifeline is the write end of the attached process's lifeline (its fork children's are
	// held by their control connections, handleConn); -1 once closed.
	lifeline int
	// known: fork children looked at (entered, or not farmem's to enter), by pid, with their
	// start time (a pid is reused: a new child with an old one's pid is looked at anew); the main
	// loop's.
	known map[int]uint64
	// attachedAt: the process's anonymous memory, in bytes, as it was entered; broughtBack:
	// pages the detach read back in. The main loop's.
	attachedAt, broughtBack int64
}

// childPoll is how often the fork children of a process with no mapping filter (an attached one,
// or an image that may not install it) are looked for, to be entered (enterChildren): how long
// one runs on its FORK event alone, with no agent to evict its pages and no lifeline.
const childPoll = 2 * time.Millisecond

// CheckAttachable returns why farmem cannot attach to process pid, in one line, or nil.
func CheckAttachable(pid int) error {
	if pid == os.Getpid() {
		return errors.New("farmem cannot attach to itself")
	}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return fmt.Errorf("no process %d", pid)
	}
	if i := strings.LastIndexByte(string(st), ')'); i > 0 && len(st) > i+2 && (st[i+2] == 'Z' || st[i+2] == 'X') {
		return fmt.Errorf("process %d has exited", pid)
	}
	tracer, err := procfs.TracerPid(pid)
	if err != nil {
		return fmt.Errorf("no process %d", pid)
	}
	if tracer != 0 {
		return fmt.Errorf("process %d is being traced by process %d (a debugger, or farmem entering it)", pid, tracer)
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return notPermitted(pid)
		}
		return fmt.Errorf("no process %d", pid)
	}
	for _, fd := range fds {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && l == "anon_inode:[userfaultfd]" {
			return fmt.Errorf("process %d is already under farmem (it holds a userfaultfd: farmem run or attach put it there, or it pages itself)", pid)
		}
	}
	return nil
}

// notPermitted says why the kernel refuses to let farmem trace pid.
func notPermitted(pid int) error {
	scope := "unknown"
	if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil {
		scope = strings.TrimSpace(string(b))
	}
	owner := -1
	if fi, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
		owner = int(fi.Sys().(*syscall.Stat_t).Uid)
	}
	switch {
	case scope == "3":
		return fmt.Errorf("not permitted to ptrace process %d: ptrace is disabled on this machine (kernel.yama.ptrace_scope=3)", pid)
	case owner >= 0 && owner != os.Geteuid() && os.Geteuid() != 0:
		return fmt.Errorf("not permitted to ptrace process %d: it belongs to user %d (run farmem as that user, or with CAP_SYS_PTRACE)", pid, owner)
	default:
		return fmt.Errorf("not permitted to ptrace process %d: farmem needs CAP_SYS_PTRACE (kernel.yama.ptrace_scope=%s)", pid, scope)
	}
}

// Attach caps the running process pid until it exits (status 0: farmem is not its parent and
// cannot learn its status), or, on SIGINT or SIGTERM, detaches from it and returns 0 with the
// process running on as before. o.Argv and o.Static are not used.
func Attach(o Options, pid int) (int, error) {
	if err := CheckAttachable(pid); err != nil {
		return 0, err
	}
	img, err := readAgent(agentELF)
	if err != nil {
		return 0, err
	}
	ln, sock, err := listen()
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	if len(sock) >= paramSockLen {
		return 0, fmt.Errorf("socket name %q too long for the agent", sock)
	}
	o.Argv = []string{fmt.Sprintf("process %d", pid)}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid)); err == nil {
		o.Argv = []string{strings.TrimSpace(string(b))}
	}
	say := &announcer{o: o}
	rt, err := newRuntime(o, say, true, nil)
	if err != nil {
		return 0, err
	}
	if o.Observe != nil {
		o.Observe(rt)
	}
	rt.Start()
	defer rt.Close()
	a := &attachment{rt: rt, img: img, sock: sock, agents: &staticAgents{}, pid: pid, lifeline: -1, known: map[int]uint64{}}
	defer serve(rt, o, ln, a.agents)()
	// Before entering: a SIGINT meanwhile detaches as soon as farmem is in.
	// SIGHUP too: a terminal that closes must not kill the process farmem serves (farmem's death
	// would, through its lifeline).
	sigs := make(chan os.Signal, 3)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	// The children the process has now are not farmem's: forked before it came.
	for _, c := range childrenOf(pid) {
		a.known[c] = startTime(c)
	}
	if err := a.enter(); err != nil {
		return 0, err
	}
	defer func() {
		if a.lifeline >= 0 {
			unix.Close(a.lifeline)
		}
	}()
	if !o.Quiet {
		fmt.Fprintf(os.Stderr, "farmem: attached to %s (pid %d): its pages beyond the %s cap now go to the store; SIGINT, SIGTERM or SIGHUP detaches\n",
			o.Argv[0], pid, size(o.LocalMem))
	}
	tick := time.NewTicker(childPoll)
	defer tick.Stop()
	detached := false
	var sum *Summary
loop:
	for rt.Live() > 0 {
		select {
		case <-sigs:
			// The summary is of the time attached: the detach's own faults, which bring every
			// page back, and the memory they fill, are not what the cap held nor what the
			// process paid.
			attached := summarize(rt, o, 0)
			err := a.detach()
			if err != nil {
				// Exiting now could kill what is not let go yet (its lifeline): it is served on,
				// no longer evicted, until it exits or a signal tries again.
				fmt.Fprintf(os.Stderr, "farmem: detaching from process %d: %v; still attached (evicting nothing): SIGINT, SIGTERM or SIGHUP tries again\n", pid, err)
				continue
			}
			attached.BroughtBackPages = a.broughtBack
			sum, detached = attached, true
			break loop
		case <-tick.C:
		}
		a.enterChildren()
	}
	status := 0
	if !detached {
		sum = summarize(rt, o, status)
	}
	sum.Attached, sum.AttachedAtBytes = true, a.attachedAt
	if o.SummaryJSON != "" {
		if err := writeSummary(o.SummaryJSON, sum); err != nil {
			fmt.Fprintf(os.Stderr, "farmem: --summary-json: %v\n", err)
		}
	}
	if f := rt.Failure(); f != nil {
		return exitFailedStatus, fmt.Errorf("the process was stopped: %w", f)
	}
	if detached && !o.Quiet {
		fmt.Fprintf(os.Stderr, "farmem: detached from %s (pid %d): every page it had is back in it, and nothing of farmem's is left there\n", o.Argv[0], pid)
	}
	say.summary(sum)
	return status, nil
}

// exitFailedStatus is farmem's status when it stopped the process (docker's 125 for its own
// failures).
const exitFailedStatus = 125

// enter freezes the process, puts the agent in, attaches it, registers its memory, and lets it go.
func (a *attachment) enter() (err error) {
	goruntime.LockOSThread() // the tracer, until the process is let go
	defer goruntime.UnlockOSThread()
	g, err := inject.Seize(a.pid)
	if err != nil {
		if errors.Is(err, inject.ErrNotPermitted) {
			return notPermitted(a.pid)
		}
		if _, serr := os.Stat(fmt.Sprintf("/proc/%d", a.pid)); serr != nil {
			return fmt.Errorf("no process %d", a.pid)
		}
		return err
	}
	tr := g.Leader()
	ready := a.agents.expect(a.pid, false)
	started := false // the agent thread runs: what farmem put in can no longer simply be taken out
	var p *runtime.Process
	defer func() {
		if err == nil {
			return
		}
		a.agents.forget(a.pid)
		if !started && a.mem != 0 {
			a.undoInjection(tr)
			if p != nil {
				a.rt.Let(p)
			}
		}
		g.Detach()
		err = fmt.Errorf("putting farmem's agent into process %d: %w", a.pid, err)
	}()
	mem, fd, lifeline, err := injectAgent(tr, a.img, a.sock)
	if err != nil {
		return err
	}
	a.mem, a.memLen, a.lifeline = mem, agentOffset+a.img.span, lifeline
	if p, err = a.rt.Attach(a.pid, fd); err != nil {
		return err
	}
	if _, err := runAgentEntry(tr, mem+agentOffset+a.img.startEntry); err != nil {
		return err
	}
	started = true
	if err := waitAttached(tr, ready); err != nil {
		return err
	}
	// Still frozen: nothing it holds grows unseen while its mappings are registered and its
	// present pages adopted. What it holds now, the agent's few pages with the rest, is the
	// process's own: a peak up to it is not over the cap.
	if st, err := procfs.OpenStatm(a.pid); err == nil {
		a.attachedAt = st.AnonPages() * runtime.PageSize
		st.Close()
	}
	a.rt.ArmNow()
	return g.Detach()
}

// undoInjection takes out of the frozen process what injectAgent put in, before the agent runs:
// the lifeline's read end (first made silent: its close must not kill the process once farmem
// closes the write end), the process's copy of its uffd, the device descriptor farmem sent it
// (if it was sent one), and the agent's memory.
func (a *attachment) undoInjection(tr *inject.Tracee) {
	var fds [4]byte
	if tr.Read(a.mem+agentOffset+a.img.params+paramLifeline, fds[:]) == nil {
		rd := uint64(binary.LittleEndian.Uint32(fds[:]))
		tr.Syscall(unix.SYS_FCNTL, rd, unix.F_SETFL, unix.O_NONBLOCK)
		tr.Syscall(unix.SYS_CLOSE, rd)
	}
	if tr.Read(a.mem+agentOffset+a.img.params+paramUffd, fds[:]) == nil {
		tr.Syscall(unix.SYS_CLOSE, uint64(binary.LittleEndian.Uint32(fds[:])))
	}
	if tr.Read(a.mem+agentOffset+a.img.params+paramUffdDev, fds[:]) == nil {
		if dev := int32(binary.LittleEndian.Uint32(fds[:])); dev >= 0 {
			tr.Syscall(unix.SYS_CLOSE, uint64(dev))
		}
	}
	tr.Syscall(unix.SYS_MUNMAP, a.mem, a.memLen)
	if a.lifeline >= 0 {
		unix.Close(a.lifeline)
		a.lifeline = -1
	}
}

// waitAttached waits, holding the tracee's threads, until its agent has said hello (ready).
func waitAttached(tr *inject.Tracee, ready <-chan error) error {
	deadline := time.Now().Add(agentWait)
	for {
		select {
		case err := <-ready:
			return err
		case <-time.After(10 * time.Millisecond):
		}
		if err := tr.Poll(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("its agent did not say hello within %v", agentWait)
		}
	}
}

// enterChildren enters the fork children whose FORK events have come and who have not said
// hello: each gets its own copy of its uffd, a lifeline and an agent thread, through the agent's
// fork entry (agent.c, fm_fork_child), as a static program's child does.
func (a *attachment) enterChildren() {
	a.forgetGone()
	for _, ppid := range a.rt.ForkParents() {
		if !carriesAgent(ppid, a.mem+agentOffset+a.img.params, a.sock) {
			continue // not of this agent's processes: one with the shim, or another image's
		}
		for _, c := range childrenOf(ppid) {
			st := startTime(c)
			if seen, ok := a.known[c]; (ok && seen == st) || a.rt.Lookup(c) != nil {
				continue
			}
			a.known[c] = st
			a.enterOrKill(c, ppid)
		}
	}
}

// enterOrKill enters fork child pid of ppid, or kills it if it cannot be entered: it may hold
// pages that only farmem's copy of its uffd can serve.
func (a *attachment) enterOrKill(pid, ppid int) {
	if err := a.enterChild(pid, ppid); err != nil {
		fmt.Fprintf(os.Stderr, "farmem: fork child %d of process %d could not be entered, and was killed: %v\n", pid, ppid, err)
		unix.Kill(pid, unix.SIGKILL)
	}
}

// enterChild enters fork child pid of ppid, unless it exec'd (it carries no agent of farmem's) or
// exited.
func (a *attachment) enterChild(pid, ppid int) (err error) {
	goruntime.LockOSThread()
	defer goruntime.UnlockOSThread()
	g, err := inject.Seize(pid)
	if err != nil {
		return nil // gone, or not ours to trace
	}
	defer func() {
		if derr := g.Detach(); err == nil && derr != nil {
			err = derr
		}
	}()
	if !carriesAgent(pid, a.mem+agentOffset+a.img.params, a.sock) {
		return nil
	}
	ready := a.agents.expect(pid, false)
	if _, err := runAgentEntry(g.Leader(), a.mem+agentOffset+a.img.forkEntry); err != nil {
		a.agents.forget(pid)
		return err
	}
	// A child of an image served without the filter (serveUnfiltered) may not install one
	// either: it is served without, as its parent is.
	if err := waitAttached(g.Leader(), ready); err != nil && !filterRefused(pid, err) {
		a.agents.forget(pid)
		return err
	}
	return nil
}

// forgetGone drops the known children that have exited, once there are many.
func (a *attachment) forgetGone() {
	if len(a.known) < 4096 {
		return
	}
	for pid, st := range a.known {
		if startTime(pid) != st {
			delete(a.known, pid)
		}
	}
}

// startTime is when process pid started (field 22 of its stat, in clock ticks since boot); 0 if
// it is gone.
func startTime(pid int) uint64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3
	if len(f) < 20 {
		return 0
	}
	st, _ := strconv.ParseUint(f[19], 10, 64)
	return st
}

// childrenOf lists the children of every thread of pid.
func childrenOf(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	// In the order of their births, as far as pids tell: fork children are matched to their
	// FORK events in order (runtime.AttachForked).
	slices.Sort(out)
	return out
}

// detach lets every process go, as it was before farmem, with every page back.
//
// Every process served is frozen first, so that none forks meanwhile: a child born while its
// parent's pages come back could hold evicted pages on a uffd only farmem has, and read zeros
// once farmem is gone. Children born before are entered first, and let go like the others.
func (a *attachment) detach() error {
	goruntime.LockOSThread() // the tracer of every frozen process until the end
	defer goruntime.UnlockOSThread()
	var frozen map[*runtime.Process]*inject.Group
	thaw := func() {
		for _, g := range frozen {
			g.Detach()
		}
	}
	defer func() { thaw() }()
	for try := 0; ; try++ {
		a.enterChildren()
		frozen = map[*runtime.Process]*inject.Group{}
		for _, p := range a.rt.Processes() {
			g, err := inject.Seize(p.Pid(), p.AgentTid()) // the agent goes on: it has work to do
			if err != nil {
				if gone(p.Pid()) {
					continue
				}
				return err
			}
			frozen[p] = g
		}
		if len(a.rt.ForkParents()) == 0 && a.childrenHeld(frozen) {
			break // no child born between the entering and the freezing
		}
		if try == 20 {
			return errors.New("its processes fork faster than farmem can enter their children")
		}
		thaw()
	}
	for p := range frozen {
		p.StopEvicting()
	}
	var first error
	for p, g := range frozen {
		if err := a.letGo(p, g); err != nil && !gone(p.Pid()) && first == nil {
			first = err
		}
	}
	thaw()
	for p := range frozen {
		a.rt.Let(p)
	}
	frozen = nil
	return first
}

// childrenHeld reports whether every fork child of the frozen processes that carries the agent
// is frozen with them, and enters those that farmem does not serve yet, for the next try to
// freeze. With every thread of a process stopped none is inside fork, so the process's children
// are all listed. But ForkParents can miss one: a thread that forked as it was frozen goes on as
// soon as the kernel hands its FORK event to farmem's reader, before farmem records the event,
// and the child runs. Missed, it would run on after the detach with evicted pages that only
// farmem's copy of its uffd serves, and read zeros once farmem is gone.
func (a *attachment) childrenHeld(frozen map[*runtime.Process]*inject.Group) bool {
	held := true
	for p := range frozen {
		for _, c := range childrenOf(p.Pid()) {
			if !carriesAgent(c, a.mem+agentOffset+a.img.params, a.sock) {
				continue // exited, exec'd, or born before farmem came
			}
			if q := a.rt.Lookup(c); q != nil {
				if _, ok := frozen[q]; !ok {
					held = false // entered after the freezing began
				}
				continue
			}
			held = false
			a.known[c] = startTime(c)
			a.enterOrKill(c, p.Pid())
		}
	}
	return held
}

// gone reports whether process pid has exited.
func gone(pid int) bool {
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := strings.LastIndexByte(string(st), ')')
	return i > 0 && len(st) > i+2 && (st[i+2] == 'Z' || st[i+2] == 'X')
}

// letGo gives frozen process p every page back, has its agent close what it held and end,
// unregisters its ranges and unmaps the agent's memory.
func (a *attachment) letGo(p *runtime.Process, g *inject.Group) error {
	pid := p.Pid()
	if !carriesAgent(pid, a.mem+agentOffset+a.img.params, a.sock) {
		// It exec'd: the image farmem served is gone with its pages, and what is at the
		// agent's address now is the new image's.
		return nil
	}
	n, err := p.BringBack()
	a.broughtBack += int64(n)
	if err != nil {
		return err
	}
	if err := p.DetachAgent(); err != nil {
		return err
	}
	if pid == a.pid && a.lifeline >= 0 {
		unix.Close(a.lifeline) // its read end is closed: no signal
		a.lifeline = -1
	}
	if err := p.Unregister(); err != nil {
		return err
	}
	if _, err := g.Leader().Syscall(unix.SYS_MUNMAP, a.mem, a.memLen); err != nil {
		return fmt.Errorf("process %d: unmapping farmem's agent: %w", pid, err)
	}
	return nil
}
