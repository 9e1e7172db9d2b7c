// Package backend defines where evicted pages live and provides the embedded store that
// `farmem run` uses when no memory servers are configured.
//
// A Backend stores whole 4 KiB pages under slots it chooses. Slots are owned by the runtime's
// page tables; sharing a slot between a parent and a forked child is counted by
// pagetable.Slots, never here, so a Backend only ever sees one Free per stored page.
package backend

import "errors"

// PageSize is the unit every backend stores.
const PageSize = 4096

// Slot names one stored page. Zero is never a valid slot: page tables use it for
// "no stored copy" (a page that is all zeros needs none).
type Slot uint64

// ErrUnknownSlot is returned by Load for a slot that was never stored or already freed:
// the caller must stop the program, never serve zeros in its place.
var ErrUnknownSlot = errors.New("backend: unknown slot")

// Backend is the interface the fabric's memory servers plug into.
type Backend interface {
	// Store writes len(src)/PageSize pages and fills slots[i] with page i's slot.
	Store(src []byte, slots []Slot) error
	// Load reads one page into dst (len PageSize).
	Load(slot Slot, dst []byte) error
	// Free releases slots; freed slots may be reused by later Stores.
	Free(slots ...Slot)
	// Stored reports pages currently stored.
	Stored() int
	// StoredBytes reports the bytes of memory the store holds for those pages (what a
	// compressing store saves shows here, not in Stored).
	StoredBytes() int64
	Close() error
}

// Space names one process's part of a store that keeps each process's pages apart (Spaces);
// 0 is the part every process shares, the one Store uses.
type Space uint32

// Spaces is a Backend that can keep each process's pages apart, where they can be mapped into
// that process and no other (Memory: a memfd a process; docs/DESIGN.md, "Where a fault is
// served"). The slots of every space are one namespace: Load and Free take any of them.
type Spaces interface {
	// NewSpace makes a part for one process's pages. On an error the process's pages are
	// stored with Store.
	NewSpace() (Space, error)
	// StoreIn is Store into space sp.
	StoreIn(sp Space, src []byte, slots []Slot) error
	// EndSpace says nothing more is stored in sp; it goes once its last slot is freed.
	EndSpace(sp Space)
	// Where says which space slot s is in, and at what offset in its file.
	Where(s Slot) (sp Space, off int64)
}

// BatchLoader is a Backend that reads several pages in one go: a memory server answers them in
// one round trip instead of one each. The prefetch worker uses it when the backend has it.
type BatchLoader interface {
	// LoadBatch reads slot slots[i]'s page into dst[i*PageSize:(i+1)*PageSize] for every i.
	// On an error any page may be unread: the caller falls back to Load, page by page, which
	// tries every copy and says what failed.
	LoadBatch(slots []Slot, dst []byte) error
}

// TraceContext is the W3C trace context of the span a load is part of: trace id, span id and
// trace flags (bit 0: sampled). A plain value: the fault path and the backends know nothing of
// OpenTelemetry (package telemetry makes the spans, after the fact, with these ids).
type TraceContext struct {
	TraceID [16]byte
	SpanID  [8]byte
	Flags   uint8
}

// LoadedFrom says which copy answered a load: the memory server's address, its transport (tcp,
// shm, rdma) and the replica's index in its slab.
type LoadedFrom struct {
	Server, Transport string
	Replica           int
}

// TracedLoader is a Backend whose loads can carry the trace context of the fault they serve: a
// memory server reached over tcp makes its own span of the read, a child of tc's span, so that
// one trace shows the fault and the server's side of it. The fault path uses it for the faults
// the head sampler picked, before they are served; it must cost a load nothing more.
type TracedLoader interface {
	// LoadTraced is Load, carrying tc where the transport can, and saying which copy answered.
	LoadTraced(slot Slot, dst []byte, tc TraceContext) (LoadedFrom, error)
}
