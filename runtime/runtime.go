package runtime

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/faulttrace"
	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/prefetch"
	"github.com/farmem/farmem/procevents"
)

// PageSize is the page size farmem manages.
const PageSize = fetcher.PageSize

// DefaultMinRegister is the smallest anonymous mapping registered by default.
const DefaultMinRegister = 64 << 10

// Config is everything a Runtime needs. New takes it; nothing of it changes afterwards.
type Config struct {
	// CapPages is the cap: the pages the run's processes may hold resident, together.
	CapPages int64
	// Backend keeps evicted pages. The caller closes it once Close has returned.
	Backend backend.Backend
	// MinRegister is the smallest anonymous mapping registered (shim, filter and rescan
	// alike); 0: DefaultMinRegister.
	MinRegister uint64
	// MaxHeat is each page table's MaxHeat: how many extra passes through the victim queue a
	// page that keeps coming back may earn (0: FIFO).
	MaxHeat uint8
	// LastStayGuess is each page table's LastStayGuess: pages read back are installed writable
	// only on their own last stay's word.
	LastStayGuess bool
	// FaultsInProgram: each process's agent serves the faults it can from the process's store
	// space, and sends farmem the rest (ServeInProgram). Only with a Backend that keeps spaces.
	FaultsInProgram bool
	// NewPrefetcher makes each process's prefetcher (a fork child gets a fresh one); nil: no
	// prefetching.
	NewPrefetcher func() prefetch.Prefetcher
	// PrefetchCachePages > 0 puts prefetching in cache mode, with a prefetch cache of that many
	// pages, counted against the cap; 0 is map mode. Only with NewPrefetcher.
	PrefetchCachePages int
	// Record, if set, gets every served fault (farmem run --record-faults). The caller closes
	// it after Close.
	Record *faulttrace.Writer
	// Tracing, if set, hands sampled and slow faults and prefetch batches to its tracer.
	Tracing *fetcher.Tracing
	// EvictTrace, if set, gets every eviction batch once it is done.
	EvictTrace func(*evictor.BatchRecord)
	// NoFilter: no process of the run gets the mapping filter (farmem attach, attach.go: a
	// seccomp filter cannot be taken out of a process again). The rescan finds its mappings.
	NoFilter bool
	// Images, if set, enters the images processes of the run exec'd that do not load the shim
	// (ControlEnded); nil: they run without farmem.
	Images ImageServer
	// RawForks, if set, enters the child of a raw fork (RawFork) of a process with the shim,
	// whose atfork handler will not run in that child (serveFork); nil: let through.
	RawForks ForkServer
	// OnArm, if set, is called once when the run arms after it started unarmed, with the
	// programs' anonymous memory then, from the RSS poll's goroutine (never a fault's).
	OnArm func(anonBytes int64)
}

// Stats counts the run's work for the summary and the metrics: the fault path's (shared by
// every process's fetcher) and the runtime's own.
type Stats struct {
	fetcher.Stats
	ArmedAtPages atomic.Int64 // the anonymous RSS at which the run armed (0: armed from the start, or never)
	// PeakAnonPages is the highest anonymous RSS of all processes together that the RSS poll
	// saw: what the cap holds, as the kernel counts it, sampled.
	PeakAnonPages atomic.Int64
	// CgroupPeakBytes is the run's memory cgroup's peak charge, kept as the cgroup is removed
	// (see CgroupPeak).
	CgroupPeakBytes atomic.Int64
	// MappingsSeen is the mmap and brk calls the mapping filter handed us (mapfilter.go);
	// UnseenPages the pages the rescan found already present in mappings it registered once
	// armed: what the program wrote where no fault could hold it back.
	MappingsSeen, UnseenPages atomic.Int64
	// OverCapFaults is the faults let in over the cap because the evictor had nothing left it
	// could take (MustWait): held, they would have waited for ever.
	OverCapFaults atomic.Int64
	// Unserved is the images processes of the run exec'd that never said hello and could not be
	// entered (ControlEnded): they ran without farmem.
	Unserved atomic.Int64
	// Unfiltered is the processes served without the mapping filter, which their agent could
	// not install (one running as another user may not: mapfilter.go) and did not inherit.
	Unfiltered atomic.Int64
	// Entered is the images processes of the run exec'd that did not load the shim and that
	// farmem entered by injection (ControlEnded, Config.Images): served from then on.
	Entered atomic.Int64
	// Processes is how many processes the run served: the program, each image it exec'd and
	// each fork child.
	Processes atomic.Int64
	// HeldThreadsMax is the most threads of one process placement held on its fault thread's
	// CPU at once; BusyReleases how many times the held threads were let go because they took
	// most of that CPU themselves (gather.go).
	HeldThreadsMax, BusyReleases atomic.Int64
}

// Runtime owns every process of one `farmem run`: see the package doc.
type Runtime struct {
	cfg      Config // set by New, never changed
	slots    *pagetable.Slots
	evictor  *evictor.Evictor
	cache    *fetcher.PrefetchCache // nil: map mode, or no prefetching
	armPages int64                  // arm when the processes' anonymous RSS reaches this
	start    time.Time              // the fault trace's time zero

	// Stats: atomics, written by every goroutine of the run, read by anyone.
	Stats    Stats
	resident atomic.Int64 // pages resident in all processes, as their page tables count them

	armed  atomic.Bool // set once, never cleared
	arming atomic.Bool // the first rescan after arming is adopting pages: program faults wait
	// watch, once set (ContainChildren), tells the rescan loop when the programs' memory crosses
	// the arming threshold or, armed, nearCapPages; nil: it polls. Closed by the rescan loop as
	// it ends.
	watch atomic.Pointer[usageWatch]
	// filterFailed: a process's agent could not install the mapping filter (said once).
	filterFailed atomic.Bool

	mu    sync.Mutex
	procs map[*Process]bool       // protected by mu
	byPid map[int]*Process        // protected by mu
	forks map[*Process][]*Process // protected by mu; fork children awaiting their hello, per parent (live or retired), in fork order
	// vforkExecs: the vfork children whose exec is watched (vforkexec.go). Protected by mu.
	vforkExecs map[int]bool
	// images: the exec'd images serveImage is deciding on or named unserved, by pid, each the
	// vDSO's address in it (a new exec of that pid maps it elsewhere). Protected by mu.
	images map[int]uint64
	// retiredPids: the pids of the last processes retired, which the kernel's events of their
	// forks may still be on their way (servedOfLate). Protected by mu.
	retiredPids pidRing
	// retiring counts retires between leaving procs and having released everything the
	// process held (slots, fds). A process is live until then: the backend must outlive the
	// last slot release, so Live and Close wait for these too. Protected by mu; retired is
	// signalled (with mu) when it drops to zero.
	retiring int
	retired  *sync.Cond
	// lifelines are farmem's own, for fork children that have none (lifelines.go). Set by New.
	lifelines *lifelines
	failure   error // protected by mu; the first unrecoverable error

	started  atomic.Bool
	stop     chan struct{}  // closed by Close: the loops end
	finished sync.WaitGroup // the loops and the filter listeners
	// events tells of forks and execs as they happen (watchEvents); set by Start where farmem
	// may listen, closed by Close.
	events *procevents.Events
}

// New makes the runtime of one run. Start runs it; Close ends it.
func New(cfg Config) (*Runtime, error) {
	switch {
	case cfg.CapPages <= 0:
		return nil, fmt.Errorf("runtime: a cap of %d pages", cfg.CapPages)
	case cfg.Backend == nil:
		return nil, errors.New("runtime: no backend")
	case cfg.PrefetchCachePages < 0 || (cfg.PrefetchCachePages > 0 && cfg.NewPrefetcher == nil):
		return nil, fmt.Errorf("runtime: a prefetch cache of %d pages without a prefetcher", cfg.PrefetchCachePages)
	}
	if cfg.MinRegister == 0 {
		cfg.MinRegister = DefaultMinRegister
	}
	rt := &Runtime{
		cfg: cfg, slots: pagetable.NewSlots(cfg.Backend), armPages: cfg.CapPages - armMargin(cfg.CapPages), start: time.Now(),
		procs: map[*Process]bool{}, byPid: map[int]*Process{}, forks: map[*Process][]*Process{}, vforkExecs: map[int]bool{}, images: map[int]uint64{}, lifelines: newLifelines(),
		stop: make(chan struct{}),
	}
	rt.retired = sync.NewCond(&rt.mu)
	rt.armed.Store(rt.armPages <= 0)
	rt.evictor = evictor.New(evictor.Config{CapPages: cfg.CapPages, Resident: &rt.resident, Backend: cfg.Backend,
		Targets: rt.targets, Trace: cfg.EvictTrace})
	if cfg.PrefetchCachePages > 0 {
		rt.cache = fetcher.NewPrefetchCache(cfg.PrefetchCachePages, &rt.evictor.Cached)
	}
	return rt, nil
}

// Start runs the evictor, the RSS poll that arms the run and finds unseen mappings, and, where
// farmem may listen, the watch of the kernel's process events. Call it once, before the first
// Attach.
func (rt *Runtime) Start() {
	if !rt.started.CompareAndSwap(false, true) {
		return
	}
	rt.finished.Add(2)
	go func() { defer rt.finished.Done(); rt.evictor.Loop(rt.stop) }()
	go func() { defer rt.finished.Done(); rt.rescanLoop() }()
	if evs, err := procevents.Listen(); err == nil { // else the rescan loop looks
		rt.events = evs
		rt.finished.Add(1)
		go func() { defer rt.finished.Done(); rt.watchEvents(evs) }()
	}
}

// Close retires every process, waits until nothing holds a slot of the backend, and stops the
// runtime's goroutines. The caller may close the backend once it returns.
func (rt *Runtime) Close() {
	for _, t := range rt.targets() {
		rt.retire(t.(*Process))
	}
	// A retire begun elsewhere (the exit watcher) may still be releasing slots.
	rt.mu.Lock()
	for rt.retiring > 0 {
		rt.retired.Wait()
	}
	rt.mu.Unlock()
	close(rt.stop)
	if rt.events != nil {
		rt.events.Close()
	}
	rt.finished.Wait()
	rt.lifelines.close()
}

// Config returns the configuration the runtime was made with (MinRegister filled in).
func (rt *Runtime) Config() Config { return rt.cfg }

// Evictor is the run's evictor: its Stats and watermarks are for reading.
func (rt *Runtime) Evictor() *evictor.Evictor { return rt.evictor }

// PrefetchCache is cache mode's prefetch cache; nil in map mode or without prefetching.
func (rt *Runtime) PrefetchCache() *fetcher.PrefetchCache { return rt.cache }

// Resident is the pages resident in all processes, as their page tables count them (none
// before the run arms).
func (rt *Runtime) Resident() int64 { return rt.resident.Load() }

// Armed reports whether ranges are registered with userfaultfd yet.
func (rt *Runtime) Armed() bool { return rt.armed.Load() }

// ArmPages is the programs' anonymous memory, in pages, at which the run arms (0 or less: it
// armed from the start).
func (rt *Runtime) ArmPages() int64 { return rt.armPages }

// ArmWatched reports whether a memory cgroup's thresholds, not polling, say when to arm and
// when the programs near their cap.
func (rt *Runtime) ArmWatched() bool { return rt.watch.Load() != nil }

// CgroupPeak returns the most memory the kernel ever charged to the run's memory cgroup, which
// every process of the run is born in (ContainChildren): its exact peak, anonymous memory, page
// cache and kernel memory together, as a memory cgroup's limit counts them. false: the run had
// no cgroup of its own (it polled).
func (rt *Runtime) CgroupPeak() (bytes int64, ok bool) {
	if w := rt.watch.Load(); w != nil {
		if b, ok := w.peak(); ok {
			return b, true
		}
	}
	b := rt.Stats.CgroupPeakBytes.Load()
	return b, b > 0
}

// BytesIn is the page bytes read from the backend: faults served from it and pages prefetched
// (counted as pages: the compressed stores read fewer).
func (rt *Runtime) BytesIn() int64 {
	return (rt.Stats.BackendFaults.Load() + rt.Stats.PrefetchInstalled.Load()) * PageSize
}

// BytesOut is the page bytes evictions wrote to the backend.
func (rt *Runtime) BytesOut() int64 { return rt.evictor.Stats.Written.Load() * PageSize }

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
	res := rt.resident.Load()
	return rt.arming.Load() || res >= rt.cfg.CapPages || (res > minTracked && rt.evictor.Used() >= rt.evictor.Limit())
}

// roomPages is how many pages faults may still bring in before they wait.
func (rt *Runtime) roomPages() int64 {
	return min(rt.cfg.CapPages-rt.resident.Load(), rt.evictor.Limit()-rt.evictor.Used())
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
