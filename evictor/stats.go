package evictor

import (
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/latency"
)

// BatchRecord is one eviction batch, handed to Config.Trace once the batch is done. Stage ends
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

// Stats counts what the evictor did. Every field is written by the evictor goroutine only.
type Stats struct {
	Batches, Written, Dropped, Zero atomic.Int64
	Runs                            atomic.Int64 // contiguous runs of victims
	Staged                          atomic.Int64 // victims evicted by moving them out
	Removes                         atomic.Int64 // REMOVE events our drops raised: one a run dropped from the program
	// Aborted counts batches whose drop way was given up, its victims left in the program: the
	// program unmapped or moved some of them before the copy out, or its layout was changing
	// at the commit (Unsettled).
	Aborted atomic.Int64
	// Unsettled counts the batches whose commit found a layout event raised and not yet
	// applied to the page table (see commit's current).
	Unsettled atomic.Int64
	// Absent counts victims the move found absent from the program (ENOENT) though the page
	// table holds them resident: left alone rather than read (see moveOut).
	Absent atomic.Int64
	// Stale counts victims left in the program because the program's layout changed between
	// the choice and their move (ESTALE: see moveOut).
	Stale atomic.Int64
	Batch latency.Histogram // one batch, victim choice to wake
	// StageTime is the time all batches spent in each stage (Stage*), in nanoseconds: where a
	// batch's time goes, for the run summary, whether or not batches are traced.
	StageTime [NumStages]atomic.Int64
	// The backend's peak, sampled after each batch: what the run's evicted pages took.
	PeakStored, PeakStoredBytes atomic.Int64
}

// Evicted is every page evicted so far: written, dropped clean, or stored as nothing.
func (s *Stats) Evicted() int64 { return s.Written.Load() + s.Dropped.Load() + s.Zero.Load() }

// mark records in d how long the batch has run.
func (b *batch) mark(d *time.Duration) { *d = time.Since(b.start) }

// account counts a finished batch in Stats and hands its record to Config.Trace. (Written,
// Dropped and Zero are counted page by page as commit decides them.)
func (e *Evictor) account(b *batch) {
	e.Stats.Batches.Add(1)
	if n := int64(e.cfg.Backend.Stored()); n > e.Stats.PeakStored.Load() {
		e.Stats.PeakStored.Store(n)
		e.Stats.PeakStoredBytes.Store(e.cfg.Backend.StoredBytes())
	}
	e.Stats.Runs.Add(int64(len(b.victimRuns)))
	e.Stats.Staged.Add(int64(len(b.staged)))
	e.Stats.Removes.Add(int64(b.removes))
	d := time.Since(b.start)
	e.Stats.Batch.Record(d)
	prev := time.Duration(0)
	for i, end := range [NumStages]time.Duration{b.rec.Move, b.rec.Protect, b.rec.Copy, b.rec.Store, b.rec.Drop, d} {
		e.Stats.StageTime[i].Add(int64(end - prev))
		prev = end
	}
	if e.cfg.Trace != nil {
		r := b.rec // only this copy escapes: a batch allocates nothing for tracing when off
		r.Pid, r.Start, r.End, r.Victims, r.Runs, r.Staged = b.t.Pid(), b.start, d, len(b.victims), len(b.victimRuns), len(b.staged)
		e.cfg.Trace(&r)
	}
}
