package pagetable

import (
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/farmem/farmem/backend"
)

// Victims runs under the table's lock, which the fault thread waits for: its cost is a wait of
// the program's. A steady state of a random walk: 256 MiB registered, a quarter of it resident,
// each batch of 256 victims followed by 256 random re-faults.
func BenchmarkVictims(b *testing.B) {
	var res atomic.Int64
	tb := New(&res, NewSlots(backend.NewMemory()))
	const pages, resident, batch = 65536, 16384, 256
	rng := rand.New(rand.NewPCG(1, 2))
	addr := func(i int) uint64 { return 0x100000 + uint64(i)*backend.PageSize }
	for _, i := range rng.Perm(pages)[:resident] {
		tb.Install(addr(i), Written, 0)
	}
	var out []uint64
	b.ResetTimer()
	for range b.N {
		out = tb.Victims(batch, out)
		b.StopTimer()
		for _, p := range out {
			tb.MarkEvicted(p, tb.Get(p), 0)
		}
		for k := 0; k < len(out); {
			p := addr(rng.IntN(pages))
			if e := tb.Get(p); e == nil || e.State == Evicted {
				tb.Refaulted(tb.Install(p, Written, 0))
				k++
			}
		}
		b.StartTimer()
	}
}
