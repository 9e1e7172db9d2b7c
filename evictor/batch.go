package evictor

import (
	"errors"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

// batch is the working state of one eviction batch. The Evictor keeps one and every batch
// reuses it: a batch allocates nothing of its own (the Target's agent calls aside).
//
// Victim i keeps index i throughout: victims[i], ents[i], status[i], and staging page i. The
// pages copied out are numbered apart, in the order copyOut reads them: first the staged ones
// that need writing (stagedDirty), then the dirty victims left in the program (dirty); page j
// of those is buf's page j, with sums[j] and slots[j].
type batch struct {
	t     Target
	tb    *pagetable.PageTable
	fd    int    // the Target's uffd
	base  uint64 // the Target's staging area; 0: every victim goes the drop way
	start time.Time
	rec   BatchRecord

	victims    []uint64           // sorted by address
	ents       []*pagetable.Entry // the victims' entries, by pointer (see pagetable's doc)
	victimRuns []Run              // the victims' contiguous runs
	layout     uint64             // the layout events the table had applied at the choice

	// The move (move.go).
	status      []byte   // the agent's move status of each victim
	staged      []int    // victims in the staging area, in victim order
	stagedDirty []int    // indices into staged of those to copy out: dirty, or no slot yet
	moved       int      // staging pages the move filled, discarded victims' included: what to drop
	rest        []uint64 // the victims left in the program: all of them without a staging area

	// The drop way (drop.go).
	dirty     []uint64 // rest's victims to copy out, write-protected (Evicting)
	clean     []uint64 // rest's victims whose slot is current: dropped without a copy
	dirtyRuns []Run

	// Copy out, checksum, store (copyout.go, store.go).
	remote  []unix.RemoteIovec
	local   [1]unix.Iovec
	buf     []byte // the pages copied out; store packs the non-zero ones at its front
	nStaged int    // the first nStaged pages of buf are staged ones
	n       int    // pages copied out
	sums    []uint32
	slots   []backend.Slot // each copied page's slot (0: all zeros)
	nz      []int          // the copied pages that are not all zeros
	stored  []backend.Slot // the slots the backend gave nz's pages

	// Commit and drop (commit.go, drop.go).
	drop     []uint64 // the pages committed Evicted that are still in the program
	dropRuns []Run
	removes  int // REMOVE events the drop raises: one a run dropped from the program
}

func (b *batch) init() {
	b.buf = make([]byte, BatchPages*uffd.PageSize)
	b.victims = make([]uint64, 0, BatchPages)
	b.ents = make([]*pagetable.Entry, 0, BatchPages)
	b.victimRuns = make([]Run, 0, BatchPages)
	b.status = make([]byte, BatchPages)
	b.staged = make([]int, 0, BatchPages)
	b.stagedDirty = make([]int, 0, BatchPages)
	b.rest = make([]uint64, 0, BatchPages)
	b.dirty = make([]uint64, 0, BatchPages)
	b.clean = make([]uint64, 0, BatchPages)
	b.dirtyRuns = make([]Run, 0, BatchPages)
	b.remote = make([]unix.RemoteIovec, 0, BatchPages)
	b.sums = make([]uint32, BatchPages)
	b.slots = make([]backend.Slot, BatchPages)
	b.nz = make([]int, 0, BatchPages)
	b.stored = make([]backend.Slot, BatchPages)
	b.drop = make([]uint64, 0, BatchPages)
	b.dropRuns = make([]Run, 0, BatchPages+1) // and the staging area's
}

// begin starts a batch on t, forgetting the last one.
func (b *batch) begin(t Target) {
	b.start = time.Now()
	b.rec = BatchRecord{}
	b.t, b.tb, b.fd, b.base = t, t.Table(), t.UFFD(), t.Staging()
	b.staged, b.stagedDirty, b.moved = b.staged[:0], b.stagedDirty[:0], 0
	b.dirty, b.clean, b.dirtyRuns = b.dirty[:0], b.clean[:0], b.dirtyRuns[:0]
	b.nStaged, b.n, b.removes = 0, 0, 0
	b.drop, b.dropRuns = b.drop[:0], b.dropRuns[:0]
}

// evictBatch evicts up to want of t's pages. Its error is one the program cannot survive:
// the caller stops it (Target.Fail). A process that exits meanwhile ends the batch quietly.
func (e *Evictor) evictBatch(t Target, want int) error {
	if !t.Hold() {
		return nil
	}
	defer t.Release()
	err := e.runBatch(t, want)
	if errors.Is(err, ErrGone) {
		return nil
	}
	return err
}

// runBatch is evictBatch's steps, in order. Each step that can fail returns ErrGone if the
// process exited under it; the batch then stops where it is.
func (e *Evictor) runBatch(t Target, want int) error {
	b := &e.b
	b.begin(t)
	if !b.choose(want) {
		return nil
	}
	if err := e.moveOut(b); err != nil {
		return err
	}
	b.mark(&b.rec.Move)
	if err := e.protect(b); err != nil {
		return err
	}
	b.mark(&b.rec.Protect)
	if err := e.copyOut(b); err != nil {
		return err
	}
	b.mark(&b.rec.Copy)
	b.checksum()
	if err := e.store(b); err != nil {
		return err
	}
	b.mark(&b.rec.Store)
	if err := e.commitAndDrop(b); err != nil {
		return err
	}
	b.mark(&b.rec.Drop)
	b.settle()
	if err := b.wake(); err != nil {
		return err
	}
	e.account(b)
	return nil
}

// choose takes up to want victims from the page table's queue and, if the batch moves them
// out, marks them Staged at their index in the staging area. False: nothing to take.
func (b *batch) choose(want int) bool {
	b.tb.Lock()
	b.tb.Drain(nil) // the pages the agent installed are resident, and may be victims
	b.victims = b.tb.Victims(want, b.victims)
	b.layout = b.tb.Layout()
	b.ents = b.ents[:0]
	for i, p := range b.victims {
		en := b.tb.Get(p)
		b.ents = append(b.ents, en)
		if b.base != 0 {
			b.tb.Stage(p, en, i)
		}
	}
	b.tb.Unlock()
	if len(b.victims) == 0 {
		return false
	}
	b.victimRuns = runs(b.victims, b.victimRuns)
	return true
}

// runs groups sorted pages into contiguous runs, in out's storage.
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
