package fetcher

import (
	"slices"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

// Predictor is what the fault path needs of a prefetcher (package prefetch): fed one demand
// access at a time, it names the pages to bring ahead of demand.
//
// Map mode (no Runtime.PrefetchCache) installs predicted pages straight into the program
// (UFFDIO_COPY without a wake, write-protected unless the page was written in its last stay):
// every fault costs a uffd round trip here, so a right guess that still faults, as in Leap's
// cache mode (pcache.go), gives much of the gain away. The program's accesses to installed
// pages are invisible, so the pages it used are inferred from where its next miss lands
// (consumedBetween) and fed to the predictor as hits: its history holds the stream's real
// deltas, not the gaps between misses, and its window grows with them as Leap's does with
// cache hits. Cache mode sees its hits: they fault.
type Predictor interface {
	// Access feeds one access to page (a page number: address / PageSize); hit says the page
	// was one this predictor had named. It appends its predictions to out, nearest first.
	Access(page uint64, hit bool, out []uint64) []uint64
}

// MaxPrefetchBatch bounds the pages one demand fault may prefetch: a batch is one value on the
// worker's channel (no allocation per fault) and one buffer of this many pages.
const MaxPrefetchBatch = 32

// prefetchBatch is one demand fault's predictions that were worth fetching: evicted pages with
// a stored copy, marked Prefetching in the page table.
type prefetchBatch struct {
	n       int
	pages   [MaxPrefetchBatch]uint64 // addresses
	trigger uint64                   // with a tracer: the fault that predicted them
}

// prefetchState is a process's prefetcher and what map mode remembers to infer hits. It is
// touched only by the fault thread, under the page table's lock.
type prefetchState struct {
	pred     Predictor
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
func (p *Process) predict(pg uint64, hit bool) {
	s := &p.pf
	p.clock.mark(&p.clock.pfStart)
	defer p.clock.mark(&p.clock.pfEnd)
	page := pg / ps
	cache := p.rt.PrefetchCache
	if cache == nil && len(s.window) > 0 {
		s.used = consumedBetween(s.lastMiss, s.window, page, s.used[:0])
		for _, u := range s.used {
			s.out = s.pred.Access(u, true, s.out[:0])
		}
		p.rt.Stats.PrefetchUsed.Add(int64(len(s.used)))
	}
	s.out = s.pred.Access(page, hit, s.out[:0])
	s.lastMiss, s.window = page, s.window[:0]
	var b prefetchBatch
	for _, q := range s.out {
		if b.n == MaxPrefetchBatch || q >= 1<<52 { // 1<<52 pages: past any user address
			break
		}
		a := q * ps
		e := p.table.Get(a)
		if e == nil || e.State != pagetable.Evicted || e.Slot == 0 || e.Prefetching || e.InFlight || e.Zapping {
			continue
		}
		if cache != nil && cache.cached(p, a) {
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
		p.rt.Stats.PrefetchIssued.Add(int64(b.n))
		p.choose(&b, &x.w)
		n := p.load(&x.w, x.buf)
		p.clock.pfPages, p.clock.pfPlaced = x.w.n, n
		p.deliver(&x.w, x.buf, n)
		return
	}
	if p.clock.on {
		b.trigger = pg
	}
	for _, a := range b.pages[:b.n] {
		p.table.Get(a).Prefetching = true
	}
	select {
	case p.prefetchQ <- b:
		p.rt.Stats.PrefetchIssued.Add(int64(b.n))
	default: // the worker is behind: drop this prediction rather than wait
		p.finish(&b)
		s.window = s.window[:0]
	}
}

// consumedBetween infers which of the pages predicted at the miss prev (window, in prediction
// order) the program used before its next miss, at miss: those it must have walked through to
// get there. Walking the window in order, a page counts while it lies strictly between prev
// and miss; the run counts only if miss lands within one step of the last page counted (the
// stream went on past the window, or stopped inside it). A miss anywhere else (a jump, another
// stream) says nothing about the window, and nothing counts.
func consumedBetween(prev uint64, window []uint64, miss uint64, out []uint64) []uint64 {
	between := func(x uint64) bool { return (prev < x && x < miss) || (miss < x && x < prev) }
	dist := func(a, b uint64) uint64 { return max(a, b) - min(a, b) }
	c := 0
	for c < len(window) && between(window[c]) {
		c++
	}
	if c == 0 {
		return out
	}
	step := dist(window[0], prev)
	if c > 1 {
		step = max(step, dist(window[c-1], window[c-2]))
	}
	if dist(miss, window[c-1]) > step {
		return out
	}
	return append(out, window[:c]...)
}

// prefetchLoop is the process's prefetch worker: it fetches queued batches and installs them,
// so a demand fault never waits for its predictions. It ends when the queue is closed (retire,
// after the fault thread stopped).
func (p *Process) prefetchLoop() {
	x := newPrefetchScratch()
	for b := range p.prefetchQ {
		if !p.Hold() {
			continue // retired: drain until the queue is closed
		}
		var start time.Time
		var loaded time.Duration
		tracing := p.rt.Tracer != nil // not p.clock: that is the fault thread's
		if tracing {
			start = time.Now()
		}
		p.table.Lock()
		p.choose(&b, &x.w)
		p.table.Unlock()
		n := p.load(&x.w, x.buf)
		if tracing {
			loaded = time.Since(start)
		}
		p.table.Lock()
		p.deliver(&x.w, x.buf, n)
		p.finish(&b)
		p.table.Unlock()
		if tr := p.rt.Tracer; tracing && x.w.n > 0 {
			p.rt.tracePrefetch(tr, &x.rng, &PrefetchRecord{Pid: p.Pid(), Trigger: b.trigger, Start: start, Load: loaded,
				End: time.Since(start), Pages: x.w.n, Delivered: n})
		}
		// Faults on these pages waited for this batch (see missing): they find their page
		// resident now, or fetch it themselves.
		if p.waiting.Load() {
			var one = [8]byte{1}
			unix.Write(p.room, one[:])
		}
		p.Release()
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
func (p *Process) choose(b *prefetchBatch, w *prefetchWork) {
	slices.Sort(b.pages[:b.n])
	w.n = 0
	for _, a := range b.pages[:b.n] {
		e := p.table.Get(a)
		if e == nil || e.State != pagetable.Evicted || e.Slot == 0 || e.InFlight || e.Zapping {
			continue
		}
		w.addr[w.n], w.entry[w.n], w.seq[w.n], w.slot[w.n], w.dirt[w.n] = a, e, e.Seq, e.Slot, e.Refetch(false)
		w.n++
	}
	if room := p.rt.Evictor.HighWater() - p.rt.Evictor.Used(); int64(w.n) > room {
		w.n = int(max(room, 0))
	}
}

// finish clears Prefetching on the pages of b that were not installed (an install resets
// it). The table is locked.
func (p *Process) finish(b *prefetchBatch) {
	for _, a := range b.pages[:b.n] {
		if e := p.table.Get(a); e != nil {
			e.Prefetching = false
		}
	}
}

// load reads the chosen pages into buf, in one request when the backend can batch, and
// returns how many it read (buf[i*ps:] holds page i of w, which it compacts past failures).
// A page that cannot be read is skipped: the demand path reports it if the program needs it.
func (p *Process) load(w *prefetchWork, buf []byte) int {
	store := p.rt.Slots.Backend()
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
func (p *Process) deliver(w *prefetchWork, buf []byte, n int) {
	c := p.rt.PrefetchCache
	if c == nil {
		p.install(w, buf, n)
		return
	}
	for j := 0; j < n; j++ {
		if p.unchanged(w, j) {
			c.put(p, w, j, buf[j*ps:(j+1)*ps])
			p.rt.Stats.PrefetchInstalled.Add(1)
		}
	}
}

// install maps the first n loaded pages of w that are still the evicted pages they were (same
// entry, same install sequence, same slot), without waking anyone: nobody waits for them, and
// a fault on one of them meanwhile finds it resident and only wakes. The table is locked.
func (p *Process) install(w *prefetchWork, buf []byte, n int) {
	for i := 0; i < n; {
		// The longest run of contiguous pages from i, each unchanged, all of one mode.
		j := i
		for j < n && p.unchanged(w, j) && (j == i || w.addr[j] == w.addr[j-1]+ps && w.dirt[j] == w.dirt[i]) {
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
		c, err := uffd.Copy(p.fd, w.addr[i], unsafe.Pointer(&buf[i*ps]), uint64(j-i)*ps, mode)
		k := i + int(max(c, 0)/ps)
		p.rt.Stats.PrefetchInstalled.Add(int64(k - i))
		for ; i < k; i++ {
			p.table.Install(w.addr[i], w.dirt[i], w.slot[i])
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
func (p *Process) unchanged(w *prefetchWork, j int) bool {
	e := p.table.Get(w.addr[j])
	return e != nil && e == w.entry[j] && e.Seq == w.seq[j] && e.State == pagetable.Evicted &&
		e.Slot == w.slot[j] && !e.InFlight && !e.Zapping
}
