package fetcher

import (
	"bufio"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/faulttrace"
	"github.com/farmem/farmem/latency"
	"github.com/farmem/farmem/pagetable"
)

// Source is where a fault was served from.
type Source int

const (
	FromZero    Source = iota // first touch, or a page the program discarded: zeros, no backend
	FromBackend               // an evicted page read back from the backend
	FromWP                    // the first write to a clean page: un-write-protect, no copy
	FromCache                 // an evicted page found in the prefetch cache (cache mode)
	NumSources
)

func (s Source) String() string { return [...]string{"zero", "backend", "wp", "cache"}[s] }

// Stats counts fault-path work for the run summary.
type Stats struct {
	ZeroFills, ZeroPages, BackendFaults atomic.Int64
	// Latency is each source's fault-service time: from reading the fault message to the
	// install (or wake) ioctl's return, including any wait at the cap or behind an event.
	Latency [NumSources]latency.Histogram
	Removes atomic.Int64 // REMOVE events (the program's and our own DONTNEEDs)
	// FromStaging is the pages fork children read from their copy of the parent's staging
	// area: the parent had moved them out, and not yet stored them, when it forked.
	FromStaging  atomic.Int64
	ArmedAtPages atomic.Int64 // the anonymous RSS at which the run armed (0: armed from the start, or never)
	// Prefetching: pages queued for the workers, installed by them, and used by the program
	// (map mode: inferred from where the next miss landed; cache mode: faults that hit).
	PrefetchIssued, PrefetchInstalled, PrefetchUsed atomic.Int64
	// MappingsSeen is the mmap and brk calls the mapping filter handed us (mapfilter.go);
	// UnseenPages the pages the rescan found already present in mappings it registered once
	// armed: what the program wrote where no fault could hold it back.
	MappingsSeen, UnseenPages atomic.Int64
}

// Runtime owns every process of one `farmem run`.
//
// Arming: a range is registered with userfaultfd only once the run's anonymous memory nears
// the cap (ArmPages). Until then the program's first touches are the kernel's own (about a
// microsecond, against a uffd round trip of 4 to 80 here) and farmem costs it nothing; a run
// whose cap is above its peak never arms. Arming registers every anonymous mapping and adopts
// the pages already present, so nothing touched before is lost to the page table.
type Runtime struct {
	Slots    *pagetable.Slots
	Resident atomic.Int64 // pages resident in all processes (tracked ones: nothing before arming)
	CapPages int64
	ArmPages int64 // arm when the processes' anonymous RSS reaches this
	Evictor  *evictor.Evictor
	Stats    Stats
	// MinRegister is the smallest anonymous mapping registered (shim and rescan alike).
	MinRegister uint64
	// NewPredictor makes each process's prefetcher (a fork child gets a fresh one); nil: no
	// prefetching. Set both before the first Attach.
	NewPredictor func() Predictor
	// PrefetchCache, if set, puts the predictor in cache mode: predicted pages wait in it for
	// their fault rather than being installed (map mode). Its pages count against the cap
	// (Evictor.Cached). Set it before the first Attach.
	PrefetchCache *PrefetchCache
	// Trace, if set, records every served fault (farmem run --record-faults). Set it before
	// the first Attach; the caller closes it after Close.
	Trace *faulttrace.Writer
	start time.Time // Trace's time zero
	// Tracer, if set, gets the faults the head sampler picks (TraceSample: SampleThreshold of
	// the ratio) and every fault slower than TraceSlow (0: none for being slow), after they are
	// served (tracing.go). Set all three before the first Attach.
	Tracer      Tracer
	TraceSample uint64
	TraceSlow   time.Duration
	// SlowBudget bounds the records kept for being slow (not head-sampled) to so many a
	// second, across the run; zero: no bound. Set it with the other three.
	SlowBudget SlowBudget
	// MaxHeat is each process's page table's MaxHeat: how many extra passes through the
	// victim queue a page that keeps coming back may earn (0: FIFO). Set before the first Attach.
	MaxHeat uint8
	// PeakAnonPages is the highest anonymous RSS of all processes together that the runtime's
	// poll saw (every 2 ms once armed): the cap as the kernel measures it.
	PeakAnonPages atomic.Int64

	armed atomic.Bool // set once, never cleared
	// watch, once set (ContainChildren), tells the rescan loop when the programs' memory
	// crosses the arming threshold or, armed, nearCapPages, so that it polls a
	// few times a second instead of hundreds while below. nil: it polls (pollInterval). Closed
	// by the rescan loop as it ends.
	watch  atomic.Pointer[usageWatch]
	arming atomic.Bool // the first rescan after arming is adopting pages: program faults wait

	mu    sync.Mutex
	procs map[*Process]bool       // protected by mu
	byPid map[int]*Process        // protected by mu
	forks map[*Process][]*Process // protected by mu; fork children awaiting their hello, per parent, in fork order
	// retiring counts retires between leaving procs and having released everything the
	// process held (slots, fds). A process is live until then: the backend must outlive the
	// last slot release, so Live and Close wait for these too. Protected by mu; retired is
	// signalled (with mu) when it drops to zero.
	retiring int
	retired  *sync.Cond
	failure  error // protected by mu; first unrecoverable error
	stop     chan struct{}
	finished sync.WaitGroup
	// filterFailed: a process's agent could not install the mapping filter (said once).
	filterFailed atomic.Bool
}

// armMargin is how far below the cap arming starts: the memory the program may touch between
// two RSS polls (2 ms) and while arming registers and adopts its mappings. A cap within this
// margin of zero arms at once.
func armMargin(capPages int64) int64 { return max(capPages/4, (32<<20)/PageSize) }

// NewRuntime builds a runtime holding at most capPages resident pages, storing evicted pages in b.
func NewRuntime(capPages int64, b backend.Backend) *Runtime {
	rt := &Runtime{
		Slots: pagetable.NewSlots(b), CapPages: capPages, ArmPages: capPages - armMargin(capPages), MinRegister: 64 << 10, MaxHeat: pagetable.DefaultMaxHeat,
		procs: map[*Process]bool{}, byPid: map[int]*Process{}, forks: map[*Process][]*Process{},
		stop: make(chan struct{}), start: time.Now(),
	}
	rt.retired = sync.NewCond(&rt.mu)
	rt.armed.Store(rt.ArmPages <= 0)
	rt.Evictor = evictor.New(capPages, &rt.Resident, b, rt.targets)
	rt.finished.Add(2)
	go func() { defer rt.finished.Done(); rt.Evictor.Loop(rt.stop) }()
	go func() { defer rt.finished.Done(); rt.rescanLoop() }()
	return rt
}

// ContainChildren moves the calling thread, which must be locked to its OS thread, into a
// memory cgroup of the run's own whose usage thresholds say when to arm and when the programs
// near their cap (usageWatch), until started is called: the programs the thread starts
// meanwhile are born in it. Without one (no cgroup v1 memory controller, no right to make a
// cgroup) the run polls: the error says why, started is still to be called, and nothing else
// changes.
func (rt *Runtime) ContainChildren() (started func(), err error) {
	w, err := newUsageWatch(rt.ArmPages*PageSize, rt.nearCapPages()*PageSize)
	if err != nil {
		return func() {}, fmt.Errorf("watching the programs' memory: %w", err)
	}
	tid := unix.Gettid()
	started = func() {
		if err := w.leave(tid); err != nil {
			w.close() // not watched: the rmdir fails while farmem's thread is in it, and the next run sweeps it
			return
		}
		rt.watch.Store(w)
		select {
		case <-rt.stop: // the rescan loop may have ended already
			rt.closeWatch(w)
		default:
		}
	}
	return started, nil
}

// closeWatch closes w unless the rescan loop has (it closes the one it finds as it ends).
func (rt *Runtime) closeWatch(w *usageWatch) {
	if rt.watch.CompareAndSwap(w, nil) {
		w.close()
	}
}

// ArmWatched reports whether a memory cgroup's thresholds, not polling, say when to arm and
// when the programs near their cap.
func (rt *Runtime) ArmWatched() bool { return rt.watch.Load() != nil }

func (rt *Runtime) targets() []evictor.Target {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	out := make([]evictor.Target, 0, len(rt.procs))
	for p := range rt.procs {
		out = append(out, p)
	}
	return out
}

// overCap reports whether program faults must wait for the evictor (or for arming to finish):
// the tracked pages alone reach the cap, or everything counted (Unmanaged too) reaches the
// evictor's Limit while it still has tracked pages to take. Below minTracked they go on: the
// program's unmanaged memory alone fills its cap, and faults waiting would wait for room that
// never comes.
func (rt *Runtime) overCap() bool {
	const minTracked = 64
	res := rt.Resident.Load()
	return rt.arming.Load() || res >= rt.CapPages || (res > minTracked && rt.Evictor.Used() >= rt.Evictor.Limit())
}

// roomPages is how many pages faults may still bring in before they wait.
func (rt *Runtime) roomPages() int64 {
	return min(rt.CapPages-rt.Resident.Load(), rt.Evictor.Limit()-rt.Evictor.Used())
}
func (rt *Runtime) kickEvictor() {
	select {
	case rt.Evictor.Kick <- struct{}{}:
	default:
	}
}

func (rt *Runtime) noteFailure(err error) {
	rt.mu.Lock()
	if rt.failure == nil {
		rt.failure = err
	}
	rt.mu.Unlock()
}

// Fail stops every process of the run: the backend has lost pages they may need (a memory
// server died with the only copy), and no process may run on without them.
func (rt *Runtime) Fail(err error) {
	rt.noteFailure(err)
	for _, t := range rt.targets() {
		t.(*Process).Fail(err)
	}
}

// Failure returns the first error that made the runtime stop a process.
func (rt *Runtime) Failure() error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.failure
}

// Attach adopts a program process that said hello with its uffd.
func (rt *Runtime) Attach(pid, fd int) (*Process, error) { return rt.attach(pid, fd, 0) }

// attach adopts process pid, a fork child of ppid with nothing registered if ppid != 0.
func (rt *Runtime) attach(pid, fd, ppid int) (*Process, error) {
	tb := pagetable.New(&rt.Resident, rt.Slots)
	tb.MaxHeat = rt.MaxHeat
	p, err := newProcess(rt, fd, tb)
	if err != nil {
		return nil, err
	}
	p.pid.Store(int32(pid))
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
	if old != nil {
		rt.retire(old)
	}
	p.start()
	rt.watchExit(p, pid)
	return p, nil
}

// Armed reports whether ranges are registered with userfaultfd yet.
func (rt *Runtime) Armed() bool { return rt.armed.Load() }

// forked starts serving a fork child at once (its pid comes later, with its hello).
func (rt *Runtime) forked(parent *Process, fd int, table *pagetable.PageTable) {
	c, err := newProcess(rt, fd, table)
	if err != nil {
		parent.Fail(err)
		return
	}
	// The kernel copied the parent's registrations to the child's uffd: the child's rescan
	// must not take them for mappings it has never seen.
	parent.regMu.Lock()
	maps.Copy(c.registered, parent.registered)
	parent.regMu.Unlock()
	c.place.orig = parent.place.orig // set before the parent's fault thread started: read-only
	rt.mu.Lock()
	rt.procs[c] = true
	rt.forks[parent] = append(rt.forks[parent], c)
	rt.mu.Unlock()
	c.start()
}

// AttachForked attaches a fork child that said hello with a fresh uffd of its own (fd).
//
// If the parent had ranges registered when it forked, the kernel gave the child their
// registrations on a new uffd and raised a FORK event in the parent: the child is served on
// that uffd, with the page table cloned at the event, and fd is closed. Children of one
// parent are matched in fork order; the shim says hello from its atfork handler, so this is
// exact unless two threads of one process fork at the same instant. The child is runnable
// before its parent's FORK event is read, so its hello may arrive first: wait for the event.
//
// If the parent had nothing registered (not armed yet, or only small mappings), no FORK event
// comes: the child holds no evicted page and starts afresh on fd. The child's smaps tell the
// two apart exactly: it has not run any code of its own yet (it says hello from its atfork
// handler), so its registrations are still the ones fork copied.
func (rt *Runtime) AttachForked(pid, ppid, fd int) (*Process, error) {
	inherited, err := hasRegistrations(pid)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("fork child %d: %w", pid, err)
	}
	if !inherited {
		return rt.attach(pid, fd, ppid)
	}
	unix.Close(fd)
	deadline := time.Now().Add(10 * time.Second)
	rt.mu.Lock()
	for {
		if parent := rt.byPid[ppid]; parent != nil && len(rt.forks[parent]) > 0 {
			break
		}
		rt.mu.Unlock()
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("fork child %d: no FORK event from parent %d", pid, ppid)
		}
		time.Sleep(200 * time.Microsecond)
		rt.mu.Lock()
	}
	parent := rt.byPid[ppid]
	q := rt.forks[parent]
	c := q[0]
	rt.forks[parent] = q[1:]
	c.pid.Store(int32(pid))
	rt.byPid[pid] = c
	rt.mu.Unlock()
	programAffinity(pid, parent) // undo a pinning it inherited; c already has the parent's
	rt.watchExit(c, pid)
	return c, nil
}

// hasRegistrations reports whether any mapping of pid is registered with a userfaultfd
// (VmFlags "um" in /proc/PID/smaps).
func hasRegistrations(pid int) (bool, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps", pid))
	if err != nil {
		return false, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := sc.Text(); strings.HasPrefix(l, "VmFlags:") && slices.Contains(strings.Fields(l), "um") {
			return true, nil
		}
	}
	return false, sc.Err()
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
		rt.retire(p)
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
		rt.retire(p)
	}()
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
	}
	for _, c := range rt.forks[p] {
		// A child that never said hello: it has exited, or was forked without libc's fork.
		defer rt.retireLater(c)
	}
	delete(rt.forks, p)
	rt.retiring++
	rt.mu.Unlock()
	defer func() {
		rt.mu.Lock()
		if rt.retiring--; rt.retiring == 0 {
			rt.retired.Broadcast()
		}
		rt.mu.Unlock()
	}()
	p.Stop()
	if p.prefetchQ != nil {
		close(p.prefetchQ) // the fault thread, its only sender, has stopped
	}
	if c := rt.PrefetchCache; c != nil {
		c.forget(p)
	}
	p.agentMu.Lock()
	if p.agent != nil {
		p.agent.Close()
	}
	p.agentMu.Unlock()
	p.life.Lock()
	p.retired = true
	p.table.Lock()
	p.table.Clear()
	p.table.Unlock()
	unix.Close(p.fd)
	unix.Close(p.stop)
	unix.Close(p.room)
	p.life.Unlock()
}

func (rt *Runtime) retireLater(c *Process) {
	go func() {
		time.Sleep(time.Second)
		if c.Pid() == 0 {
			rt.retire(c)
		}
	}()
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

// Close stops everything.
func (rt *Runtime) Close() {
	for _, t := range rt.targets() {
		rt.retire(t.(*Process))
	}
	// A retire begun elsewhere (the exit watcher) may still be releasing slots; the caller
	// closes the backend as soon as Close returns.
	rt.mu.Lock()
	for rt.retiring > 0 {
		rt.retired.Wait()
	}
	rt.mu.Unlock()
	close(rt.stop)
	rt.finished.Wait()
}

// rescanLoop arms the run when its anonymous memory nears the cap, and from then on finds
// anonymous mappings the shim could not see (glibc malloc's internal brk and mmap) and
// registers them, adopting their present pages. Nothing faults in memory we have not
// registered, so the only sign of it is the kernel's count: it reads each process's anonymous
// RSS (statm, one pread) every 2 ms once armed, less often before (pollInterval), or every
// 50 ms while the run's memory cgroup is below the threshold that matters (usageWatch), and
// rescans a process at once when its RSS drifts from the pages we track by more than
// unseenPages; otherwise every 100 ms.
func (rt *Runtime) rescanLoop() {
	const unseenPages = 512
	t := time.NewTimer(pollInterval(rt.armed.Load(), 0, rt.ArmPages))
	defer t.Stop()
	last := map[*Process]time.Time{}
	anon := map[*Process]int64{}
	statms := map[*Process]*statm{}
	reserve := evictor.NewBurstReserve(rt.CapPages)
	defer func() {
		for _, s := range statms {
			s.close()
		}
		if w := rt.watch.Swap(nil); w != nil {
			w.close()
		}
	}()
	for {
		var crossed chan struct{}
		if w := rt.watch.Load(); w != nil {
			crossed = w.crossed
		}
		select {
		case <-rt.stop:
			return
		case <-t.C:
		case <-crossed:
		}
		now := time.Now()
		procs := rt.targets()
		var total int64
		clear(anon)
		for _, tg := range procs {
			p := tg.(*Process)
			if p.Pid() == 0 {
				continue
			}
			s := statms[p]
			if s == nil {
				var err error
				if s, err = openStatm(p.Pid()); err != nil {
					continue // it has exited
				}
				statms[p] = s
			}
			anon[p] = s.anonPages()
			total += anon[p]
		}
		// anon now holds every live process that said hello: whatever else is kept is gone.
		for p, s := range statms {
			if _, ok := anon[p]; !ok {
				s.close()
				delete(statms, p)
				delete(last, p)
			}
		}
		if total > rt.PeakAnonPages.Load() {
			rt.PeakAnonPages.Store(total)
		}
		if !rt.armed.Load() {
			if total < rt.ArmPages {
				t.Reset(rt.unarmedInterval(total))
				continue
			}
			rt.arm(total, anon)
			t.Reset(fastestPoll)
			continue
		}
		t.Reset(rt.armedInterval())
		var unmanaged, unseen int64
		for p, a := range anon {
			p.table.Lock()
			tracked := int64(p.table.Resident())
			p.table.Unlock()
			unmanaged += max(a-tracked, 0)
			if now.Sub(last[p]) < 100*time.Millisecond && a-tracked < unseenPages {
				continue
			}
			last[p] = now
			unseen += p.Rescan()
		}
		rt.Stats.UnseenPages.Add(unseen)
		rt.Evictor.Unmanaged.Store(unmanaged)
		rt.Evictor.Reserve.Store(reserve.Observe(now, unseen))
		if rt.Evictor.Used() > rt.Evictor.HighWater() {
			rt.kickEvictor()
		}
	}
}

// unarmedInterval is how long the rescan loop may sleep before arming, the programs holding
// total pages: the slowest poll (which only keeps PeakAnonPages current) while the run's
// memory cgroup is below the arming threshold, whose crossing its watch reports; else, or
// with no watch, pollInterval.
func (rt *Runtime) unarmedInterval(total int64) time.Duration {
	if w := rt.watch.Load(); w != nil && w.below(rt.ArmPages*PageSize) {
		return slowestPoll
	}
	return pollInterval(false, total, rt.ArmPages)
}

// armedInterval is how long the rescan loop may sleep once armed: the slowest poll while the
// run's memory cgroup is below nearCapPages (the programs' anonymous memory, which the cgroup's
// usage bounds, is then below it too, registered or not: nothing unseen can bring them near the
// cap without crossing it, which the watch reports) and so is what the evictor counts; else the
// fastest.
func (rt *Runtime) armedInterval() time.Duration {
	near := rt.nearCapPages()
	if w := rt.watch.Load(); w != nil && rt.Evictor.Used() < near && w.below(near*PageSize) {
		return slowestPoll
	}
	return fastestPoll
}

// nearCapPages is the watch's second threshold: as far below the evictor's lowest low watermark
// as that is below the cap. A paging run stays above it (eviction stops at the low watermark), so
// its crossings, each a wakeup of farmem's, come only when the programs' memory really falls
// or rises, not with every batch; one at the low watermark itself fired twice a batch and cost
// micro's random walk 10-30 %.
func (rt *Runtime) nearCapPages() int64 { return rt.CapPages - 2*rt.Evictor.MaxHead }

// arm registers every process's mappings. Until the pages already present are adopted,
// Resident undercounts them and the cap cannot hold back new faults, so program faults wait
// (milliseconds, once) rather than let the program grow past the cap meanwhile.
func (rt *Runtime) arm(total int64, procs map[*Process]int64) {
	rt.arming.Store(true)
	rt.armed.Store(true)
	rt.Stats.ArmedAtPages.Store(total)
	for p := range procs {
		rt.filterMappings(p) // first: a mapping made during the rescan is seen either way
		p.Rescan()
	}
	rt.arming.Store(false)
	rt.kickEvictor()
	for p := range procs {
		p.WakeIfWaiting()
	}
}

// Rescan registers every private anonymous writable mapping of at least MinRegister bytes and
// returns how many pages it found present in them: pages the program took unseen.
func (p *Process) Rescan() (adopted int64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", p.Pid()))
	if err != nil {
		return
	}
	defer f.Close()
	// Register every mapping first and adopt after: from its registration on, a mapping's new
	// pages fault (and count against the cap); adopting first would leave the later mappings
	// open to untracked growth for as long as the pagemap reads take (ms, when arming).
	var fresh [][2]uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		start, end, ok := anonMapping(sc.Text())
		if !ok || end-start < p.rt.MinRegister {
			continue
		}
		if ok, _ := p.register(start, end-start); ok { // EINVAL/ENOMEM: the mapping changed meanwhile
			fresh = append(fresh, [2]uint64{start, end - start})
		}
	}
	for _, r := range fresh {
		n, _ := p.adopt(r[0], r[1])
		adopted += n
	}
	return adopted
}

// anonMapping parses one /proc/PID/maps line and reports whether it is private anonymous
// read-write memory, or a reservation (no access yet: glibc reserves a thread arena's 64 MiB and
// opens it with mprotect as it grows, and a registration survives that mprotect): no file, not
// the main stack, vdso or vvar.
func anonMapping(line string) (start, end uint64, ok bool) {
	f := strings.Fields(line)
	if len(f) < 5 || (f[1] != "rw-p" && f[1] != "---p") || f[4] != "0" {
		return 0, 0, false
	}
	if len(f) >= 6 && f[5] != "[heap]" {
		return 0, 0, false
	}
	se := strings.SplitN(f[0], "-", 2)
	s, err1 := strconv.ParseUint(se[0], 16, 64)
	e, err2 := strconv.ParseUint(se[1], 16, 64)
	return s, e, err1 == nil && err2 == nil
}

// PageSize is the page size farmem manages.
const PageSize = ps

// BytesIn is the page bytes read from the backend: faults served from it and pages prefetched
// (counted as pages: the compressed stores read fewer).
func (rt *Runtime) BytesIn() int64 {
	return (rt.Stats.BackendFaults.Load() + rt.Stats.PrefetchInstalled.Load()) * PageSize
}

// BytesOut is the page bytes evictions wrote to the backend.
func (rt *Runtime) BytesOut() int64 { return rt.Evictor.Stats.Written.Load() * PageSize }
