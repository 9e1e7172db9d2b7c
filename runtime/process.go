package runtime

import (
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/prefetch"
	"github.com/farmem/farmem/procfs"
	"github.com/farmem/farmem/pubtable"
)

// Agent is the connection to a process's agent thread.
type Agent interface {
	// Drop runs commit and has the agent madvise(DONTNEED) the runs it returns, with the
	// agent's lock held from before commit: evictor.Target's Drop.
	Drop(commit func() []evictor.Run) error
	// Move has the agent UFFDIO_MOVE runs into the staging area from dst on (evictor.Target).
	Move(runs []evictor.Run, dst uint64, layout uint64, status []byte) error
	// Staging has the agent map a staging area of bytes, registered on the process's uffd, and
	// the move fence (its memfd, fence), and returns the area's address.
	Staging(bytes uint64, fence int) (uint64, error)
	// Filter has the agent install the mapping filter on every thread of its process and
	// returns the filter's seccomp listener (mapfilter.go); with guardForks the filter also
	// hands over the process's forks.
	Filter(minBytes uint64, guardForks bool) (listener int, err error)
	// Syscall has the agent make a system call in its process; the raw result is -errno on
	// failure.
	Syscall(nr uint64, args [6]uint64) (int64, error)
	// ServeFaults has the agent start its fault thread (inprogram.go) on the process's table of
	// words, a read-only descriptor of its store space and its end of the socket it sends on;
	// it returns the thread's id.
	ServeFaults(table, store, sock int) (tid int, err error)
	Close() error
}

// Process is one process of the run (the program, or a fork child of it): its uffd, its page
// table, its agent, its registrations, and the fetcher that serves its faults. It is the
// evictor's Target and its fetcher's Host.
type Process struct {
	rt    *Runtime
	fd    int // the uffd; owned, closed by retire under life
	table *pagetable.PageTable
	fetch *fetcher.Fetcher

	pid      atomic.Int32 // 0 until the shim's hello (a fork child is served before it says hello)
	agentTid atomic.Int32 // faults from this thread are never held for room: eviction needs it
	agentMu  sync.Mutex
	agent    Agent       // protected by agentMu
	filtered atomic.Bool // the agent was asked to install the mapping filter (mapfilter.go)
	// filterDone is closed once the filter's installation was tried; filterErr is its outcome,
	// written before.
	filterDone chan struct{}
	filterErr  error
	// filterInherited: the process came with the mapping filter of the image it replaced or of
	// the parent it forked from (InheritFilter), served on that one's listener.
	filterInherited atomic.Bool
	// forks, if set, enters the process's fork children (mapfilter.go, serveFork): nothing in
	// the process does (a static program has no shim to say the child's hello).
	forks    atomic.Pointer[ForkServer]
	forkSaid atomic.Bool // a refused fork was reported
	// staging is the staging area the evictor moves victims into (evictor.Target.Staging): 0
	// until the first batch makes it, noStaging once it is known there can be none. Both
	// belong to the evictor goroutine.
	staging   uint64
	noStaging bool
	// fence orders the agent's moves after the fault thread's reads of the uffd
	// (pubtable.Fence); nil: none could be made. Set by newProcess, closed by retire.
	fence *pubtable.Fence
	mapMu sync.Mutex // serializes the process's notified mmap calls (mapfilter.go)
	brkMu sync.Mutex // serializes the process's notified brk calls (mapfilter.go)
	brk   int64      // protected by brkMu; the break the last of them left (0: not known yet)

	// forkGate is held for writing while a fork the filter handed over is served (serveFork),
	// and tried for reading by each batch's move (Move), which moves nothing if a fork holds it.
	// A page moved while fork copies the address space, from a mapping not yet copied into a
	// staging area already copied, would be in neither of the child's copies. The kernel's
	// locking of mappings keeps a move out of the copy (probes/forkmove.c); this keeps it out
	// whatever that locking, as the shim's atfork handler does for its own forks (the agent's
	// move_lock), for a process without the shim (static, attached, an entered image) and for a
	// raw fork of one with it (RawFork).
	forkGate sync.RWMutex

	regMu      sync.Mutex
	registered map[uint64]uint64 // protected by regMu; start -> end of ranges we registered
	unadopted  map[uint64]uint64 // protected by regMu; start -> end of ranges to adopt again (adoptLater)

	// probe is the vDSO's address in the process's image as it said hello, or its parent's for
	// a fork child (0: not known), for memoryGone; set before the process is served, never
	// changed.
	probe uint64
	// forkParent is the process whose FORK event this one was born from (nil: none); set
	// before the process is served, never changed.
	forkParent *Process

	// imageEnded: ControlEnded was told of the end of this image's connection (once is enough:
	// a process may have two, its shim's and its agent's).
	imageEnded atomic.Bool

	place    placement // fault thread only (Faulting, Idle): which CPU the threads run on
	failOnce sync.Once

	// life is held for reading by each eviction batch and prefetch batch (Hold) and for
	// writing by retire while it closes the uffd and the fetcher: a batch never issues an
	// ioctl on a closed (or reused) fd.
	life    sync.RWMutex
	retired bool // protected by life
	// exited: the process is gone, or its memory is (an exec, a fork that failed): set by
	// retireGone; read by its fault thread (Exited).
	exited atomic.Bool
	// detaching: farmem is letting the process go (attach.go): no batch takes its pages, its
	// faults never wait for room, nothing more is registered.
	detaching atomic.Bool
	// space is where the evictor stores the process's pages (evictor.Target's Space). Set by
	// newProcess, never changed; ended by retire.
	space backend.Space
}

func (rt *Runtime) newProcess(fd int, table *pagetable.PageTable) (*Process, error) {
	p := &Process{rt: rt, fd: fd, table: table, place: newPlacement(&rt.Stats), registered: make(map[uint64]uint64), unadopted: make(map[uint64]uint64),
		filterDone: make(chan struct{})}
	p.fence, _ = pubtable.NewFence() // none: the process has no staging area, and its victims are dropped
	var pred prefetch.Prefetcher
	if rt.cfg.NewPrefetcher != nil {
		pred = rt.cfg.NewPrefetcher()
	}
	f, err := fetcher.New(fetcher.Config{
		UFFD: fd, Table: table, Backend: rt.cfg.Backend, Host: p, Stats: &rt.Stats.Stats,
		Prefetcher: pred, Cache: rt.cache, Record: rt.cfg.Record, Epoch: rt.start, Tracing: rt.cfg.Tracing,
		Fence: p.fence,
	})
	if err != nil {
		if p.fence != nil {
			p.fence.Close()
		}
		return nil, err
	}
	p.fetch = f
	if sp, ok := rt.cfg.Backend.(backend.Spaces); ok {
		// A space of its own, which can be mapped into this process and no other (docs/DESIGN.md,
		// "Where a fault is served"); failing that, its pages go where every process's may.
		p.space, _ = sp.NewSpace()
		if p.space != 0 {
			p.publish(sp)
		}
	}
	return p, nil
}

// publish has the process's page table keep the words its agent reads (package pubtable). A
// process without them (no memfd could be made) has its faults served by farmem alone.
func (p *Process) publish(sp backend.Spaces) {
	words, err := pubtable.New()
	if err != nil {
		return
	}
	p.table.Lock()
	p.table.Publish(words, p.space, sp.Where, p.Fail, &p.rt.Stats.InProgram)
	p.table.Unlock()
}

// Hold implements evictor.Target.
func (p *Process) Hold() bool {
	p.life.RLock()
	if p.retired || p.detaching.Load() {
		p.life.RUnlock()
		return false
	}
	return true
}

// Release implements evictor.Target.
func (p *Process) Release() { p.life.RUnlock() }

// Pid implements evictor.Target.
func (p *Process) Pid() int { return int(p.pid.Load()) }

// UFFD implements evictor.Target.
func (p *Process) UFFD() int { return p.fd }

// Table implements evictor.Target.
func (p *Process) Table() *pagetable.PageTable { return p.table }

// Space implements evictor.Target.
func (p *Process) Space() backend.Space { return p.space }

// CanEvict implements evictor.Target.
func (p *Process) CanEvict() bool {
	p.agentMu.Lock()
	defer p.agentMu.Unlock()
	return p.agent != nil && p.pid.Load() != 0 && !p.detaching.Load()
}

// Drop implements evictor.Target.
func (p *Process) Drop(commit func() []evictor.Run) error {
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	if a == nil {
		commit() // what was copied out is recorded all the same; nothing is dropped
		return evictor.ErrGone
	}
	return a.Drop(commit)
}

// Staging implements evictor.Target. The agent maps the area and registers it on the process's
// uffd (agent.h, make_staging), where the kernel fences the moves into it with the program's
// layout changes; the REMOVE event of its drop is passed over (fetcher's read). Not in a fork
// child that inherited its parent's area: that may hold the parent's staged pages, which the
// child's table reads (pagetable's Stage).
func (p *Process) Staging() uint64 {
	if p.staging != 0 || p.noStaging {
		return p.staging
	}
	p.noStaging = true
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	p.table.Lock()
	start, _ := p.table.Staging()
	p.table.Unlock()
	if a == nil || start != 0 || p.fence == nil {
		return 0
	}
	size := uint64(evictor.BatchPages * PageSize)
	base, err := a.Staging(size, p.fence.FD())
	if err != nil {
		return 0 // the drop way, then: slower, never wrong
	}
	p.table.Lock()
	p.table.SetStaging(base, base+size)
	p.table.Unlock()
	p.staging, p.noStaging = base, false
	return base
}

// Move implements evictor.Target.
func (p *Process) Move(runs []evictor.Run, dst uint64, layout uint64, status []byte) error {
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	if a == nil {
		return evictor.ErrGone
	}
	if !p.forkGate.TryRLock() {
		// A fork is under way: nothing moves, and the batch drops its victims instead (a
		// drop takes the mmap lock, which fork holds while it copies), as the agent does
		// when a fork holds its move_lock. Never waited for: the forking thread may be
		// waiting on this batch (a fault on a victim, or room at the cap).
		for i := range status {
			status[i] = byte(unix.EAGAIN)
		}
		return nil
	}
	defer p.forkGate.RUnlock()
	err := a.Move(runs, dst, layout, status)
	if err == nil && len(status) > 0 && (status[0] == byte(unix.ENOTTY) || status[0] == byte(unix.ENOSYS)) {
		p.staging, p.noStaging = 0, true // a kernel before 6.8: no UFFDIO_MOVE
	}
	return err
}

// Fenced implements evictor.Target, through the fetcher's gate on the process's uffd.
func (p *Process) Fenced(op func() error) error { return p.fetch.Fenced(op) }

// Fail implements evictor.Target: stop the program rather than let it see wrong data.
func (p *Process) Fail(err error) {
	p.failOnce.Do(func() {
		pid := p.Pid()
		fmt.Fprintf(os.Stderr, "farmem: cannot serve process %d any more: %v; stopping it\n", pid, err)
		if pid > 0 {
			unix.Kill(pid, unix.SIGKILL)
		}
		p.rt.noteFailure(fmt.Errorf("process %d: %w", pid, err))
	})
}

// Faulting implements fetcher.Host: the fault thread follows the faulting thread's CPU
// (placement), and eviction starts before the cap is reached, so that faults rarely wait.
func (p *Process) Faulting(tid int32) {
	p.place.fault(p.Pid(), int(tid), p.agentTid.Load())
	if ev := p.rt.evictor; ev.Used() > ev.HighWater() {
		p.rt.evictor.Kick()
	}
}

// MustWait implements fetcher.Host: a fault waits while the run is over its cap (or arming),
// unless it is eviction's own (makesRoom), or the process has no agent yet (a fork child before
// its hello): the evictor cannot take its pages, and holding its faults would hold the thread
// that is starting its agent, for room that never comes. Nor does it wait while the evictor
// finds nothing it can take (Starved: what is over the cap is in processes without an agent,
// or memory the page tables do not track): the program goes over its cap, counted and said at
// exit, rather than hang.
func (p *Process) MustWait(tid int32) bool {
	if !p.rt.overCap() || p.makesRoom(tid) || !p.CanEvict() { // CanEvict: false while detaching
		return false
	}
	if ev := p.rt.evictor; ev.Starved() && !p.rt.arming.Load() {
		p.rt.Stats.OverCapFaults.Add(1)
		ev.Kick() // look again: a batch that takes a page ends the starving
		return false
	}
	if !p.rt.arming.Load() {
		p.rt.evictor.Waited() // at the cap, not arming: the evictor keeps more room
	}
	p.rt.evictor.Kick()
	return true
}

// makesRoom reports whether faults of thread tid are eviction's own, never held for room: the
// agent's (it moves and drops the victims) and the evictor's reads of the victims.
func (p *Process) makesRoom(tid int32) bool {
	return tid == p.agentTid.Load() || tid == p.rt.evictor.Tid()
}

// Room implements fetcher.Host.
func (p *Process) Room() int64 { return p.rt.roomPages() }

// RoomShort implements fetcher.Host: the evictor takes it as a fault that waited at the cap
// (unless the run is arming, when faults wait for the arming, not for room).
func (p *Process) RoomShort() {
	if !p.rt.arming.Load() {
		p.rt.evictor.Waited()
	}
	p.rt.evictor.Kick()
}

// PrefetchRoom implements fetcher.Host: prefetching fills the room below the evictor's high
// watermark and no more. The kernel's count (Used: tracked pages and the memory the page tables
// do not see yet) is what must stay under the cap, not only the tracked pages.
func (p *Process) PrefetchRoom() int64 { return p.rt.evictor.HighWater() - p.rt.evictor.Used() }

// Idle implements fetcher.Host: while a program thread is pinned, the fault thread looks at
// least twice a quiet spell, so that a thread done with paging is unpinned (placement.quiet).
func (p *Process) Idle(now int64) time.Duration {
	if len(p.place.gather.held) == 0 {
		return 0
	}
	p.place.quiet(p.Pid(), int(p.agentTid.Load()), now)
	return quietSpell / 2
}

// ForkChild implements fetcher.Host. Thread tid's process is taken for this child, not yet
// said hello, if it is not farmem, nor a process served under its pid, its parent is this
// child's parent (or init: orphaned), and its vDSO is where the parent's was (fork copies it
// there; another program has its own elsewhere). Only this child's own threads and remote
// readers of its memory fault on its uffd; a remote reader (a debugger) fails these tests, and
// its fault waits for the hello.
func (p *Process) ForkChild(tid int32) int {
	parent := p.forkParent
	if parent == nil || p.probe == 0 || p.Pid() != 0 || tid <= 0 {
		return 0
	}
	pid, err := procfs.Tgid(int(tid))
	if err != nil || pid == os.Getpid() || p.rt.Lookup(pid) != nil {
		return 0
	}
	if ppid, err := procfs.PPid(pid); err != nil || (ppid != parent.Pid() && ppid != 1) {
		return 0
	}
	if a, err := vdso(pid); err != nil || a != p.probe {
		return 0
	}
	return pid
}

// Exited implements fetcher.Host.
func (p *Process) Exited() bool { return p.exited.Load() }

// Forked implements fetcher.Host.
func (p *Process) Forked(fd int, table *pagetable.PageTable) { p.rt.forked(p, fd, table) }

// Unmapped implements fetcher.Host.
func (p *Process) Unmapped(start, end uint64) { p.forgetRange(start, end) }

// WakeIfWaiting implements evictor.Target: the evictor made room or finished a drop.
func (p *Process) WakeIfWaiting() {
	if p.Hold() {
		p.fetch.Wake()
		p.Release()
	}
}

// SetAgent attaches the agent connection; tid is the agent thread.
func (p *Process) SetAgent(a Agent, tid int) {
	p.agentMu.Lock()
	old := p.agent
	p.agent = a
	p.agentMu.Unlock()
	p.agentTid.Store(int32(tid))
	prioritizeAgent(tid) // without the privilege the agent is an ordinary thread: slower batches
	if old != nil {
		old.Close()
	}
	if p.rt.Armed() {
		p.rt.filterMappings(p)
	}
}
