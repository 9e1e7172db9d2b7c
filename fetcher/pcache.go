package fetcher

import (
	"sync"
	"sync/atomic"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
)

// PrefetchCache is cache mode's prefetch cache, Leap's: predicted pages wait here, in farmem,
// until the program faults on them; a fault that finds its page installs it from here and frees
// the buffer at once (eager eviction), and when the cache is full the oldest prediction goes
// first (FIFO). One cache serves every process of the run, and what it holds counts against
// the cap (Evictor.Cached), as Leap's prefetched pages count against the cgroup's.
//
// The buffers are allocated once; the full ones are linked oldest first, the empty ones kept on
// a free list, so eviction and a hit's eager free are O(1). A cached page is not tracked in the
// page table: nothing is marked, nothing need be undone. A lookup takes the buffer only if the
// page is still the evicted page that was read (same entry, install sequence and slot, as
// install checks in map mode), so a page the program discarded, moved or got back meanwhile is
// never served from a stale copy; it just ages out.
//
// Lock order: a page table's lock, then mu (the fault thread looks up under its table's lock).
type PrefetchCache struct {
	mu    sync.Mutex
	pages []byte             // len(meta) pages
	meta  []cachedPage       // protected by mu
	index map[cacheKey]int32 // protected by mu; the buffer holding each cached page
	// protected by mu: the full buffers, oldest first (head), linked through meta; the empty ones.
	head, tail int32
	free       []int32

	// Held is the pages cached now; the evictor counts it against the cap.
	Held *atomic.Int64
	// Evicted counts predictions pushed out by newer ones before any fault used them.
	Evicted atomic.Int64
}

type cacheKey struct {
	p    *Process
	addr uint64
}

// cachedPage is what a full buffer holds: which page, and what the page was when it was read.
type cachedPage struct {
	key        cacheKey
	entry      *pagetable.Entry
	seq        uint32
	slot       backend.Slot
	prev, next int32 // the FIFO's links; -1 at its ends
}

// NewPrefetchCache returns a cache of n pages whose occupancy is kept in held.
func NewPrefetchCache(n int, held *atomic.Int64) *PrefetchCache {
	c := &PrefetchCache{pages: make([]byte, n*ps), meta: make([]cachedPage, n), index: make(map[cacheKey]int32, n),
		head: -1, tail: -1, free: make([]int32, n), Held: held}
	for i := range c.free {
		c.free[i] = int32(n - 1 - i)
	}
	return c
}

// Pages is the cache's size in pages.
func (c *PrefetchCache) Pages() int { return len(c.meta) }

// put caches page j of w, read into src, evicting the oldest prediction if the cache is full.
// The page's table is locked by the caller.
func (c *PrefetchCache) put(p *Process, w *prefetchWork, j int, src []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k := cacheKey{p, w.addr[j]}
	if i, ok := c.index[k]; ok {
		c.drop(i) // a newer read of the same page replaces it
	}
	if len(c.free) == 0 {
		c.drop(c.head)
		c.Evicted.Add(1)
	}
	i := c.free[len(c.free)-1]
	c.free = c.free[:len(c.free)-1]
	c.meta[i] = cachedPage{key: k, entry: w.entry[j], seq: w.seq[j], slot: w.slot[j], prev: c.tail, next: -1}
	if c.tail >= 0 {
		c.meta[c.tail].next = i
	} else {
		c.head = i
	}
	c.tail = i
	c.index[k] = i
	c.Held.Add(1)
	copy(c.pages[int(i)*ps:int(i+1)*ps], src)
}

// drop empties buffer i. mu is held.
func (c *PrefetchCache) drop(i int32) {
	m := &c.meta[i]
	if m.prev >= 0 {
		c.meta[m.prev].next = m.next
	} else {
		c.head = m.next
	}
	if m.next >= 0 {
		c.meta[m.next].prev = m.prev
	} else {
		c.tail = m.prev
	}
	delete(c.index, m.key)
	*m = cachedPage{}
	c.free = append(c.free, i)
	c.Held.Add(-1)
}

// cached reports whether page addr of p is in the cache (stale or not): prediction skips it.
func (c *PrefetchCache) cached(p *Process, addr uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.index[cacheKey{p, addr}]
	return ok
}

// take copies page addr of p into dst and frees its buffer at once (eager eviction), if the
// cache holds it and it is still e as it was read. A stale copy is dropped. The page's table
// is locked by the caller.
func (c *PrefetchCache) take(p *Process, addr uint64, e *pagetable.Entry, dst []byte) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	i, found := c.index[cacheKey{p, addr}]
	if !found {
		return false
	}
	m := &c.meta[i]
	ok := m.entry == e && m.seq == e.Seq && m.slot == e.Slot && e.State == pagetable.Evicted
	if ok {
		copy(dst, c.pages[int(i)*ps:int(i+1)*ps])
	}
	c.drop(i)
	return ok
}

// forget drops every page of p (it is retired: its pages are gone).
func (c *PrefetchCache) forget(p *Process) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, i := range c.index {
		if k.p == p {
			c.drop(i)
		}
	}
}
