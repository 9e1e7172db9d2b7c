// Package evictor keeps the resident pages of all of a run's processes under the cap.
//
// One evictor goroutine serves every process. A batch takes its victims out of the program
// one of two ways. The first is tried for every victim, the second takes what it leaves:
//
//	move:  page table Staged -> the agent UFFDIO_MOVEs them into the process's staging area ->
//	       process_vm_readv the staging pages -> store -> commit (Evicted) -> the agent
//	       madvise(DONTNEED)s the staging area
//	drop:  write-protect the dirty victims -> process_vm_readv them -> store -> commit
//	       (Evicted, InFlight, Zapping) -> the agent madvise(DONTNEED)s them -> wake
//
// The drop order is the only one that proved race-free under concurrent writers when the
// runtime cannot take pages itself (DESIGN.md section 3). It pays a write-protect (a TLB
// flush) and a REMOVE event, which the agent must wait for the fault thread to read, per
// contiguous run: a round trip between two processes, ~22 us here (results/eviction.md). A
// random victim set is nearly a run per page. The move stays inside the program's process
// (4-7 us a page here, probes/movecost.c: it still flushes each page from the TLB), needs no
// protection (a moved page is out of the program's reach: a fault on it waits for the
// commit), and the batch raises no REMOVE at all: the staging area is registered on a uffd of
// the agent's own. The kernel refuses to move a page still shared with a fork child (EBUSY:
// redis's cold pages after a BGSAVE, until written), and a fork child that inherited its
// parent's staging area moves nothing; those go the drop way.
//
// Clean victims (installed write-protected from a slot and never written) are not copied:
// their slot is still current. The fault thread, not the evictor, consumes the REMOVE events
// our DONTNEEDs raise; the evictor never reads the uffd.
package evictor

import (
	"errors"
	"fmt"
	"hash/crc32"
	"runtime"
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
	// Staging returns the process's staging area, BatchPages pages made on first use, or 0 if
	// its pages cannot be moved (a fork child; a kernel without UFFDIO_MOVE). Its drop raises
	// no REMOVE event: it is registered on a uffd of the agent's own, with no features.
	Staging() uint64
	// Move asks the process's agent to UFFDIO_MOVE runs, page after page, into the staging
	// area from dst on, and waits for it. status[k] is 0 if the k-th page moved, else the
	// errno that kept it in the program.
	Move(runs []Run, dst uint64, status []byte) error
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
// are offsets from Start: the agent's move, write-protect of the dirty victims left in the
// program, their copy out, the backend store, the agent's drop, the wake of writers held by
// the protection.
type BatchRecord struct {
	Pid                                           int
	Start                                         time.Time
	Move, Protect, Copy, Store, Drop, End         time.Duration
	Victims, Written, Dropped, Zero, Runs, Staged int
}

// A batch's stages, in order (BatchRecord's fields, Stats.StageTime's indices).
const (
	StageMove    = iota // the agent moves victims into the staging area
	StageProtect        // write-protect the dirty victims left in the program
	StageCopy           // process_vm_readv
	StageStore          // the backend store
	StageDrop           // commit and the agent's drop
	StageWake           // wake the writers held by the protection
	NumStages
)

// StageNames names the stages for people.
var StageNames = [NumStages]string{"move", "write-protect", "copy out", "store", "drop", "wake"}

// BatchPages is how many pages one eviction batch takes at most.
const BatchPages = 256

// Stats counts what the evictor did.
type Stats struct {
	Batches, Written, Dropped, Zero atomic.Int64
	Runs                            atomic.Int64 // contiguous runs of victims
	Staged                          atomic.Int64 // victims evicted by moving them out
	Removes                         atomic.Int64 // REMOVE events our drops raised: one a run dropped from the program
	Aborted                         atomic.Int64 // batches given up: the program unmapped or moved victims
	// Absent counts victims the move found absent from the program (ENOENT) though the page
	// table holds them resident: left alone rather than read (see evict).
	Absent atomic.Int64
	Batch  latency.Histogram // one batch, victim choice to wake
	// StageTime is the time all batches spent in each stage (Stage*), in nanoseconds: where a
	// batch's time goes, for the run summary, whether or not batches are traced.
	StageTime [NumStages]atomic.Int64
	// The backend's peak, sampled after each batch: what the run's evicted pages took.
	PeakStored, PeakStoredBytes atomic.Int64
}

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
	kick  chan struct{} // capacity 1: a pending kick stands for any number
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

	b batch // the batch's scratch: the evictor goroutine's alone
}

// New returns an evictor for cfg. Its watermarks start with minHead pages of room below the
// cap (see watermarks). Nothing runs until Loop.
func New(cfg Config) *Evictor {
	e := &Evictor{cfg: cfg, kick: make(chan struct{}, 1)}
	e.marks.init(cfg.CapPages)
	e.b.init()
	return e
}

// MaxHead is the most room a round of eviction leaves below the cap, in pages: where the head
// stops growing (see watermarks).
func (e *Evictor) MaxHead() int64 { return e.marks.maxHead }

// Kick tells the evictor there is pressure: a fault thread, or the runtime's RSS poll, saw
// Used above HighWater. It never blocks; kicks that come while one is pending are one.
func (e *Evictor) Kick() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

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
	retry := time.NewTimer(retryAfter)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-stop:
			return
		case <-e.kick:
		case <-retry.C:
		}
		e.marks.grow()
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
			for _, w := range e.cfg.Targets() {
				w.WakeIfWaiting()
			}
			e.marks.grow()
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

// Tid is the thread the evictor reads programs' pages from (0: not running). A fault that
// thread raises must be served at once, whatever the cap: it is the evictor making room, and
// held for room it would wait on itself.
func (e *Evictor) Tid() int32 { return e.tid.Load() }

// ErrGone is what Target.Drop returns when the process exited meanwhile.
var ErrGone = errors.New("process gone")

// castagnoli is CRC-32C's table: the checksum the CPU computes in hardware.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func (e *Evictor) evictBatch(t Target, want int) error {
	if !t.Hold() {
		return nil
	}
	defer t.Release()
	start := time.Now()
	var rec BatchRecord
	// Six clock reads a batch (a batch takes milliseconds): the stages are always timed.
	mark := func(d *time.Duration) { *d = time.Since(start) }
	tb := t.Table()
	fd := t.UFFD()
	base := t.Staging()
	tb.Lock()
	e.b.victims = tb.Victims(want, e.b.victims)
	e.b.ents = e.b.ents[:0]
	for i, p := range e.b.victims {
		en := tb.Get(p)
		e.b.ents = append(e.b.ents, en)
		if base != 0 {
			tb.Stage(en, i)
		}
	}
	tb.Unlock()
	if len(e.b.victims) == 0 {
		return nil
	}
	victimRuns := runs(e.b.victims, nil)
	// Move out: the agent takes every victim it can out of the program into the staging area
	// (victim i to staging page i). From there nothing can change it, so no write-protect is
	// needed, and the batch's drop is one range, the staging area's, not one per run.
	var staged []int      // victims in the staging area, in victim order
	var stagedDirty []int // indices into staged of those to copy out: dirty, or no slot yet
	moved := 0            // staging pages the move filled, discarded victims' included: what to drop
	rest := e.b.victims
	if base != 0 {
		status := e.b.status[:len(e.b.victims)]
		if err := t.Move(victimRuns, base, status); err != nil {
			if errors.Is(err, ErrGone) {
				return nil
			}
			return fmt.Errorf("evict: agent move: %w", err)
		}
		rest = e.b.rest[:0]
		tb.Lock()
		for i, en := range e.b.ents {
			if status[i] == 0 {
				moved = i + 1
			}
			switch {
			case en.State != pagetable.Staged:
				// Discarded by the program meanwhile (State 0): whatever moved is junk now.
			case status[i] == 0:
				if en.Dirty || en.Slot == 0 { // else clean: its slot is current
					stagedDirty = append(stagedDirty, len(staged))
				}
				staged = append(staged, i)
			case status[i] == byte(unix.ENOENT):
				// Absent from the program while still Staged: moved by an mremap whose REMAP
				// event is not read yet (the kernel sends it after moving the pages), or a record
				// gone wrong. It must not be read below: the read would fault. Left Resident and
				// off the queue: the REMAP event re-keys it to where the page is; if the record is
				// wrong, the next fault on it finds it absent and stops the program (missing).
				tb.Unstage(en)
				e.Stats.Absent.Add(1)
			default:
				tb.Unstage(en) // still in the program: evicted below the other way, or requeued
				rest = append(rest, e.b.victims[i])
			}
		}
		tb.Unlock()
		e.b.rest = rest
	}
	mark(&rec.Move)
	// The victims left in the program (every one, without a staging area).
	var dirty, clean []uint64
	tb.Lock()
	for _, p := range rest {
		en := tb.Get(p)
		if en == nil || en.State != pagetable.Resident {
			continue // discarded, or moved by mremap, meanwhile
		}
		if en.Dirty || en.Slot == 0 {
			en.State = pagetable.Evicting
			dirty = append(dirty, p)
		} else {
			clean = append(clean, p)
		}
	}
	tb.Unlock()
	dirtyRuns := runs(dirty, nil)
	for _, r := range dirtyRuns {
		// (The kernel refuses DONTWAKE together with WP: EINVAL.)
		err := retryEAGAIN(func() error { return uffd.WriteProtect(fd, r.Addr, r.Len, uffd.WPModeWP) })
		if errors.Is(err, unix.ESRCH) {
			return nil // the process exited under us
		}
		if errors.Is(err, unix.ENOENT) {
			e.abort(tb, fd, dirty, clean, dirtyRuns) // unmapped or moved meanwhile
			dirty, clean, dirtyRuns = nil, nil, nil
			break
		}
		if err != nil {
			return fmt.Errorf("evict: write-protect %#x+%d: %w", r.Addr, r.Len, err)
		}
	}
	mark(&rec.Protect)
	// Copy out, in one process_vm_readv: the staged pages that need writing, then the dirty
	// victims still in the program. Both are present and cannot change (a staging page is
	// nobody's; a victim is write-protected), so reading them cannot fault and no write can
	// slip in between the copy and the drop.
	remote := e.b.remote[:0]
	for _, k := range stagedDirty {
		a := base + uint64(staged[k])*uffd.PageSize
		if j := len(remote) - 1; j >= 0 && uint64(remote[j].Base)+uint64(remote[j].Len) == a {
			remote[j].Len += uffd.PageSize
		} else {
			remote = append(remote, unix.RemoteIovec{Base: uintptr(a), Len: uffd.PageSize})
		}
	}
	nStaged := len(stagedDirty)
	for _, r := range dirtyRuns {
		remote = append(remote, unix.RemoteIovec{Base: uintptr(r.Addr), Len: int(r.Len)})
	}
	e.b.remote = remote
	n := nStaged + len(dirty)
	if n > 0 {
		local := []unix.Iovec{{Base: &e.b.buf[0]}}
		local[0].SetLen(n * uffd.PageSize)
		got, err := unix.ProcessVMReadv(t.Pid(), local, remote, 0)
		if errors.Is(err, unix.ESRCH) {
			return nil
		}
		if got < nStaged*uffd.PageSize {
			return fmt.Errorf("evict: process_vm_readv of %d staged pages read %d bytes: %v", nStaged, got, err)
		}
		if errors.Is(err, unix.EFAULT) || (err == nil && got < n*uffd.PageSize) {
			e.abort(tb, fd, dirty, clean, dirtyRuns) // part of it was unmapped meanwhile
			dirty, clean, dirtyRuns = nil, nil, nil
			n = nStaged
		} else if err != nil || got != n*uffd.PageSize {
			return fmt.Errorf("evict: process_vm_readv of %d pages read %d bytes: %v", n, got, err)
		}
	}
	mark(&rec.Copy)
	// Checksum what was copied: the page table learns from it whether a page installed
	// writable on a guess was written (pagetable's Copied).
	sums := e.b.sums[:n]
	for i := range sums {
		sums[i] = crc32.Checksum(e.b.buf[i*uffd.PageSize:(i+1)*uffd.PageSize], castagnoli)
	}
	// Store the non-zero pages; an all-zero page needs no copy (slot 0).
	slots := e.b.slots[:n]
	var nz []int
	for i := 0; i < n; i++ {
		slots[i] = 0
		if !isZero(e.b.buf[i*uffd.PageSize : (i+1)*uffd.PageSize]) {
			nz = append(nz, i)
		}
	}
	if len(nz) > 0 {
		packed := e.b.buf
		if len(nz) != n {
			packed = make([]byte, len(nz)*uffd.PageSize)
			for j, i := range nz {
				copy(packed[j*uffd.PageSize:], e.b.buf[i*uffd.PageSize:(i+1)*uffd.PageSize])
			}
		}
		ns := make([]backend.Slot, len(nz))
		if err := e.cfg.Backend.Store(packed[:len(nz)*uffd.PageSize], ns); err != nil {
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
	written := func(slot backend.Slot) {
		if slot == 0 {
			e.Stats.Zero.Add(1)
			rec.Zero++
		} else {
			e.Stats.Written.Add(1)
			rec.Written++
		}
	}
	next := 0 // the next of stagedDirty, and its slot's index
	for k, i := range staged {
		en := e.b.ents[i]
		slot := en.Slot // clean
		if next < nStaged && stagedDirty[next] == k {
			slot = slots[next]
			sum := sums[next]
			next++
			if en.State != pagetable.Staged {
				if slot != 0 {
					e.cfg.Backend.Free(slot)
				}
				continue
			}
			tb.Copied(en, sum)
			written(slot)
		} else if en.State != pagetable.Staged {
			continue
		} else {
			e.Stats.Dropped.Add(1)
			rec.Dropped++
		}
		tb.CommitStaged(en, slot)
	}
	for i, p := range dirty {
		slot := slots[nStaged+i]
		en := tb.Get(p)
		if en == nil || en.State != pagetable.Evicting {
			if slot != 0 {
				e.cfg.Backend.Free(slot)
			}
			continue
		}
		tb.Copied(en, sums[nStaged+i])
		tb.MarkEvicted(en, slot)
		drop = append(drop, p)
		written(slot)
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
	removes := len(dropRuns) // one REMOVE event a run dropped from the program
	if moved > 0 {
		// The whole used part of the staging area, in one run whatever the victims' spread
		// (and with no REMOVE event: see Target.Staging). It holds nothing of the program's any
		// more: committed pages, and those the program discarded after they moved. Left
		// there, a page would refuse the next batch's move to its index (EEXIST).
		dropRuns = append(dropRuns, Run{base, uint64(moved) * uffd.PageSize})
	}
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
	// MISSING and is served from the stored copy. (Faults on staged pages wait in the fault
	// thread, which retries them when Loop wakes it.)
	for _, r := range dirtyRuns {
		if err := uffd.Wake(fd, r.Addr, r.Len); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("evict: wake: %w", err)
		}
	}
	e.Stats.Batches.Add(1)
	if n := int64(e.cfg.Backend.Stored()); n > e.Stats.PeakStored.Load() {
		e.Stats.PeakStored.Store(n)
		e.Stats.PeakStoredBytes.Store(e.cfg.Backend.StoredBytes())
	}
	e.Stats.Runs.Add(int64(len(victimRuns)))
	e.Stats.Staged.Add(int64(len(staged)))
	e.Stats.Removes.Add(int64(removes))
	d := time.Since(start)
	e.Stats.Batch.Record(d)
	prev := time.Duration(0)
	for i, end := range [NumStages]time.Duration{rec.Move, rec.Protect, rec.Copy, rec.Store, rec.Drop, d} {
		e.Stats.StageTime[i].Add(int64(end - prev))
		prev = end
	}
	if e.cfg.Trace != nil {
		r := rec // only this copy escapes: a batch allocates nothing for tracing when off
		r.Pid, r.Start, r.End, r.Victims, r.Runs, r.Staged = t.Pid(), start, d, len(e.b.victims), len(victimRuns), len(staged)
		e.cfg.Trace(&r)
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
