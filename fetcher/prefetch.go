package fetcher

import (
	"slices"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/prefetch"
	"github.com/farmem/farmem/uffd"
)

// Prefetching, in two modes.
//
// Map mode (no Config.Cache) installs predicted pages straight into the program (UFFDIO_COPY
// without a wake, write-protected unless the page was written in its last stay): a right guess
// then costs the program no fault at all, where in Leap's cache mode (pcache.go) it still costs
// a userfaultfd round trip, much of the gain (results/prefetch.md, "The default: leap in map
// mode, a window of up to 32 pages"). The program's accesses to installed pages are invisible, so the pages it used are inferred
// from where its next miss lands (prefetch.ConsumedBetween) and fed to the prefetcher as hits: its
// history holds the stream's real deltas, not the gaps between misses, and its window grows with
// them as Leap's does with cache hits. Cache mode sees its hits: they fault.

// MaxPrefetchBatch bounds the pages one demand fault may prefetch: a batch is one value on the
// worker's channel (no allocation per fault) and one buffer of this many pages.
const MaxPrefetchBatch = 32

// prefetchBatch is one demand fault's predictions that were worth fetching: evicted pages with
// a stored copy, marked Fetching in the page table.
type prefetchBatch struct {
	n       int
	pages   [MaxPrefetchBatch]uint64 // addresses
	trigger uint64                   // with a tracer: the fault that predicted them
}

// prefetchState is a process's prefetcher and what map mode remembers to infer hits. It is
// touched only by the fault thread, under the page table's lock.
type prefetchState struct {
	pred     prefetch.Prefetcher
	out      []uint64 // scratch for predictions
	used     []uint64 // scratch for the pages inferred used
	lastMiss uint64   // page number of the previous demand miss served from the backend
	window   []uint64 // page numbers queued at lastMiss, in prediction order
	// inline is set when the backend loads by memcpy (the embedded stores): the fault thread
	// then prefetches itself (see predict).
	inline *prefetchScratch
}

// prefetchScratch is what one prefetching thread (the fault thread inline, or the worker)
// reuses for every batch: nothing is allocated per fault.
type prefetchScratch struct {
	w   prefetchWork
	buf []byte // MaxPrefetchBatch pages
	rng uint64 // the worker's head sampler for its batches' spans
}

func newPrefetchScratch() *prefetchScratch {
	return &prefetchScratch{buf: make([]byte, MaxPrefetchBatch*ps), rng: uint64(nanotime()) | 1}
}

// predict runs after a re-fault on pg was served, from the backend or (cache mode, hit) from
// the prefetch cache: it feeds the predictor and queues the predicted pages that are evicted
// with a stored copy. Map mode cannot see hits, so it feeds those it infers the program used
// since the last miss. The table is locked by the caller.
func (f *Fetcher) predict(pg uint64, hit bool) {
	s := &f.pf
	f.clock.mark(&f.clock.pfStart)
	defer f.clock.mark(&f.clock.pfEnd)
	page := pg / ps
	cache := f.cache
	if cache == nil && len(s.window) > 0 {
		s.used = prefetch.ConsumedBetween(s.lastMiss, s.window, page, s.used[:0])
		for _, u := range s.used {
			s.out = s.pred.Access(u, true, s.out[:0])
		}
		f.stats.PrefetchUsed.Add(int64(len(s.used)))
	}
	s.out = s.pred.Access(page, hit, s.out[:0])
	s.lastMiss, s.window = page, s.window[:0]
	var b prefetchBatch
	for _, q := range s.out {
		if b.n == MaxPrefetchBatch || q >= 1<<52 { // 1<<52 pages: past any user address
			break
		}
		a := q * ps
		e := f.table.Get(a)
		if e == nil || e.State != pagetable.Evicted || e.Slot == 0 || e.Fetching || e.InFlight || e.Zapping {
			continue
		}
		if cache != nil && cache.cached(f, a) {
			continue
		}
		b.pages[b.n] = a
		b.n++
		s.window = append(s.window, q)
	}
	if b.n == 0 {
		return
	}
	if x := s.inline; x != nil {
		// A store that loads by memcpy: fetch at once, on this thread, after the demand
		// page's wake (the table stays locked throughout, so nothing needs marking). A worker
		// would lose the race to the program's next touch.
		f.stats.PrefetchIssued.Add(int64(b.n))
		f.choose(&b, &x.w)
		n := f.load(&x.w, x.buf)
		f.clock.pfPages, f.clock.pfPlaced = x.w.n, n
		f.deliver(&x.w, x.buf, n)
		return
	}
	if f.clock.on {
		b.trigger = pg
	}
	for _, a := range b.pages[:b.n] {
		f.table.Fetch(a, f.table.Get(a))
	}
	select {
	case f.prefetchQ <- b:
		f.stats.PrefetchIssued.Add(int64(b.n))
	default: // the worker is behind: drop this prediction rather than wait
		f.finish(&b)
		s.window = s.window[:0]
	}
}

// prefetchLoop is the process's prefetch worker: it fetches queued batches and installs them,
// so a demand fault never waits for its predictions. It ends when the queue is closed (retire,
// after the fault thread stopped).
func (f *Fetcher) prefetchLoop() {
	x := newPrefetchScratch()
	for b := range f.prefetchQ {
		if !f.host.Hold() {
			continue // retired: drain until the queue is closed
		}
		var start time.Time
		var loaded time.Duration
		tracing := f.tracing != nil // not f.clock: that is the fault thread's
		if tracing {
			start = time.Now()
		}
		f.table.Lock()
		f.choose(&b, &x.w)
		f.table.Unlock()
		n := f.load(&x.w, x.buf)
		if tracing {
			loaded = time.Since(start)
		}
		f.table.Lock()
		f.deliver(&x.w, x.buf, n)
		f.finish(&b)
		f.table.Unlock()
		if tracing && x.w.n > 0 {
			f.tracing.prefetched(&x.rng, &PrefetchRecord{Pid: f.host.Pid(), Trigger: b.trigger, Start: start, Load: loaded,
				End: time.Since(start), Pages: x.w.n, Delivered: n})
		}
		// Faults on these pages waited for this batch (see missing): they find their page
		// resident now, or fetch it themselves.
		f.Wake()
		f.host.Release()
	}
}

// prefetchWork is one batch being prefetched: what each page was when it was chosen.
type prefetchWork struct {
	n     int
	addr  [MaxPrefetchBatch]uint64
	entry [MaxPrefetchBatch]*pagetable.Entry
	seq   [MaxPrefetchBatch]uint32
	slot  [MaxPrefetchBatch]backend.Slot
	dirt  [MaxPrefetchBatch]pagetable.Dirt // how to install it, as a read fault would (Refetch)
}

// choose takes the pages of b that are still evicted with a stored copy, in address order
// (contiguous pages become one COPY), no more than fit below the evictor's high watermark.
// Prefetching never pushes the run over it: a guess must not cost the eviction of a page in
// use, and the kernel's count (Used: tracked pages and the memory the page tables do not
// see yet) is what must stay under the cap, not only the tracked pages. The table is locked.
func (f *Fetcher) choose(b *prefetchBatch, w *prefetchWork) {
	slices.Sort(b.pages[:b.n])
	w.n = 0
	for _, a := range b.pages[:b.n] {
		e := f.table.Get(a)
		if e == nil || e.State != pagetable.Evicted || e.Slot == 0 || e.InFlight || e.Zapping {
			continue
		}
		w.addr[w.n], w.entry[w.n], w.seq[w.n], w.slot[w.n], w.dirt[w.n] = a, e, e.Seq, e.Slot, f.table.Refetch(e, false)
		w.n++
	}
	if room := f.host.PrefetchRoom(); int64(w.n) > room {
		w.n = int(max(room, 0))
	}
}

// finish clears Fetching on the pages of b that were not installed (an install resets
// it). The table is locked.
func (f *Fetcher) finish(b *prefetchBatch) {
	for _, a := range b.pages[:b.n] {
		if e := f.table.Get(a); e != nil {
			f.table.Fetched(a, e)
		}
	}
}

// load reads the chosen pages into buf, in one request when the backend can batch, and
// returns how many it read (buf[i*ps:] holds page i of w, which it compacts past failures).
// A page that cannot be read is skipped: the demand path reports it if the program needs it.
func (f *Fetcher) load(w *prefetchWork, buf []byte) int {
	store := f.store
	if bl, ok := store.(backend.BatchLoader); ok && w.n > 1 && bl.LoadBatch(w.slot[:w.n], buf[:w.n*ps]) == nil {
		return w.n
	}
	n := 0
	for i := 0; i < w.n; i++ {
		if store.Load(w.slot[i], buf[n*ps:(n+1)*ps]) != nil {
			continue
		}
		w.addr[n], w.entry[n], w.seq[n], w.slot[n], w.dirt[n] = w.addr[i], w.entry[i], w.seq[i], w.slot[i], w.dirt[i]
		n++
	}
	return n
}

// deliver puts the first n loaded pages of w where the mode wants them: into the program (map
// mode) or the prefetch cache. The table is locked.
func (f *Fetcher) deliver(w *prefetchWork, buf []byte, n int) {
	c := f.cache
	if c == nil {
		f.install(w, buf, n)
		return
	}
	for j := 0; j < n; j++ {
		if f.unchanged(w, j) {
			c.put(f, w, j, buf[j*ps:(j+1)*ps])
			f.stats.PrefetchInstalled.Add(1)
		}
	}
}

// install maps the first n loaded pages of w that are still the evicted pages they were (same
// entry, same install sequence, same slot), without waking anyone: nobody waits for them, and
// a fault on one of them meanwhile finds it resident and only wakes. The table is locked.
func (f *Fetcher) install(w *prefetchWork, buf []byte, n int) {
	for i := 0; i < n; {
		// The longest run of contiguous pages from i, each unchanged, all of one mode.
		j := i
		for j < n && f.unchanged(w, j) && (j == i || w.addr[j] == w.addr[j-1]+ps && w.dirt[j] == w.dirt[i]) {
			j++
		}
		if j == i {
			i++
			continue
		}
		mode := uffd.CopyDontWake | uffd.CopyWP
		if w.dirt[i] != pagetable.Clean {
			mode = uffd.CopyDontWake
		}
		c, err := f.copy(w.addr[i], unsafe.Pointer(&buf[i*ps]), uint64(j-i)*ps, mode)
		k := i + int(max(c, 0)/ps)
		f.stats.PrefetchInstalled.Add(int64(k - i))
		for ; i < k; i++ {
			f.table.Install(w.addr[i], w.dirt[i], w.slot[i])
		}
		if err == unix.EAGAIN {
			return // an event is unread: the layout may be changing; the rest can fault
		}
		if k < j {
			i++ // the page at k is present (EEXIST) or gone (ENOENT): skip it
		}
	}
}

// unchanged reports whether page j of w is still the evicted page that was loaded. Entry
// identity catches a discard (a new entry) and an mremap (the entry moved); Seq catches an
// install in between (the slot may be reused by then).
func (f *Fetcher) unchanged(w *prefetchWork, j int) bool {
	e := f.table.Get(w.addr[j])
	return e != nil && e == w.entry[j] && e.Seq == w.seq[j] && e.State == pagetable.Evicted &&
		e.Slot == w.slot[j] && !e.InFlight && !e.Zapping
}
