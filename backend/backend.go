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

// Backend is the interface the fabric's memory servers plug into (issue 3).
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

// BatchLoader is a Backend that reads several pages in one go: a memory server answers them in
// one round trip instead of one each. The prefetch worker uses it when the backend has it.
type BatchLoader interface {
	// LoadBatch reads slot slots[i]'s page into dst[i*PageSize:(i+1)*PageSize] for every i.
	// On an error any page may be unread: the caller falls back to Load, page by page, which
	// tries every copy and says what failed.
	LoadBatch(slots []Slot, dst []byte) error
}
