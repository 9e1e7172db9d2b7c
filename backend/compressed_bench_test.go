package backend

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// BenchmarkStoreLoad stores b.N pages of the mixed set in evictor-sized batches, then loads them
// all back in random order, as faults would. One op is one page stored and loaded; the store
// and load halves and the compression ratio (page bytes over StoredBytes) are reported apart.
// The store is warmed first (the same pages stored and freed), so chunk growth is not timed.
func BenchmarkStoreLoad(b *testing.B) {
	const batchPages = 256 // evictor.BatchPages
	pages := mixedPages(batchPages)
	batch := slices.Concat(pages...)
	for _, name := range codecNames {
		b.Run(name, func(b *testing.B) {
			s := newStore(b, name)
			slots := make([]Slot, b.N)
			store := func() {
				for i := 0; i < b.N; i += batchPages {
					n := min(batchPages, b.N-i)
					if err := s.Store(batch[:n*PageSize], slots[i:i+n]); err != nil {
						b.Fatal(err)
					}
				}
			}
			store()
			s.Free(slots...)
			order := rand.New(rand.NewPCG(9, 10)).Perm(b.N)
			dst := make([]byte, PageSize)
			b.SetBytes(PageSize)
			b.ResetTimer()

			start := time.Now()
			store()
			stored := time.Since(start)
			start = time.Now()
			for _, i := range order {
				if err := s.Load(slots[i], dst); err != nil {
					b.Fatal(err)
				}
			}
			loaded := time.Since(start)

			b.StopTimer()
			ratio := float64(int64(b.N)*PageSize) / float64(s.StoredBytes())
			for i := range min(b.N, batchPages) {
				if s.Load(slots[i], dst); !bytes.Equal(dst, pages[i]) {
					b.Fatalf("page %d came back different", i)
				}
			}
			b.ReportMetric(float64(stored.Nanoseconds())/float64(b.N), "store-ns/page")
			b.ReportMetric(float64(loaded.Nanoseconds())/float64(b.N), "load-ns/page")
			b.ReportMetric(ratio, "ratio")
		})
	}
}
