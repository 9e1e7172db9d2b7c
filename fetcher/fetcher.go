package fetcher

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/faulttrace"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/prefetch"
	"github.com/farmem/farmem/pubtable"
	"github.com/farmem/farmem/uffd"
)

// PageSize is the page size farmem manages.
const PageSize = uffd.PageSize

const ps = PageSize

// Host is the runtime's side of the process a Fetcher serves. Its methods are called on the
// fault thread unless they say otherwise, and must not wait on the program.
type Host interface {
	// Pid is the process's pid; 0 until its hello (a fork child is served before it says it).
	// Any goroutine.
	Pid() int
	// Faulting is told of every fault, by thread tid, before it is served.
	Faulting(tid int32)
	// MustWait reports whether a MISSING fault by thread tid must wait for the evictor to make
	// room (Wake ends the wait) rather than install a page now.
	MustWait(tid int32) bool
	// Room is how many pages faults may still install before they wait.
	Room() int64
	// PrefetchRoom is how many pages prefetching may install now: a guess must never make the
	// evictor take a page in use. Any goroutine.
	PrefetchRoom() int64
	// RoomShort says that the agent was granted less room than it is kept at: the evictor
	// should keep more, and make some now.
	RoomShort()
	// Idle is called when the fault thread has no fault pending, at now (nanotime); it returns
	// how long the thread may sleep before it must be called again (0: until woken).
	Idle(now int64) time.Duration
	// Forked takes a FORK event's uffd, the fork child's, and the child's page table (cloned
	// from this process's at the event).
	Forked(fd int, table *pagetable.PageTable)
	// Unmapped says that [start, end) is no longer mapped where it was (UNMAP, or the source of
	// a REMAP): nothing there is registered any more.
	Unmapped(start, end uint64)
	// Fail stops the process: it cannot be served without being given wrong data. Any goroutine.
	Fail(err error)
	// ForkChild returns, for a fork child that has not said hello yet (Pid 0), the pid of the
	// process thread tid belongs to if that process is this child, else 0.
	ForkChild(tid int32) int
	// Exited reports whether the process is gone: no thread of its own waits in a fault any
	// more, only farmem's reads of its memory (an eviction batch's) can.
	Exited() bool
	// Hold keeps the uffd open until Release; false once the process is retired. The prefetch
	// worker installs between the two.
	Hold() bool
	Release()
}

// Config is everything a Fetcher needs; none of it changes while the Fetcher runs.
type Config struct {
	UFFD    int // the process's userfaultfd: the Host's, open until the Fetcher is closed
	Table   *pagetable.PageTable
	Backend backend.Backend
	Host    Host
	Stats   *Stats // shared by every process of the run
	// Prefetcher predicts the pages to bring ahead of demand; nil: no prefetching.
	Prefetcher prefetch.Prefetcher
	// Cache puts prefetching in cache mode (Leap's); nil: map mode (see prefetch.go).
	Cache *PrefetchCache
	// Record, if set, gets every served fault, timed from Epoch (farmem run --record-faults).
	Record *faulttrace.Writer
	Epoch  time.Time
	// Tracing, if set, hands sampled and slow faults to its Tracer (tracing.go).
	Tracing *Tracing
	// Fence, if set, is the process's move fence: the uffd is read under its lock (read).
	Fence *pubtable.Fence
}

// Fetcher serves one process's faults.
type Fetcher struct {
	fd      int
	table   *pagetable.PageTable
	store   backend.Backend
	host    Host
	stats   *Stats
	cache   *PrefetchCache
	record  *faulttrace.Writer
	epoch   time.Time
	tracing *Tracing
	fence   *pubtable.Fence // nil: none

	stop int // eventfd that ends the fault thread
	room int // eventfd written by Wake

	// waiting: the fault thread holds faults that wait for the evictor or for an event.
	// Written by the fault thread, read by Wake.
	waiting atomic.Bool

	zero  zeroStreams   // fault thread only: sequential first-touch detection
	pf    prefetchState // fault thread only, under the table's lock; pf.pred nil: no prefetching
	clock faultClock    // fault thread only: stage timestamps of the fault being served, if traced
	// faultTid is the thread whose fault is being served (memPid); fault thread only.
	faultTid int32
	// prefetchQ carries the fault thread's predictions to the prefetch worker (memory servers);
	// nil without a worker. Closed by Stop once the fault thread has ended.
	prefetchQ chan prefetchBatch
	done      chan struct{} // closed when the fault thread has ended
	// stopped is set by Stop: the fault thread, which polls only when no fault is queued,
	// looks at it before each read.
	stopped atomic.Bool
	// handover is set by HandOver: the agent is to read the uffd (inprogram.go); in is the
	// fault thread's once it has switched (fault thread only); installCtl is in's control
	// page from then on, for every install's lock (copy, zeroPage).
	handover   atomic.Pointer[inProgram]
	in         *inProgram
	installCtl atomic.Pointer[pubtable.Ctl]
}

// New makes the fetcher of one process. Start runs it.
func New(cfg Config) (*Fetcher, error) {
	if cfg.Host == nil || cfg.Table == nil || cfg.Backend == nil || cfg.Stats == nil {
		return nil, errors.New("fetcher: Config needs a Host, a Table, a Backend and Stats")
	}
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	room, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(stop)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	f := &Fetcher{
		fd: cfg.UFFD, table: cfg.Table, store: cfg.Backend, host: cfg.Host, stats: cfg.Stats,
		cache: cfg.Cache, record: cfg.Record, epoch: cfg.Epoch, tracing: cfg.Tracing, fence: cfg.Fence,
		stop: stop, room: room, done: make(chan struct{}),
	}
	f.clock.on = cfg.Tracing != nil
	f.clock.rng = uint64(nanotime()) | 1 // xorshift's state must not be 0
	if cfg.Prefetcher != nil {
		f.pf.pred = cfg.Prefetcher
		if _, remote := cfg.Backend.(backend.BatchLoader); remote {
			f.prefetchQ = make(chan prefetchBatch, 16)
		} else {
			f.pf.inline = newPrefetchScratch()
		}
	}
	return f, nil
}

// Start runs the fault thread and, with memory servers and a prefetcher, the prefetch worker.
func (f *Fetcher) Start() {
	go f.serve()
	if f.prefetchQ != nil {
		procsForWorkers(workers.Add(1))
		go f.prefetchLoop()
	}
}

// workers counts the fetchers running with a prefetch worker.
var workers atomic.Int64

// procsForWorkers gives the Go scheduler a P per fault thread that wakes a prefetch worker,
// beyond one per CPU. A fault thread is locked to its OS thread and keeps its P across the
// short system calls it makes one after another, and the worker its channel send readies is
// queued on that P: with no P free to steal it from, it waited there until the runtime's
// monitor thread (sysmon, which sleeps up to 10 ms when it finds nothing to do) took the P
// back, while the program faulted on the very pages the batch was to bring
// (results/tcp/why.md). The number only grows (a change stops the
// world), and an idle P costs next to nothing.
func procsForWorkers(n int64) {
	if want := runtime.NumCPU() + int(n); runtime.GOMAXPROCS(0) < want {
		runtime.GOMAXPROCS(want)
	}
}

// Stop ends the fault thread, waits for it, and ends the prefetch worker once it has finished
// its batch. The process's faults are no longer served.
func (f *Fetcher) Stop() {
	f.stopped.Store(true)
	var one = [8]byte{1}
	unix.Write(f.stop, one[:])
	<-f.done
	if f.prefetchQ != nil {
		close(f.prefetchQ) // the fault thread, its only sender, has ended
		workers.Add(-1)
	}
	if f.cache != nil {
		f.cache.forget(f)
	}
}

// Close releases what New took. Call it after Stop, with the uffd held by nobody (the Host's
// retire, under the lock Hold takes for reading), so that no Wake writes a closed eventfd.
func (f *Fetcher) Close() {
	unix.Close(f.stop)
	unix.Close(f.room)
	if in := f.handover.Load(); in != nil {
		unix.Close(in.sock)
	}
}

// Wake tells the fault thread that faults waiting for room, or for a page's drop or prefetch
// to finish, may go on. Any goroutine, with the uffd held (Host.Hold).
func (f *Fetcher) Wake() {
	if f.waiting.Load() {
		var one = [8]byte{1}
		unix.Write(f.room, one[:])
	}
}
