package fetcher

import (
	"sync/atomic"

	"github.com/farmem/farmem/latency"
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

// Held is why a fault could not be served when it was first read.
type Held int

const (
	HeldRoom  Held = iota // the run was at its cap: the fault waited for the evictor to make room
	HeldBusy              // its page was in an eviction batch or being read by the prefetch worker
	HeldEvent             // an install met an unread layout event (EAGAIN) and was tried again
	NumHeld
)

func (h Held) String() string { return [...]string{"room", "busy", "event"}[h] }

// Stats counts the fault path's work, for the run summary and the metrics. One Stats is shared
// by the fetchers of every process of a run.
type Stats struct {
	ZeroFills, ZeroPages, BackendFaults atomic.Int64
	// Latency is each source's fault-service time: from reading the fault message to the
	// install (or wake) ioctl's return, including any wait at the cap or behind an event.
	Latency [NumSources]latency.Histogram
	// Held is the service time, read to install, of the faults that could not be served when
	// first read (they are in Latency too), by why: a fault kept for several reasons counts
	// under room if it ever waited for room, else busy, else event.
	Held    [NumHeld]latency.Histogram
	Removes atomic.Int64 // REMOVE events (the program's and our own DONTNEEDs)
	// FromStaging is the pages served from a staging area: victims of a batch in flight that
	// the program touched again once moved, and pages fork children read from their copy of
	// the parent's staging area (the parent had moved them out, and not yet stored them, when
	// it forked).
	FromStaging atomic.Int64
	// Vanished: adopted pages found absent, which the kernel dropped at the program's request
	// (pagetable.Adopt), served as zeros.
	Vanished atomic.Int64
	// InProgram: faults the processes' agents served themselves, from the store (inprogram.go),
	// as their posts were read; farmem measures no time for them.
	InProgram atomic.Int64
	// Prefetching: pages queued for the workers, installed by them, and used by the program
	// (map mode: inferred from where the next miss landed; cache mode: faults that hit).
	PrefetchIssued, PrefetchInstalled, PrefetchUsed atomic.Int64
}
