package pagetable

import (
	"sync/atomic"
	"testing"

	"github.com/farmem/farmem/backend"
)

// CloneFor runs in the fault thread at every fork of a paging process, while the child waits for
// its table: its cost is a fork's under farmem. A 64 MiB process at a 32 MiB cap: half its pages
// resident, half evicted to slots.
func BenchmarkCloneFor(b *testing.B) {
	m := backend.NewMemory()
	var res atomic.Int64
	tb := New(&res, NewSlots(m))
	page := make([]byte, backend.PageSize)
	const pages = 16384
	for i := uint64(0); i < pages; i++ {
		pg := 0x100000 + i*backend.PageSize
		e := tb.Install(pg, Written, 0)
		if i%2 == 1 {
			s := make([]backend.Slot, 1)
			if err := m.Store(page, s); err != nil {
				b.Fatal(err)
			}
			tb.MarkEvicted(pg, e, s[0])
		}
	}
	b.ResetTimer()
	for range b.N {
		c := tb.CloneFor()
		b.StopTimer()
		c.Clear()
		b.StartTimer()
	}
}
