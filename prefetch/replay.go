package prefetch

import "fmt"

// Metrics are Leap's measures of a prefetcher over one replay.
type Metrics struct {
	Prefetcher string `json:"prefetcher"`
	Processes  int    `json:"processes"`  // distinct pids in the stream
	Faults     uint64 `json:"faults"`     // demand faults replayed
	Hits       uint64 `json:"hits"`       // faults served from the prefetch cache
	Misses     uint64 `json:"misses"`     // Faults - Hits: faults that went to far memory
	Prefetched uint64 `json:"prefetched"` // pages issued (a page already cached is not issued again)
	// Pollution is the prefetched pages never used: pushed out of the full cache by newer
	// ones (Evicted) or still in it when the stream ended. Prefetched = Hits + Pollution.
	Pollution uint64 `json:"pollution"`
	Evicted   uint64 `json:"evicted"` // pollution pushed out of the full cache before its use
	// Accuracy = Hits / Prefetched: how much of what was fetched was used.
	Accuracy float64 `json:"accuracy"`
	// Coverage = Hits / Faults: how many faults the prefetcher saved from far memory.
	Coverage float64 `json:"coverage"`
	// Lead is the timeliness proxy. A hit's lead is how many faults of its own process
	// separate the fault that issued the page from the fault that used it (1: issued by the
	// fault just before). The trace has no fetch latencies, so lead stands in for the time a
	// prefetch had to arrive: in a live run a page with lead 1 had only the time from one
	// fault to the next, and may still have been in flight (a late prefetch, which Leap
	// counts as a hit but not a timely one); a long lead had many. LeadP50 is the median and
	// LeadMean the mean over all hits (0 without hits); LeadOne counts the hits of lead 1.
	LeadP50  uint64  `json:"lead_p50"`
	LeadMean float64 `json:"lead_mean"`
	LeadOne  uint64  `json:"lead_one"`
}

// Access is one demand fault of a trace.
type Access struct {
	Pid  uint32
	Page uint64 // page number: address >> 12
}

// cacheKey names a cached page: pages are per address space.
type cacheKey struct {
	pid  uint32
	page uint64
}

// process is one pid's replay state.
type process struct {
	p      Prefetcher
	faults uint64 // faults of this process so far, the clock of Lead
}

// leadBuckets bounds the lead histogram: longer leads count as this long for the median.
const leadBuckets = 1 << 16

// Replayer scores a prefetcher on a stream of demand faults the way the fault path would
// use it, with no I/O and no clock:
//
//   - Each process (pid) has its own Prefetcher, made by New from one Config on the
//     process's first fault: a forked child starts with an empty history, as it does live.
//   - One prefetch cache of a bounded number of pages serves all processes, keyed by (pid,
//     page). It is Leap's eager-eviction FIFO: a hit takes the page out of the cache at once
//     (it is now mapped in the process, not cached), and when the cache is full the oldest
//     prefetched page goes first.
//   - A fault whose page is in the cache is a hit, anything else a miss. Either way the
//     fault is fed to the process's prefetcher (with hit set accordingly) and each page it
//     predicts that is not in the cache already is issued: counted as prefetched and cached.
//     The fetch is assumed to complete before the next fault (see Lead for how early).
//
// A recorded trace (faulttrace, `farmem run --record-faults`) is a trace of the recording
// run's misses: faults its own prefetcher served are not in it, and the pages it prefetched
// were never evicted again. Record with `--prefetch none` to score prefetchers on the
// program's real stream of re-faults. Pages the program had resident are unknown to the
// trace: a prediction of one counts as prefetched and, never faulted, as pollution, where
// the live fetcher would have skipped it.
//
// Not safe for concurrent use.
type Replayer struct {
	config Config
	procs  map[uint32]*process // by pid, made on a pid's first fault
	// The cache: which buffer holds each prefetched page (the FIFO the live cache uses), and
	// the process's fault count when each buffer's page was issued.
	cache   *FIFO[cacheKey]
	issued  []uint64
	out     []uint64
	leads   []uint64 // hits by lead, len leadBuckets+1 (the last: leadBuckets or more)
	leadSum float64
	m       Metrics
}

// NewReplayer returns a Replayer for prefetchers made from c and a cache of cachePages.
func NewReplayer(c Config, cachePages int) (*Replayer, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if cachePages < 1 || cachePages > MaxCachePages {
		return nil, fmt.Errorf("prefetch cache of %d pages: give 1 to %d", cachePages, MaxCachePages)
	}
	c = c.WithDefaults()
	r := &Replayer{
		config: c,
		procs:  make(map[uint32]*process),
		cache:  NewFIFO[cacheKey](cachePages),
		issued: make([]uint64, cachePages),
		out:    make([]uint64, 0, c.Max),
		leads:  make([]uint64, leadBuckets+1),
		m:      Metrics{Prefetcher: c.Name},
	}
	return r, nil
}

// MaxCachePages bounds a replay's prefetch cache (2^24 pages: 64 GiB).
const MaxCachePages = 1 << 24

// Access replays one demand fault of process pid on page.
func (r *Replayer) Access(pid uint32, page uint64) {
	proc := r.procs[pid]
	if proc == nil {
		p, _ := New(r.config) // validated by NewReplayer
		proc = &process{p: p}
		r.procs[pid] = proc
	}
	proc.faults++
	r.m.Faults++
	i, hit := r.cache.Lookup(cacheKey{pid, page})
	if hit {
		lead := proc.faults - r.issued[i]
		r.cache.Remove(i) // eager eviction: the page is the process's now
		r.m.Hits++
		r.leads[min(lead, leadBuckets)]++
		r.leadSum += float64(lead)
		if lead == 1 {
			r.m.LeadOne++
		}
	}
	r.out = proc.p.Access(page, hit, r.out[:0])
	for _, p := range r.out {
		k := cacheKey{pid, p}
		if _, ok := r.cache.Lookup(k); ok {
			continue
		}
		i, pushed := r.cache.Insert(k)
		if pushed {
			r.m.Evicted++ // full: the oldest prefetched page went, unused
		}
		r.issued[i] = proc.faults
		r.m.Prefetched++
	}
}

// Metrics returns the measures so far; pages still cached count as pollution. The replay
// may go on afterwards.
func (r *Replayer) Metrics() Metrics {
	m := r.m
	m.Processes = len(r.procs)
	m.Misses = m.Faults - m.Hits
	m.Pollution = m.Evicted + uint64(r.cache.Len())
	if m.Prefetched > 0 {
		m.Accuracy = float64(m.Hits) / float64(m.Prefetched)
	}
	if m.Faults > 0 {
		m.Coverage = float64(m.Hits) / float64(m.Faults)
	}
	if m.Hits > 0 {
		m.LeadMean = r.leadSum / float64(m.Hits)
		// The median: the lead of the ceil(Hits/2)-th hit in lead order.
		half, seen := (m.Hits+1)/2, uint64(0)
		for lead, n := range r.leads {
			if seen += n; seen >= half {
				m.LeadP50 = uint64(lead)
				break
			}
		}
	}
	return m
}

// Replay runs accesses through a fresh Replayer and returns its Metrics.
func Replay(c Config, cachePages int, accesses []Access) (Metrics, error) {
	r, err := NewReplayer(c, cachePages)
	if err != nil {
		return Metrics{}, err
	}
	for _, a := range accesses {
		r.Access(a.Pid, a.Page)
	}
	return r.Metrics(), nil
}
