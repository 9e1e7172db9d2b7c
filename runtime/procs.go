package runtime

import (
	"errors"
	"fmt"
	"maps"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/procfs"
	"github.com/farmem/farmem/uffd"
)

// Attach adopts a program process that said hello with its uffd.
func (rt *Runtime) Attach(pid, fd int) (*Process, error) { return rt.attach(pid, fd, 0) }

// attach adopts process pid, a fork child of ppid with nothing registered if ppid != 0.
func (rt *Runtime) attach(pid, fd, ppid int) (*Process, error) {
	tb := pagetable.New(&rt.resident, rt.slots)
	tb.MaxHeat = rt.cfg.MaxHeat
	tb.LastStayGuess = rt.cfg.LastStayGuess
	p, err := rt.newProcess(fd, tb)
	if err != nil {
		return nil, err
	}
	rt.Stats.Processes.Add(1)
	p.pid.Store(int32(pid))
	if a, err := vdso(pid); err == nil {
		p.probe = a // for memoryGone, once the process has exec'd (ControlEnded)
	}
	rt.mu.Lock()
	old := rt.byPid[pid] // an exec replaced the old image: its mm is gone
	from := old          // whose pinning pid may have inherited (placement)
	if ppid != 0 {
		from = rt.byPid[ppid]
	}
	rt.procs[p] = true
	rt.byPid[pid] = p
	rt.mu.Unlock()
	p.place.orig = programAffinity(pid, from)
	if ppid != 0 && from != nil {
		p.forks.Store(from.forks.Load()) // a fork child of a process with a fork server
	}
	if old != nil {
		rt.retireGone(old) // its image is: the exec freed that memory
	}
	p.fetch.Start()
	rt.watchExit(p, pid)
	return p, nil
}

// forked starts serving a fork child at once (its pid comes later, with its hello).
func (rt *Runtime) forked(parent *Process, fd int, table *pagetable.PageTable) {
	c, err := rt.newProcess(fd, table)
	if err != nil {
		parent.Fail(err)
		return
	}
	rt.Stats.Processes.Add(1)
	// The kernel copied the parent's registrations to the child's uffd: the child's rescan
	// must not take them for mappings it has never seen.
	parent.regMu.Lock()
	maps.Copy(c.registered, parent.registered)
	parent.regMu.Unlock()
	c.place.orig = parent.place.orig // set before the parent's fault thread started: read-only
	c.probe = parent.probe           // fork copies the vDSO where it was
	c.forkParent = parent
	rt.mu.Lock()
	rt.procs[c] = true
	rt.forks[parent] = append(rt.forks[parent], c)
	orphan := !rt.procs[parent] // the parent exited, and was retired, before this event was applied
	rt.mu.Unlock()
	c.fetch.Start()
	if orphan {
		rt.retireLater(c) // as retire does for its parent's other waiting children
	}
}

// AttachForked attaches a fork child that said hello with a fresh uffd of its own (fd).
//
// If the parent had ranges registered when it forked, the kernel gave the child their
// registrations on a new uffd and raised a FORK event in the parent: the child is served on
// that uffd, with the page table cloned at the event, and fd is closed. The events carry no
// pid, so the child names its own with its fork probe (probe, the address of a page it holds
// registered on a uffd of its own: see claimFork); a child without one (probe 0) is matched in
// fork order, which two threads of one process forking at once can get the wrong way round.
// The child is runnable before its parent's FORK event is read, so its hello may arrive first:
// wait for the event.
//
// If the parent had nothing registered (not armed yet, or only small mappings), no FORK event
// comes: the child holds no evicted page and starts afresh on fd. The child's smaps tell the
// two apart exactly: it has not run any code of its own yet (it says hello from its atfork
// handler), so its registrations are still the ones fork copied, and its fork probe's. They are
// read only when neither settles it sooner: an event its probe claims is the child's (waited for
// a moment when the parent has registrations, so that one is almost surely coming), and a run
// not armed now registered nothing before the fork (arming is for good, and comes before any
// registration). Reading smaps walks the child's page tables, which costs in proportion to the
// memory the child inherited, at every fork.
func (rt *Runtime) AttachForked(pid, ppid, fd int, probe uint64) (*Process, error) {
	var c *Process
	if probe != 0 && rt.Armed() && rt.Lookup(ppid).hasRegistrations() {
		// Its event is most likely queued, or being applied (the parent's table cloned).
		if c = rt.claimSoon(probe, pid); c != nil {
			unix.Close(fd)
			return rt.servedForked(c, pid), nil
		}
	}
	inherited := false
	if rt.Armed() {
		var err error
		if inherited, err = inheritedRegistrations(pid, probe); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("fork child %d: %w", pid, err)
		}
	}
	if !inherited {
		return rt.attach(pid, fd, ppid)
	}
	unix.Close(fd)
	deadline := time.Now().Add(10 * time.Second)
	// The queue may hold only events of children gone (exited, or forks that failed) while
	// this child's own event, read already, is not in it yet: wait for one of a live child.
	var parent *Process
	var err error
	rt.mu.Lock()
	for {
		if probe != 0 {
			c, err = rt.claimForkLocked(probeOwner(probe))
			if err != nil {
				rt.mu.Unlock()
				return nil, fmt.Errorf("fork child %d: %w", pid, err)
			}
			if c != nil {
				rt.nameForkedLocked(c, pid)
				break
			}
		} else if parent = rt.byPid[ppid]; parent != nil && len(rt.forks[parent]) > 0 {
			var gone []*Process
			c, gone = rt.nextForkedLocked(parent, pid)
			for _, g := range gone {
				defer rt.retireGone(g)
			}
			if c != nil {
				rt.nameForkedLocked(c, pid)
				break
			}
		}
		rt.mu.Unlock()
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("fork child %d: no FORK event from parent %d", pid, ppid)
		}
		time.Sleep(200 * time.Microsecond)
		rt.mu.Lock()
	}
	rt.mu.Unlock()
	return rt.servedForked(c, pid), nil
}

// forkClaimWait is how long a fork child whose parent has registrations waits for its FORK event
// to be queued before its smaps are read to tell whether one is coming: applying the event
// clones the parent's page table, which takes longer the more pages it records.
const forkClaimWait = 100 * time.Millisecond

// claimSoon claims the FORK event the child with fork probe probe names, waiting up to
// forkClaimWait for it to be queued; nil if none came (an error is left to the caller's own
// claim, which meets it again).
func (rt *Runtime) claimSoon(probe uint64, pid int) *Process {
	for deadline := time.Now().Add(forkClaimWait); ; time.Sleep(200 * time.Microsecond) {
		rt.mu.Lock()
		c, err := rt.claimForkLocked(probeOwner(probe))
		if c != nil {
			rt.nameForkedLocked(c, pid)
		}
		rt.mu.Unlock()
		if c != nil || err != nil || time.Now().After(deadline) {
			return c
		}
	}
}

// hasRegistrations reports whether farmem has registered any range of p's (nil: no).
func (p *Process) hasRegistrations() bool {
	if p == nil {
		return false
	}
	p.regMu.Lock()
	defer p.regMu.Unlock()
	return len(p.registered) > 0
}

// nameForkedLocked names c, a fork child served on its FORK event whose hello claimed it, by its
// pid (rt.mu held, as when the claim took it out of the waiting events).
func (rt *Runtime) nameForkedLocked(c *Process, pid int) {
	c.pid.Store(int32(pid))
	c.forks.Store(c.forkParent.forks.Load())
	rt.byPid[pid] = c
}

// servedForked finishes serving c, named by nameForkedLocked: its placement and its exit watch.
func (rt *Runtime) servedForked(c *Process, pid int) *Process {
	programAffinity(pid, c.forkParent) // undo a pinning it inherited; c already has the parent's
	rt.watchExit(c, pid)
	return c
}

// inheritedRegistrations reports whether fork child pid holds ranges registered with a
// userfaultfd other than its fork probe (the page at probe; 0: none).
func inheritedRegistrations(pid int, probe uint64) (bool, error) {
	ranges, err := procfs.UffdRanges(pid)
	if err != nil {
		return false, err
	}
	for _, r := range ranges {
		if probe == 0 || r[1] <= probe || r[0] >= probe+uint64(PageSize) {
			return true, nil
		}
	}
	return false, nil
}

// nextForkedLocked takes the next of parent's FORK events (rt.mu held) for its child pid, and
// returns the events it passed over, of children whose memory is gone, for the caller to retire.
//
// The kernel raises the FORK event while it copies the parent's memory, and the fork can still
// fail after that, before the child ever runs (a signal arrived meanwhile): its memory is freed
// and no hello comes. Matched in order, the next child would be served on that dead child's
// uffd, and its own, which holds its registrations, on nothing: once closed, its evicted pages
// would read as zeros. So an event is taken only if its memory is still there.
func (rt *Runtime) nextForkedLocked(parent *Process, pid int) (c *Process, gone []*Process) {
	probe, err := vdso(pid)
	q := rt.forks[parent]
	for len(q) > 0 {
		c, q = q[0], q[1:]
		if err != nil || !memoryGone(c.fd, probe) {
			rt.forks[parent] = q
			return c, gone
		}
		gone = append(gone, c)
		c = nil
	}
	rt.forks[parent] = q
	return nil, gone
}

// memoryGone reports whether the memory uffd fd stands for is gone: a FORK event's child failed
// to be born or exited, or a process exec'd or exited. A zero-page request at probe, an address
// no uffd can register (the vDSO, where fork put it in every child of one parent), installs
// nothing: it answers ESRCH when the memory is gone, and ENOENT (no registered range there)
// otherwise.
func memoryGone(fd int, probe uint64) bool {
	_, err := uffd.ZeroPage(fd, probe, uint64(PageSize), uffd.ZeroPageDontWake)
	return errors.Is(err, unix.ESRCH)
}

// vdso returns the address of pid's vDSO.
func vdso(pid int) (uint64, error) {
	var addr uint64
	err := procfs.Maps(pid, func(m procfs.Mapping) {
		if m.Path == "[vdso]" {
			addr = m.Start
		}
	})
	if err == nil && addr == 0 {
		err = fmt.Errorf("process %d has no vDSO", pid)
	}
	return addr, err
}

// Lookup returns the process with pid.
func (rt *Runtime) Lookup(pid int) *Process {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.byPid[pid]
}

// watchExit retires p when pid exits.
func (rt *Runtime) watchExit(p *Process, pid int) {
	pfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		rt.retireGone(p)
		return
	}
	go func() {
		defer unix.Close(pfd)
		fds := []unix.PollFd{{Fd: int32(pfd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == unix.EINTR {
				continue
			}
			break
		}
		rt.retireGone(p)
	}()
}

// retireGone retires p, whose process, or the memory its uffd stands for, is gone: from now on
// a fault in that memory can only be farmem's own read (Exited).
func (rt *Runtime) retireGone(p *Process) {
	p.exited.Store(true)
	rt.retire(p)
}

// retire stops serving p and frees everything it held.
func (rt *Runtime) retire(p *Process) {
	rt.mu.Lock()
	if !rt.procs[p] {
		rt.mu.Unlock()
		return
	}
	delete(rt.procs, p)
	if pid := p.Pid(); rt.byPid[pid] == p {
		delete(rt.byPid, pid)
		rt.retiredPids.add(pid)
	}
	// A child that has not said hello yet may still: a daemon's parent exits as soon as it has
	// forked, and the child's hello finds its event by its fork probe, whoever its parent is
	// by then. Its event stays queued until then, or until retireLater gives up waiting: it
	// exited, or was forked without libc's fork and is served on its event alone.
	for _, c := range rt.forks[p] {
		defer rt.retireLater(c)
	}
	rt.unqueueForkLocked(p)
	rt.retiring++
	rt.mu.Unlock()
	defer func() {
		rt.mu.Lock()
		if rt.retiring--; rt.retiring == 0 {
			rt.retired.Broadcast()
		}
		rt.mu.Unlock()
	}()
	p.agentMu.Lock()
	if p.agent != nil {
		p.agent.Close()
	}
	p.agentMu.Unlock()
	// A batch on p ends before its fault thread stops: a batch's read of p's memory can fault,
	// and only that thread can end the fault (fetcher's missing, once p has exited).
	p.life.Lock()
	p.retired = true
	p.fetch.Stop()
	p.table.Lock()
	words := p.table.Unpublish() // first: a word the dead agent left claimed is not waited for
	p.table.Clear()
	p.table.Unlock()
	if words != nil {
		words.Close()
	}
	p.fetch.Close()
	if p.fence != nil {
		p.fence.Close()
	}
	if p.space != 0 {
		rt.cfg.Backend.(backend.Spaces).EndSpace(p.space) // what a fork child shares stays until it frees it
	}
	unix.Close(p.fd)
	p.life.Unlock()
}

// orphanGrace is how long a fork child whose parent is gone has to say hello before its event is
// given up: a child says hello from its atfork handler, as soon as it first runs, but a loaded
// machine may keep it from running for a while, and a child given up on is killed by its shim.
const orphanGrace = 5 * time.Second

// retireLater retires fork child c, whose parent is gone, if it has not said hello within
// orphanGrace and its memory is gone. A child whose memory lives on without a hello was forked
// without libc's fork (no atfork handler, and no filter to hand the fork over: a process running
// as another user) and runs on, served on its event alone: closing its uffd would unregister
// its ranges, and it would read zeros where its evicted pages were. It stays served until its
// memory goes (retireSilentForkChildren).
func (rt *Runtime) retireLater(c *Process) {
	go func() {
		time.Sleep(orphanGrace)
		if c.Pid() != 0 {
			return
		}
		if c.probe != 0 && c.Hold() {
			alive := !memoryGone(c.fd, c.probe) // held: the uffd is not closed meanwhile
			c.Release()
			if alive {
				return
			}
		}
		rt.retire(c)
	}()
}

// forkSweep is how often the rescan loop looks for fork children gone before any hello.
const forkSweep = 100 * time.Millisecond

// retireSilentForkChildren retires, among procs, the fork children served on their FORK event
// that never said hello and whose memory is gone. A child forked by a raw clone system call
// (no atfork handler runs in it) never says hello, and while its parent lives nothing else would
// retire it: its uffd, fault thread and page table, whose resident pages count against the cap,
// would stay for the whole run.
func (rt *Runtime) retireSilentForkChildren(procs []evictor.Target) {
	for _, tg := range procs {
		p := tg.(*Process)
		if p.Pid() != 0 || p.forkParent == nil || p.probe == 0 || !p.Hold() {
			continue
		}
		gone := memoryGone(p.fd, p.probe) // held: the uffd is not closed meanwhile
		p.Release()
		if gone {
			rt.retireGone(p)
		}
	}
}

// servedOfLate reports whether process pid is served, or was until a moment ago: the kernel's
// event for a fork it made may be read only after it exited.
func (rt *Runtime) servedOfLate(pid int) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.byPid[pid] != nil || rt.retiredPids.has(pid)
}

// pidRing holds the last len(pids) pids added to it.
type pidRing struct {
	pids [256]int
	next int
}

func (r *pidRing) add(pid int) {
	r.pids[r.next%len(r.pids)] = pid
	r.next++
}

func (r *pidRing) has(pid int) bool {
	for _, p := range r.pids[:min(r.next, len(r.pids))] {
		if p == pid {
			return true
		}
	}
	return false
}

// anyServed reports whether f holds for a process served; f runs under rt.mu and takes nothing.
func (rt *Runtime) anyServed(f func(*Process) bool) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for p := range rt.procs {
		if f(p) {
			return true
		}
	}
	return false
}

// Pids returns the pids of the processes served.
func (rt *Runtime) Pids() []int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	out := make([]int, 0, len(rt.byPid))
	for pid := range rt.byPid {
		out = append(out, pid)
	}
	return out
}

// Live returns the number of processes still served or still being retired: once it is 0,
// nothing holds a slot of the backend any more.
func (rt *Runtime) Live() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return len(rt.procs) + rt.retiring
}
