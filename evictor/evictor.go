package evictor

import (
	"errors"
	"runtime"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
)

// Run is a contiguous range of pages.
type Run struct{ Addr, Len uint64 }

// Target is one process the evictor may take pages from.
type Target interface {
	Pid() int
	UFFD() int
	Table() *pagetable.PageTable
	// CanEvict reports whether the process has an agent to drop pages.
	CanEvict() bool
	// Drop runs commit, then asks the process's agent to madvise(DONTNEED) the runs commit
	// returned (none: nothing is asked) and waits for it. commit runs under the agent's own
	// lock: no mapping call the agent makes for the program (the mapping filter's mmap and brk)
	// comes between the commit and the drop, and lands on a page committed and not yet dropped.
	Drop(commit func() []Run) error
	// Staging returns the process's staging area, BatchPages pages made on first use, or 0 if
	// its pages cannot be moved (a fork child; a kernel without UFFDIO_MOVE). It is registered
	// on the process's uffd; the REMOVE event of its drop is no change to the layout (the page
	// table's Layout does not count it).
	Staging() uint64
	// Move asks the process's agent to UFFDIO_MOVE runs, page after page, into the staging
	// area from dst on, and waits for it. status[k] is 0 if the k-th page moved, else the
	// errno that kept it in the program: ESTALE if a layout event was read after the
	// layout-th, the last the page table had applied when the batch chose its victims (the
	// page at the victim's address may be another's by then: pubtable.Fence).
	Move(runs []Run, dst uint64, layout uint64, status []byte) error
	// Fenced runs op, an ioctl on the process's uffd, under the same fence as the process's
	// installs: it fails with EAGAIN while a layout event is raised and not read, or read (by
	// the agent) and not applied to the page table.
	Fenced(op func() error) error
	// Fail stops the process with a message (a page could not be evicted safely).
	Fail(err error)
	// WakeIfWaiting tells the process's fault thread that a batch finished: faults waiting
	// for room, or for a page's drop to complete, can go on.
	WakeIfWaiting()
	// Hold keeps the process's uffd open (and its number ours) until Release; false if the
	// process is retired already. A batch runs between the two.
	Hold() bool
	Release()
	// Space is the part of the backend the process's pages are stored in, where the backend
	// keeps processes' pages apart (backend.Spaces); 0: the part Store uses.
	Space() backend.Space
}

// BatchPages is how many pages one eviction batch takes at most.
const BatchPages = 256

// Config is what an Evictor is made with. It does not change once New has returned.
type Config struct {
	// CapPages is the cap, in pages, on everything counted against it (see Used).
	CapPages int64
	// Resident is the resident pages of all processes, as their page tables count them
	// (pagetable.New's resident). Required.
	Resident *atomic.Int64
	// Backend stores the evicted pages. Required for Loop.
	Backend backend.Backend
	// Targets returns the processes eviction may take pages from, each time the evictor looks.
	// It is called on the evictor goroutine. Required for Loop.
	Targets func() []Target
	// Trace, if not nil, is given every completed batch (package telemetry samples them). It
	// runs on the evictor goroutine, after the batch's wake, and must not keep the record.
	Trace func(*BatchRecord)
}

// Evictor keeps the pages counted against the cap (Used) under it. See the package doc for
// who writes and who reads each field.
type Evictor struct {
	cfg   Config
	marks watermarks
	bell  doorbell // rung by Kick; Loop waits on it
	// stopping is set once Loop's stop channel is closed; Loop's doorbell is rung with it.
	stopping atomic.Bool
	// tid is the thread Loop runs on (locked to it): its reads of a program's pages may fault
	// on that program's uffd, and the fault thread must never hold those for room (Tid).
	tid atomic.Int32

	// Unmanaged is what the kernel counts as the processes' anonymous memory beyond Resident:
	// mappings the runtime's rescan has not found yet (glibc's internal mmap/brk), small ones,
	// batches in flight. It counts against the cap too, so the cap holds as the kernel
	// measures it: the evictor takes tracked pages to make up for it. Written by the runtime's
	// RSS poll, at each poll.
	Unmanaged atomic.Int64
	// Reserve is room kept free below the cap for memory the program takes without faulting
	// (BurstReserve): it lowers both watermarks and Limit. Written by the runtime's RSS poll,
	// at each poll.
	Reserve atomic.Int64
	// Cached is the pages held in farmem's prefetch cache (cache mode): they count against the
	// cap as the program's own do. Written by the prefetch cache (fetcher.PrefetchCache.Held)
	// as it fills and empties.
	Cached atomic.Int64
	// Stats counts what the evictor did. Written by the evictor goroutine; read by anyone.
	Stats Stats
	// starved is set when a round ends over the high watermark with nothing it could take
	// (every process without an agent yet, every victim pinned, or the excess memory the page
	// tables do not track), and cleared by the next batch that takes a page or a round that
	// ends below the high watermark. Written by the evictor goroutine; read by the fault path
	// (Starved).
	starved atomic.Bool

	b batch // the batch's scratch: the evictor goroutine's alone
}

// New returns an evictor for cfg. Its watermarks start with minHead pages of room below the
// cap (see watermarks). Nothing runs until Loop.
func New(cfg Config) *Evictor {
	e := &Evictor{cfg: cfg}
	e.marks.init(cfg.CapPages)
	e.b.init()
	return e
}

// MaxHead is the most room a round of eviction leaves below the cap, in pages: where the head
// stops growing (see watermarks).
func (e *Evictor) MaxHead() int64 { return e.marks.maxHead }

// Kick tells the evictor there is pressure: a fault thread, or the runtime's RSS poll, saw
// Used above HighWater. It never blocks; kicks that come while one is pending are one.
func (e *Evictor) Kick() { e.bell.ring() }

// Waited tells the evictor that a fault had to wait at the cap for room: the program pages
// steadily, and the next round grows the head. Called by the fault path, lock-free.
func (e *Evictor) Waited() { e.marks.waited() }

// Loop evicts until stop is closed. It sleeps until kicked (a fault thread or the runtime's
// RSS poll sees pressure); only when a pass leaves it over High with nothing it could take
// does it look again on its own, after retryAfter. A program below its cap costs it nothing.
// Run it on one goroutine only: it owns the batch scratch.
func (e *Evictor) Loop(stop <-chan struct{}) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	e.tid.Store(int32(unix.Gettid()))
	defer e.tid.Store(0)
	const retryAfter = 5 * time.Millisecond
	go func() {
		<-stop
		e.stopping.Store(true)
		e.bell.ring()
	}()
	retry := time.Duration(0)
	for {
		e.bell.wait(retry)
		if e.stopping.Load() {
			return
		}
		retry = 0
		e.marks.grow()
		for e.Used() > e.HighWater() {
			t := e.largest()
			if t == nil {
				e.starved.Store(true)
				break
			}
			want := int(min(e.Used()-e.LowWater(), BatchPages))
			before := e.Stats.Evicted()
			if err := e.evictBatch(t, want); err != nil {
				t.Fail(err)
			}
			for _, w := range e.cfg.Targets() {
				w.WakeIfWaiting()
			}
			e.marks.grow()
			if e.Stats.Evicted() == before {
				// Nothing could go (every victim pinned, unmapped meanwhile, or the excess is
				// Unmanaged with nothing tracked left): look again later rather than spin.
				e.starved.Store(true)
				break
			}
			e.starved.Store(false)
		}
		if e.Used() > e.HighWater() {
			retry = retryAfter
		} else {
			e.starved.Store(false)
		}
	}
}

// Starved reports whether the evictor's last look found nothing it could take while over its
// high watermark. A fault waiting for room then waits for nothing: the fault path lets it in
// over the cap rather than hold the program for ever (runtime's MustWait).
func (e *Evictor) Starved() bool { return e.starved.Load() }

// Used is the pages counted against the cap.
func (e *Evictor) Used() int64 {
	return e.cfg.Resident.Load() + e.Unmanaged.Load() + e.Cached.Load()
}

// HighWater is where eviction starts: half the head below the cap, less the reserve.
func (e *Evictor) HighWater() int64 { return e.marks.high(e.Reserve.Load()) }

// LowWater is where a round of eviction stops: the head below the cap, less the reserve.
func (e *Evictor) LowWater() int64 { return e.marks.low(e.Reserve.Load()) }

// Limit is what Used may reach before program faults wait for the evictor: the cap less the
// reserve.
func (e *Evictor) Limit() int64 { return e.marks.limit(e.Reserve.Load()) }

func (e *Evictor) largest() Target {
	var best Target
	bestN := 0
	for _, t := range e.cfg.Targets() {
		if !t.CanEvict() {
			continue
		}
		tb := t.Table()
		tb.Lock()
		n := tb.Resident()
		tb.Unlock()
		if n > bestN {
			best, bestN = t, n
		}
	}
	return best
}

// Tid is the thread the evictor reads programs' pages from (0: not running). A fault that
// thread raises must be served at once, whatever the cap: it is the evictor making room, and
// held for room it would wait on itself.
func (e *Evictor) Tid() int32 { return e.tid.Load() }

// ErrGone is what Target.Drop and Target.Move return when the process exited meanwhile.
var ErrGone = errors.New("process gone")
