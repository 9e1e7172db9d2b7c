// Package evictor keeps the resident pages of all of a run's processes under the cap.
//
// One evictor goroutine serves every process. A batch is evicted in the only order that
// proved race-free under concurrent writers (DESIGN.md section 3):
//
//	write-protect the dirty victims -> process_vm_readv them -> store them in the backend ->
//	commit (page table: Evicted, InFlight, Zapping) -> agent madvise(DONTNEED) -> wake
//
// Clean victims (installed write-protected from a slot and never written) skip the first
// three steps: their slot is still current. The fault thread, not the evictor, consumes the
// REMOVE events our DONTNEEDs raise; the evictor never reads the uffd.
package evictor

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/latency"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
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
	// Drop asks the process's agent to madvise(DONTNEED) runs and waits for it.
	Drop(runs []Run) error
	// Fail stops the process with a message (a page could not be evicted safely).
	Fail(err error)
	// WakeIfWaiting tells the process's fault thread that a batch finished: faults waiting
	// for room, or for a page's drop to complete, can go on.
	WakeIfWaiting()
	// Hold keeps the process's uffd open (and its number ours) until Release; false if the
	// process is retired already. A batch runs between the two.
	Hold() bool
	Release()
}

// BatchRecord is one eviction batch, handed to Evictor.Trace once the batch is done. Stage ends
// are offsets from Start: write-protect of the dirty victims, their copy out, the backend store,
// the agent's drop, the wake of writers held by the protection.
type BatchRecord struct {
	Pid                                   int
	Start                                 time.Time
	Protect, Copy, Store, Drop, End       time.Duration
	Victims, Written, Dropped, Zero, Runs int
}

// A batch's stages, in order (BatchRecord's fields, Stats.StageTime's indices).
const (
	StageProtect = iota // write-protect the dirty victims
	StageCopy           // process_vm_readv them
	StageStore          // the backend store
	StageDrop           // commit and the agent's drop
	StageWake           // wake the writers held by the protection
	NumStages
)

// StageNames names the stages for people.
var StageNames = [NumStages]string{"write-protect", "copy out", "store", "drop", "wake"}

// BatchPages is how many pages one eviction batch takes at most.
const BatchPages = 256

// Stats counts what the evictor did.
type Stats struct {
	Batches, Written, Dropped, Zero atomic.Int64
	Runs                            atomic.Int64      // contiguous runs dropped: one REMOVE event each
	Aborted                         atomic.Int64      // batches given up: the program unmapped or moved victims
	Batch                           latency.Histogram // one batch, victim choice to wake
	// StageTime is the time all batches spent in each stage (Stage*), in nanoseconds: where a
	// batch's time goes, for the run summary, whether or not batches are traced.
	StageTime [NumStages]atomic.Int64
	// The backend's peak, sampled after each batch: what the run's evicted pages took.
	PeakStored, PeakStoredBytes atomic.Int64
}

// Evictor evicts pages when Resident exceeds the high watermark.
type Evictor struct {
	CapPages  int64         // the cap, in pages
	High, Low int64         // start evicting above High, stop at Low
	Resident  *atomic.Int64 // resident pages of all processes, as the page tables count them
	// Unmanaged is what the kernel counts as the processes' anonymous memory beyond Resident:
	// mappings the rescan has not found yet (glibc's internal mmap/brk), small ones, batches in
	// flight. Sampled every 2 ms by the runtime. It counts against the cap too, so the cap
	// holds as the kernel measures it: the evictor takes tracked pages to make up for it.
	Unmanaged atomic.Int64
	// Reserve is room kept free below the cap for memory the program takes without faulting
	// (BurstReserve): it lowers both watermarks and Limit. Set by the runtime's poll.
	Reserve atomic.Int64
	// Trace, if set, is given every completed batch (package telemetry samples them). It runs on
	// the evictor goroutine, after the batch's wake. Set it before Loop starts.
	Trace func(*BatchRecord)
	// Cached is the pages held in farmem's prefetch cache (cache mode): they count against the
	// cap as the program's own do.
	Cached  atomic.Int64
	Targets func() []Target
	Backend backend.Backend
	Stats   Stats
	Kick    chan struct{} // a fault thread signals pressure; capacity 1

	buf     []byte
	victims []uint64
	slots   []backend.Slot
}

// New sizes the watermarks for a cap: headroom of 1/16 of the cap (64..4096 pages) so that a
// burst of faults is absorbed while a batch is in flight.
func New(capPages int64, resident *atomic.Int64, b backend.Backend, targets func() []Target) *Evictor {
	head := capPages / 16
	head = max(64, min(head, 4096))
	return &Evictor{
		CapPages: capPages, High: capPages - head/2, Low: capPages - head, Resident: resident,
		Targets: targets, Backend: b, Kick: make(chan struct{}, 1),
		buf: make([]byte, BatchPages*uffd.PageSize), slots: make([]backend.Slot, BatchPages),
	}
}

// Loop evicts until stop is closed. It sleeps until kicked (a fault thread or the runtime's
// RSS poll sees pressure); only when a pass leaves it over High with nothing it could take
// does it look again on its own, after retryAfter. A program below its cap costs it nothing.
func (e *Evictor) Loop(stop <-chan struct{}) {
	const retryAfter = 5 * time.Millisecond
	retry := time.NewTimer(retryAfter)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-stop:
			return
		case <-e.Kick:
		case <-retry.C:
		}
		for e.Used() > e.HighWater() {
			t := e.largest()
			if t == nil {
				break
			}
			want := int(min(e.Used()-e.LowWater(), BatchPages))
			before := e.Stats.Evicted()
			if err := e.evictBatch(t, want); err != nil {
				t.Fail(err)
			}
			for _, w := range e.Targets() {
				w.WakeIfWaiting()
			}
			if e.Stats.Evicted() == before {
				// Nothing could go (every victim pinned, unmapped meanwhile, or the excess is
				// Unmanaged with nothing tracked left): look again later rather than spin.
				break
			}
		}
		if e.Used() > e.HighWater() {
			retry.Reset(retryAfter)
		}
	}
}

// Evicted is every page evicted so far: written, dropped clean, or stored as nothing.
func (s *Stats) Evicted() int64 { return s.Written.Load() + s.Dropped.Load() + s.Zero.Load() }

// Used is the pages counted against the cap.
func (e *Evictor) Used() int64 { return e.Resident.Load() + e.Unmanaged.Load() + e.Cached.Load() }

// HighWater is where eviction starts: High less the reserve.
func (e *Evictor) HighWater() int64 { return e.High - e.Reserve.Load() }

// LowWater is where a round of eviction stops: Low less the reserve.
func (e *Evictor) LowWater() int64 { return e.Low - e.Reserve.Load() }

// Limit is what Used may reach before program faults wait for the evictor: the cap less the
// reserve.
func (e *Evictor) Limit() int64 { return e.CapPages - e.Reserve.Load() }

func (e *Evictor) largest() Target {
	var best Target
	bestN := 0
	for _, t := range e.Targets() {
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

// runs groups sorted pages into contiguous runs.
func runs(pages []uint64, out []Run) []Run {
	out = out[:0]
	for _, p := range pages {
		if k := len(out); k > 0 && out[k-1].Addr+out[k-1].Len == p {
			out[k-1].Len += uffd.PageSize
			continue
		}
		out = append(out, Run{p, uffd.PageSize})
	}
	return out
}

func retryEAGAIN(f func() error) error {
	for i := 0; ; i++ {
		err := f()
		if !errors.Is(err, unix.EAGAIN) {
			return err
		}
		// An unread uffd event (the program's madvise/munmap/fork) blocks the ioctl; the fault
		// thread reads it shortly.
		time.Sleep(time.Duration(min(i+1, 100)) * 10 * time.Microsecond)
	}
}

// ErrGone is what Target.Drop returns when the process exited meanwhile.
var ErrGone = errors.New("process gone")

func (e *Evictor) evictBatch(t Target, want int) error {
	if !t.Hold() {
		return nil
	}
	defer t.Release()
	start := time.Now()
	tb := t.Table()
	fd := t.UFFD()
	tb.Lock()
	e.victims = tb.Victims(want, e.victims)
	var dirty, clean []uint64
	for _, p := range e.victims {
		en := tb.Get(p)
		if en.Dirty || en.Slot == 0 {
			en.State = pagetable.Evicting
			dirty = append(dirty, p)
		} else {
			clean = append(clean, p)
		}
	}
	tb.Unlock()
	if len(e.victims) == 0 {
		return nil
	}
	var rec BatchRecord
	tracing := e.Trace != nil
	// Five clock reads a batch (a batch takes milliseconds): the stages are always timed.
	mark := func(d *time.Duration) { *d = time.Since(start) }
	dirtyRuns := runs(dirty, nil)
	for _, r := range dirtyRuns {
		// (The kernel refuses DONTWAKE together with WP: EINVAL.)
		err := retryEAGAIN(func() error { return uffd.WriteProtect(fd, r.Addr, r.Len, uffd.WPModeWP) })
		if errors.Is(err, unix.ESRCH) {
			return nil // the process exited under us
		}
		if errors.Is(err, unix.ENOENT) {
			e.abort(tb, fd, dirty, clean, dirtyRuns) // unmapped or moved meanwhile
			return nil
		}
		if err != nil {
			return fmt.Errorf("evict: write-protect %#x+%d: %w", r.Addr, r.Len, err)
		}
	}
	mark(&rec.Protect)
	// Copy out: the pages are present and write-protected, so reading them cannot fault and
	// no write can slip in between the copy and the drop.
	n := len(dirty)
	if n > 0 {
		local := []unix.Iovec{{Base: &e.buf[0]}}
		local[0].SetLen(n * uffd.PageSize)
		remote := make([]unix.RemoteIovec, len(dirtyRuns))
		for i, r := range dirtyRuns {
			remote[i] = unix.RemoteIovec{Base: uintptr(r.Addr), Len: int(r.Len)}
		}
		got, err := unix.ProcessVMReadv(t.Pid(), local, remote, 0)
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		if errors.Is(err, unix.EFAULT) || (err == nil && got < n*uffd.PageSize) {
			e.abort(tb, fd, dirty, clean, dirtyRuns) // part of it was unmapped meanwhile
			return nil
		}
		if err != nil || got != n*uffd.PageSize {
			return fmt.Errorf("evict: process_vm_readv of %d pages read %d bytes: %v", n, got, err)
		}
	}
	mark(&rec.Copy)
	// Store the non-zero pages; an all-zero page needs no copy (slot 0).
	slots := e.slots[:n]
	var nz []int
	for i := 0; i < n; i++ {
		slots[i] = 0
		if !isZero(e.buf[i*uffd.PageSize : (i+1)*uffd.PageSize]) {
			nz = append(nz, i)
		}
	}
	if len(nz) > 0 {
		packed := e.buf
		if len(nz) != n {
			packed = make([]byte, len(nz)*uffd.PageSize)
			for j, i := range nz {
				copy(packed[j*uffd.PageSize:], e.buf[i*uffd.PageSize:(i+1)*uffd.PageSize])
			}
		}
		ns := make([]backend.Slot, len(nz))
		if err := e.Backend.Store(packed[:len(nz)*uffd.PageSize], ns); err != nil {
			return fmt.Errorf("evict: backend store: %w", err)
		}
		for j, i := range nz {
			slots[i] = ns[j]
		}
	}
	mark(&rec.Store)
	// Commit: only pages still in the state we left them in; the program may have discarded
	// (REMOVE/UNMAP) or written (clean pages) some meanwhile.
	var drop []uint64
	tb.Lock()
	for i, p := range dirty {
		en := tb.Get(p)
		if en == nil || en.State != pagetable.Evicting {
			if slots[i] != 0 {
				e.Backend.Free(slots[i])
			}
			continue
		}
		tb.MarkEvicted(en, slots[i])
		drop = append(drop, p)
		if slots[i] == 0 {
			e.Stats.Zero.Add(1)
			rec.Zero++
		} else {
			e.Stats.Written.Add(1)
			rec.Written++
		}
	}
	for _, p := range clean {
		en := tb.Get(p)
		if en == nil || en.State != pagetable.Resident || en.Dirty {
			tb.Requeue(p)
			continue
		}
		tb.MarkEvicted(en, en.Slot)
		drop = append(drop, p)
		e.Stats.Dropped.Add(1)
		rec.Dropped++
	}
	tb.Unlock()
	slices.Sort(drop)
	dropRuns := runs(drop, nil)
	if len(dropRuns) > 0 {
		if err := t.Drop(dropRuns); err != nil {
			if errors.Is(err, ErrGone) {
				return nil
			}
			// ENOMEM: a run was unmapped or moved by the program meanwhile; the UNMAP or
			// REMAP event already updated the page table, and the other runs were dropped.
			if !errors.Is(err, unix.ENOMEM) {
				return fmt.Errorf("evict: agent drop: %w", err)
			}
		}
	}
	mark(&rec.Drop)
	tb.Lock()
	for _, p := range drop {
		if en := tb.Get(p); en != nil && en.State == pagetable.Evicted {
			en.Zapping = false
		}
	}
	tb.Unlock()
	// Writers that hit the write protection wait for this wake; their retry now faults as
	// MISSING and is served from the stored copy.
	for _, r := range dirtyRuns {
		if err := uffd.Wake(fd, r.Addr, r.Len); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("evict: wake: %w", err)
		}
	}
	e.Stats.Batches.Add(1)
	if n := int64(e.Backend.Stored()); n > e.Stats.PeakStored.Load() {
		e.Stats.PeakStored.Store(n)
		e.Stats.PeakStoredBytes.Store(e.Backend.StoredBytes())
	}
	e.Stats.Runs.Add(int64(len(dropRuns)))
	d := time.Since(start)
	e.Stats.Batch.Record(d)
	prev := time.Duration(0)
	for i, end := range [NumStages]time.Duration{rec.Protect, rec.Copy, rec.Store, rec.Drop, d} {
		e.Stats.StageTime[i].Add(int64(end - prev))
		prev = end
	}
	if tracing {
		r := rec // only this copy escapes: a batch allocates nothing for tracing when off
		r.Pid, r.Start, r.End, r.Victims, r.Runs = t.Pid(), start, d, len(e.victims), len(dropRuns)
		e.Trace(&r)
	}
	return nil
}

// abort gives up a batch whose pages the program unmapped or moved (munmap, mremap) between
// the choice and the copy: the victims still mapped go back to Resident (dirty ones stay dirty,
// some are write-protected now, which a later write un-protects as for any clean page), and
// writers waiting on the protection are woken to retry.
func (e *Evictor) abort(tb *pagetable.PageTable, fd int, dirty, clean []uint64, dirtyRuns []Run) {
	tb.Lock()
	for _, p := range dirty {
		if en := tb.Get(p); en != nil && en.State == pagetable.Evicting {
			en.State = pagetable.Resident
			tb.Requeue(p)
		}
	}
	for _, p := range clean {
		tb.Requeue(p)
	}
	tb.Unlock()
	for _, r := range dirtyRuns {
		uffd.Wake(fd, r.Addr, r.Len) // ENOENT/ESRCH: nobody left to wake there
	}
	e.Stats.Aborted.Add(1)
}

func isZero(b []byte) bool {
	w := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8)
	for _, x := range w {
		if x != 0 {
			return false
		}
	}
	return true
}
