package fetcher

import (
	"sync"
	"sync/atomic"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/prefetch"
)

// PrefetchCache is cache mode's prefetch cache, Leap's: predicted pages wait here, in farmem,
// until the program faults on them; a fault that finds its page installs it from here and frees
// the buffer at once (eager eviction), and when the cache is full the oldest prediction goes
// first (FIFO). One cache serves every process of the run, and what it holds counts against
// the cap (Evictor.Cached), as Leap's prefetched pages count against the cgroup's.
//
// Which buffer holds which page is prefetch.FIFO's to decide, the policy the replayer scores
// (farmem sim --cache-pages). A cached page is not tracked in the page table: nothing is
// marked, nothing need be undone. A lookup takes the buffer only if the page is still the
// evicted page that was read (same entry, install sequence and slot, as install checks in map
// mode), so a page the program discarded, moved or got back meanwhile is never served from a
// stale copy; it just ages out.
//
// Lock order: a page table's lock, then mu (the fault thread looks up under its table's lock).
type PrefetchCache struct {
	mu    sync.Mutex
	fifo  *prefetch.FIFO[cacheKey] // protected by mu
	meta  []cachedPage             // protected by mu; what each of fifo's buffers holds
	pages []byte                   // protected by mu; the buffers, len(meta) pages

	// Held is the pages cached now; the evictor counts it against the cap.
	Held *atomic.Int64
	// Evicted counts predictions pushed out by newer ones before any fault used them.
	Evicted atomic.Int64
}

type cacheKey struct {
	f    *Fetcher
	addr uint64
}

// cachedPage is what a full buffer holds: what its page was when it was read.
type cachedPage struct {
	entry *pagetable.Entry
	seq   uint32
	slot  backend.Slot
}

// NewPrefetchCache returns a cache of n pages whose occupancy is kept in held.
func NewPrefetchCache(n int, held *atomic.Int64) *PrefetchCache {
	return &PrefetchCache{fifo: prefetch.NewFIFO[cacheKey](n), meta: make([]cachedPage, n), pages: make([]byte, n*ps), Held: held}
}

// Pages is the cache's size in pages.
func (c *PrefetchCache) Pages() int { return len(c.meta) }

// put caches page j of w, read into src, pushing out the oldest prediction if the cache is
// full. The page's table is locked by the caller.
func (c *PrefetchCache) put(f *Fetcher, w *prefetchWork, j int, src []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := cacheKey{f, w.addr[j]}
	if i, ok := c.fifo.Lookup(k); ok {
		c.drop(i) // a newer read of the same page replaces it
	}
	i, pushed := c.fifo.Insert(k)
	if pushed {
		c.Evicted.Add(1)
		c.Held.Add(-1)
	}
	c.meta[i] = cachedPage{entry: w.entry[j], seq: w.seq[j], slot: w.slot[j]}
	c.Held.Add(1)
	copy(c.pages[i*ps:(i+1)*ps], src)
}

// drop empties buffer i. mu is held.
func (c *PrefetchCache) drop(i int) {
	c.fifo.Remove(i)
	c.meta[i] = cachedPage{}
	c.Held.Add(-1)
}

// cached reports whether page addr of p is in the cache (stale or not): prediction skips it.
func (c *PrefetchCache) cached(f *Fetcher, addr uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.fifo.Lookup(cacheKey{f, addr})
	return ok
}

// take copies page addr of p into dst and frees its buffer at once (eager eviction), if the
// cache holds it and it is still e as it was read. A stale copy is dropped. The page's table
// is locked by the caller.
func (c *PrefetchCache) take(f *Fetcher, addr uint64, e *pagetable.Entry, dst []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, found := c.fifo.Lookup(cacheKey{f, addr})
	if !found {
		return false
	}
	m := &c.meta[i]
	ok := m.entry == e && m.seq == e.Seq && m.slot == e.Slot && e.State == pagetable.Evicted
	if ok {
		copy(dst, c.pages[i*ps:(i+1)*ps])
	}
	c.drop(i)
	return ok
}

// forget drops every page of p (it is retired: its pages are gone).
func (c *PrefetchCache) forget(f *Fetcher) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.fifo.Len()
	c.fifo.RemoveIf(func(k cacheKey) bool { return k.f == f })
	c.Held.Add(int64(c.fifo.Len() - n))
}
