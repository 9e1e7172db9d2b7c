package fetcher

import (
	"encoding/binary"
	"math/rand/v2"
	"sync/atomic"
	"time"
	_ "unsafe" // go:linkname

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/uffd"
)

// This file is the fault path's side of tracing: plain values and one small interface. The
// fault thread takes a few monotonic timestamps into a fixed struct it owns and, only once a
// fault is served and its thread woken, hands a copy of them to Tracing.Tracer if the fault was
// sampled or took longer than Tracing.Slow. Everything OpenTelemetry (spans, exporters) lives
// behind Tracer, in package telemetry.
//
// The head sampler draws (a per-process xorshift draw, no lock, no allocation) when an attempt
// to serve a fault begins, not after it: a sampled fault is given its trace id and the span id
// of its backend fetch then, so that its read can carry them to a memory server (over tcp),
// whose span of the read joins the fault's trace. The spans themselves are still made after the
// fact, by package telemetry, with exactly these ids. Drawing earlier changes nothing in the
// statistics: each served fault is still kept with probability Tracing.Sample, one draw per fault.
// A fault whose attempt fetched its page and then had to be retried (the install met an unread
// event: EAGAIN) keeps that attempt's draw and ids for the next (drawCarry): otherwise the read
// its first attempt sent would name a fetch span that is never made, and a second chance to be
// drawn would over-sample retried faults. A fault kept for being slow is only known to be slow
// afterwards: its read carried no context, and no server span joins its trace.

//go:linkname nanotime runtime.nanotime
func nanotime() int64

// Fault kinds, as the kernel reports them.
const (
	KindRead  = 0
	KindWrite = 1
	KindWP    = 2
)

// FaultRecord is one served fault. Stage ends are offsets from Read; a stage a fault did not go
// through is 0 (a zero-fill has no fetch; a WP fault has no lookup of a copy).
type FaultRecord struct {
	Pid    int
	Addr   uint64
	Kind   int
	Source Source
	Head   bool      // chosen by the head sampler (false: kept because it was slow)
	Waited bool      // put back at least once (an unread event, or waiting at the cap) before served
	Read   time.Time // when the fault message was read from the uffd
	// Begin is when the last (successful) attempt to serve it started: Begin is queue wait.
	// Lookup ends the page-table and prefetch-cache lookup, Fetch the backend read, Install
	// the install ioctl (which also wakes the thread unless Wake is set), Wake an explicit wake.
	Begin, Lookup, Fetch, Install, Wake, End time.Duration
	Pages                                    int // pages installed (a zero-fill window may install several)
	// Slot is the backend slot read (FromBackend), for Describe.
	Slot backend.Slot
	// PrefetchStart/End bound the prediction and, with the embedded store, the inline prefetch
	// of PrefetchPages pages that follows the wake (the program runs on meanwhile).
	PrefetchStart, PrefetchEnd    time.Duration
	PrefetchPages, PrefetchPlaced int
	// Ioctl is the install's ioctl (Ioctl*; IoctlNone: the fault was served by a wake alone).
	Ioctl Ioctl
	// TraceID and FetchSpan are the ids a head-sampled fault was given when it began (zero for
	// one kept for being slow): its span must be in trace TraceID and its backend fetch span
	// must be FetchSpan, which the memory server's span of the read names as its parent.
	TraceID   [16]byte
	FetchSpan [8]byte
	// From is the copy that answered the fetch, when the backend said (a head-sampled fault's
	// traced load); else zero, and the tracer asks LoadDescriber.
	From backend.LoadedFrom
}

// PrefetchRecord is one batch of the prefetch worker (memory servers).
type PrefetchRecord struct {
	Pid              int
	Trigger          uint64 // the faulting page whose prediction this is
	Start            time.Time
	Load, End        time.Duration // the batched backend read, and the installs, from Start
	Pages, Delivered int
	Err              error
}

// Tracing is a run's fault tracing: the tracer and which faults it gets. One is shared by the
// fetchers of every process of the run (Budget is the run's); it does not change once they run.
type Tracing struct {
	Tracer Tracer
	Sample uint64        // the head sampler's threshold (SampleThreshold of the share to trace)
	Slow   time.Duration // faults slower than this are traced too; 0: none for being slow
	Budget SlowBudget    // bounds the faults traced for being slow
}

// Tracer receives the records of sampled work. Its methods run on the fault thread (Fault) or
// the prefetch worker (Prefetch) and must not keep the pointer.
type Tracer interface {
	Fault(r *FaultRecord)
	Prefetch(r *PrefetchRecord)
}

// LoadDescriber is implemented by backends that can say where a slot is read from (the
// memory-server store): the server, its transport and which replica. The tracer asks after
// the fault, only for traced faults that do not know (FaultRecord.From is zero: those kept for
// being slow); it names the copy a read prefers at that moment.
type LoadDescriber interface {
	DescribeLoad(slot backend.Slot) (server, transport string, replica int, ok bool)
}

// faultClock is the fault thread's stopwatch for the fault being served (fault-thread only).
// Marks are nanotime readings; on is false when no tracer is set, and then nothing is read.
// Ioctl names the ioctl that installed a fault's page(s), for the install span.
type Ioctl uint8

const (
	IoctlNone Ioctl = iota
	IoctlCopy
	IoctlZeroPage
	IoctlWriteProtect
)

func (i Ioctl) String() string {
	return [...]string{"", "UFFDIO_COPY", "UFFDIO_ZEROPAGE", "UFFDIO_WRITEPROTECT"}[i]
}

type faultClock struct {
	on                                  bool
	begin, lookup, fetch, install, wake int64
	ioctl                               Ioctl // the install's, set with install
	pfStart, pfEnd                      int64
	pfPages, pfPlaced                   int
	slot                                backend.Slot
	pages                               int
	retried                             bool
	rng                                 uint64 // xorshift64 state of the head sampler
	// head: the head sampler picked this attempt's fault; traceID and fetchSpan are then its
	// ids, and from the copy its fetch was answered by.
	head      bool
	traceID   [16]byte
	fetchSpan [8]byte
	from      backend.LoadedFrom
	pg        uint64     // the page of the fault being served
	carry     *drawCarry // fetching attempts' draws, for their retries (allocated at the first)
	carried   int        // index+1 in carry of this attempt's draw; 0: none
}

// reset starts an attempt to serve a fault on page pg: the clock, and the head sampler's draw
// with threshold (SampleThreshold of the ratio), or the draw of an earlier attempt of the same
// fault that fetched the page.
func (c *faultClock) reset(threshold, pg uint64) {
	*c = faultClock{on: c.on, rng: c.rng, retried: c.retried, carry: c.carry, pg: pg, begin: nanotime()}
	if c.retried && c.carry != nil {
		if i := c.carry.find(pg); i >= 0 {
			d := &c.carry.d[i]
			c.head, c.traceID, c.fetchSpan, c.carried = d.head, d.traceID, d.fetchSpan, i+1
			return
		}
	}
	if c.head = c.sample(threshold); c.head {
		c.traceID, c.fetchSpan = newTraceIDs()
	}
}

// drawCarry keeps the sampling draws of attempts that fetched their page, by page, for the
// fault's later attempts if it is retried, until it is served (faultClock.served clears it). A
// ring: a fault retried after more than len(d) others fetched draws again (its first read's
// server span then has no parent in the trace), which takes more faults waiting at once than a
// fault thread has.
type drawCarry struct {
	d    [16]carriedDraw
	next int
}

type carriedDraw struct {
	pg        uint64 // 0: free
	head      bool
	traceID   [16]byte
	fetchSpan [8]byte
}

// keep records the attempt's draw for its retries (fault thread, at each fetch): in the entry
// its fault has already, or a new one.
func (c *faultClock) keep() {
	if c.carry == nil {
		c.carry = new(drawCarry)
	}
	k := c.carry
	if c.carried == 0 || k.d[c.carried-1].pg != c.pg {
		c.carried = k.next + 1
		k.next = (k.next + 1) % len(k.d)
	}
	k.d[c.carried-1] = carriedDraw{pg: c.pg, head: c.head, traceID: c.traceID, fetchSpan: c.fetchSpan}
}

// find returns the index of the draw kept for page pg, the newest if several; -1: none.
func (k *drawCarry) find(pg uint64) int {
	for n := 1; n <= len(k.d); n++ {
		if i := (k.next - n + len(k.d)) % len(k.d); k.d[i].pg == pg {
			return i
		}
	}
	return -1
}

// served clears the attempt's kept draw: its fault needs no other attempt.
func (c *faultClock) served() {
	if c.carried != 0 {
		if e := &c.carry.d[c.carried-1]; e.pg == c.pg {
			*e = carriedDraw{}
		}
		c.carried = 0
	}
}

// newTraceIDs returns a fresh trace id and span id, never zero (W3C: an all-zero id is none).
// math/rand/v2's top-level generator is the runtime's: a ChaCha8 state per thread, seeded from
// the kernel, read with no lock and no allocation, and random enough for ids that must not
// collide across processes and machines (a counter or the sampler's xorshift would).
func newTraceIDs() (traceID [16]byte, spanID [8]byte) {
	for traceID == [16]byte{} {
		binary.LittleEndian.PutUint64(traceID[:], rand.Uint64())
		binary.LittleEndian.PutUint64(traceID[8:], rand.Uint64())
	}
	for spanID == [8]byte{} {
		binary.LittleEndian.PutUint64(spanID[:], rand.Uint64())
	}
	return traceID, spanID
}

// fetchPage reads a backend fault's page. A head-sampled fault's read carries its trace context
// where the backend takes one (a memory server over tcp makes its span of the read a child of
// the fault's backend fetch span) and learns which copy answered; any other read is Load.
func (f *Fetcher) fetchPage(slot backend.Slot, buf []byte) error {
	b := f.store
	c := &f.clock
	if c.on {
		c.keep()
	}
	if c.head {
		if tl, ok := b.(backend.TracedLoader); ok {
			from, err := tl.LoadTraced(slot, buf, backend.TraceContext{TraceID: c.traceID, SpanID: c.fetchSpan, Flags: 1})
			c.from = from
			return err
		}
	}
	return b.Load(slot, buf)
}

func (c *faultClock) mark(t *int64) {
	if c.on {
		*t = nanotime()
	}
}

// installed marks the end of the install, done by ioctl.
func (c *faultClock) installed(ioctl Ioctl) {
	if c.on {
		c.install, c.ioctl = nanotime(), ioctl
	}
}

// sample draws the head sampling decision: true with probability threshold/2^64.
func (c *faultClock) sample(threshold uint64) bool {
	if threshold == 0 {
		return false
	}
	x := c.rng
	x ^= x << 13
	x ^= x >> 7
	x ^= x << 17
	c.rng = x
	return x <= threshold
}

// SampleThreshold turns a ratio into the head sampler's threshold.
func SampleThreshold(ratio float64) uint64 {
	switch {
	case ratio <= 0:
		return 0
	case ratio >= 1:
		return ^uint64(0)
	}
	return uint64(ratio * (1 << 63) * 2)
}

// traceFault hands a served fault to the tracer if it is sampled or slow. d is its service time
// (already measured for the histogram); readMono is Read on the nanotime clock.
func (f *Fetcher) traceFault(tr *Tracing, flags, pg uint64, src Source, since time.Time, d time.Duration) {
	c := &f.clock
	c.served()
	head := c.head
	if !head && (tr.Slow <= 0 || d < tr.Slow || !tr.Budget.take()) {
		return
	}
	// since on the nanotime clock: both clocks are monotonic; the offset is fixed per fault.
	readMono := nanotime() - int64(time.Since(since))
	off := func(t int64) time.Duration {
		if t == 0 {
			return 0
		}
		return time.Duration(max(t-readMono, 0))
	}
	kind := KindRead
	switch {
	case flags&uffd.PagefaultWP != 0:
		kind = KindWP
	case flags&uffd.PagefaultWrite != 0:
		kind = KindWrite
	}
	r := FaultRecord{Pid: f.host.Pid(), Addr: pg, Kind: kind, Source: src, Head: head, Waited: c.retried, Read: since,
		Begin: off(c.begin), Lookup: off(c.lookup), Fetch: off(c.fetch), Install: off(c.install), Ioctl: c.ioctl, Wake: off(c.wake), End: d,
		Pages: max(c.pages, 1), Slot: c.slot,
		PrefetchStart: off(c.pfStart), PrefetchEnd: off(c.pfEnd), PrefetchPages: c.pfPages, PrefetchPlaced: c.pfPlaced,
		From: c.from}
	if head {
		r.TraceID, r.FetchSpan = c.traceID, c.fetchSpan
	}
	tr.Tracer.Fault(&r)
}

// prefetched hands a worker's batch to the tracer if it is sampled (with the faults' ratio) or
// slow; rng is the worker's own sampler state (the fault thread's is not the worker's to touch).
func (tr *Tracing) prefetched(rng *uint64, r *PrefetchRecord) {
	c := faultClock{rng: *rng}
	head := c.sample(tr.Sample)
	*rng = c.rng
	if head || (tr.Slow > 0 && r.End >= tr.Slow && tr.Budget.take()) {
		tr.Tracer.Prefetch(r)
	}
}

// SlowBudget is a per-second allowance of records kept for being slow. When the machine is
// overloaded most faults are slow, and tracing each of them (six spans, an export) would add
// the most load exactly then, for traces that all tell the same story: past the allowance a
// slow fault is counted, not traced. Head-sampled faults are never refused, so the sampled
// share stays unbiased. Safe for concurrent use by every fault thread and the prefetch worker.
type SlowBudget struct {
	PerSecond int64        // 0: no bound
	second    atomic.Int64 // the nanotime second the count is for
	used      atomic.Int64 // records kept in that second
	skipped   atomic.Int64 // slow records not kept, over the run
}

// take reports whether one more slow record may be kept this second.
func (b *SlowBudget) take() bool {
	if b.PerSecond <= 0 {
		return true
	}
	now := nanotime() / int64(time.Second)
	if s := b.second.Load(); s != now && b.second.CompareAndSwap(s, now) {
		// Another thread may add to used between the swap and this store; a second's
		// allowance is approximate by a record or two, which is all it needs to be.
		b.used.Store(0)
	}
	if b.used.Add(1) <= b.PerSecond {
		return true
	}
	b.skipped.Add(1)
	return false
}

// Skipped is how many slow records were not traced because the allowance was spent.
func (b *SlowBudget) Skipped() int64 { return b.skipped.Load() }
