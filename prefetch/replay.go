package prefetch

import "fmt"

// Metrics are Leap's measures of a prefetcher over one replay, in one mode.
type Metrics struct {
	Prefetcher string `json:"prefetcher"`
	Mode       Mode   `json:"mode"`         // where predicted pages went: map or cache
	Max        int    `json:"prefetch_max"` // the prefetcher's Config.Max
	Processes  int    `json:"processes"`    // distinct pids in the stream
	Faults     uint64 `json:"faults"`       // demand faults replayed (the trace's records)
	// Hits are the faults whose page had been prefetched: served from the prefetch cache
	// (cache mode) or already installed, so they would not have faulted at all (map mode).
	Hits       uint64 `json:"hits"`
	Misses     uint64 `json:"misses"`     // Faults - Hits: faults that went to far memory
	Prefetched uint64 `json:"prefetched"` // pages issued (a page cached or installed unused is not issued again)
	// FedHits are the hits the prefetcher was told of (Access with hit set). Cache mode sees
	// its hits: FedHits = Hits. Map mode cannot, and feeds the pages ConsumedBetween infers
	// the program used between two misses: a guess, above Hits when a skipped page is
	// inferred used, below when pages used before a jump are not, or when no miss follows.
	FedHits uint64 `json:"fed_hits"`
	// Pollution is the prefetched pages never used: pushed out of the full cache or the
	// installed set by newer ones (Evicted) or still there when the stream ended.
	// Prefetched = Hits + Pollution.
	Pollution uint64 `json:"pollution"`
	Evicted   uint64 `json:"evicted"` // pollution pushed out before its use
	// Accuracy = Hits / Prefetched: how much of what was fetched was used.
	Accuracy float64 `json:"accuracy"`
	// Coverage = Hits / Faults: how many faults the prefetcher saved from far memory.
	Coverage float64 `json:"coverage"`
	// Lead is the timeliness proxy. A hit's lead is how many faults of its own process
	// separate the fault that issued the page from the fault that used it (1: issued by the
	// fault just before), counting the trace's faults in both modes (a map-mode hit would
	// not fault live, but it is the program's access all the same). The trace has no fetch
	// latencies, so lead stands in for the time a prefetch had to arrive: in a live run a
	// page with lead 1 had only the time from one fault to the next, and may still have been
	// in flight (a late prefetch, which Leap counts as a hit but not a timely one); a long
	// lead had many. LeadP50 is the median and LeadMean the mean over all hits (0 without
	// hits); LeadOne counts the hits of lead 1.
	LeadP50  uint64  `json:"lead_p50"`
	LeadMean float64 `json:"lead_mean"`
	LeadOne  uint64  `json:"lead_one"`
}

// Access is one demand fault of a trace.
type Access struct {
	Pid  uint32
	Page uint64 // page number: address >> 12
}

// Mode is where a replay puts predicted pages, as farmem run's --prefetch-mode.
type Mode string

const (
	// ModeMap installs predicted pages straight into the program: farmem run's default.
	ModeMap Mode = "map"
	// ModeCache holds them in a FIFO prefetch cache until their fault: Leap's.
	ModeCache Mode = "cache"
)

// Modes lists the replay modes, farmem run's default first.
func Modes() []Mode { return []Mode{ModeMap, ModeCache} }

// cacheKey names a cached or installed page: pages are per address space.
type cacheKey struct {
	pid  uint32
	page uint64
}

// process is one pid's replay state.
type process struct {
	p      Prefetcher
	faults uint64 // faults of this process so far, the clock of Lead
	// Map mode: the previous miss and the pages installed for it, in prediction order, from
	// which the next miss infers the hits (ConsumedBetween).
	lastMiss uint64
	window   []uint64
}

// leadBuckets bounds the lead histogram: longer leads count as this long for the median.
const leadBuckets = 1 << 16

// Replayer scores a prefetcher on a stream of demand faults the way the fault path would
// use it, with no I/O and no clock, in one of two modes.
//
// Both modes:
//
//   - Each process (pid) has its own Prefetcher, made by New from one Config on the
//     process's first fault: a forked child starts with an empty history, as it does live.
//   - Predicted pages wait, unused, in one FIFO of a bounded number of pages shared by all
//     processes and keyed by (pid, page). A fault on a page in it is a hit, which takes the
//     page out immediately; anything else is a miss. When the FIFO is full, a new prediction
//     pushes out the oldest page (Evicted). A predicted page already in it is not issued
//     again; any other is issued: counted as prefetched and put in. The fetch is assumed to
//     complete before the next fault (see Lead for how early).
//
// Cache mode (ModeCache) is Leap's: the FIFO is the prefetch cache and a hit is a fault
// served from it (eager eviction: the page is mapped in the process, not cached). Every
// fault, hit or miss, is fed to the process's prefetcher with hit set accordingly, and what
// it predicts is issued.
//
// Map mode (ModeMap) is farmem run's default (fetcher's map mode): a predicted page is
// installed into the program right away, so the program's access to it never faults. A hit
// is therefore invisible: the prefetcher is not fed it and predicts nothing for it. On a miss,
// the pages the program used since its previous miss are inferred from where it landed
// (ConsumedBetween over the pages installed at the previous miss) and fed as hits, their
// predictions dropped; then the miss is fed, and the pages it predicts that are not
// installed already are issued and become the window the next miss infers from. These are
// the steps of the fault path, so the prefetcher's history and window evolve as they would
// live, while the metrics count the real hits, which a live run cannot see.
//
// In map mode the FIFO holds the installed pages not used yet. Live, such a page stays
// resident until the evictor takes it, and the evictor takes resident pages in install
// order (a prefetch install earns a page no second chance: only a demand re-fault does), so
// the oldest unused installed page is the first to go: the FIFO's order. How long it stays
// depends on the cap and the resident set, which a trace does not hold; the replay bounds
// the unused installed pages by the same number of pages as cache mode's cache, so both
// modes have the same room for guesses and their rows compare what the prefetcher guessed
// and how it learned, not how much memory each was given. A larger bound models a cap with
// more room below it.
//
// A recorded trace (faulttrace, `farmem run --record-faults`) is a trace of the recording
// run's misses: faults its own prefetcher served are not in it, and the pages it prefetched
// were never evicted again. Record with `--prefetch none` to score prefetchers on the
// program's real stream of re-faults. Pages the program had resident are unknown to the
// trace: a prediction of one counts as prefetched and, never faulted, as pollution, where
// the live fetcher would have skipped it (and, in map mode, left it out of the window).
//
// Not safe for concurrent use.
type Replayer struct {
	config Config
	mode   Mode
	procs  map[uint32]*process // by pid, made on a pid's first fault
	// The prefetched pages not used yet: which buffer holds each (the FIFO the live cache
	// uses), and the process's fault count when each buffer's page was issued.
	cache   *FIFO[cacheKey]
	issued  []uint64
	out     []uint64
	used    []uint64 // map mode: the hits inferred at a miss
	leads   []uint64 // hits by lead, len leadBuckets+1 (the last: leadBuckets or more)
	leadSum float64
	m       Metrics
}

// NewReplayer returns a Replayer for prefetchers made from c, in mode, that keeps at most
// pages prefetched pages unused: cache mode's prefetch cache, map mode's installed pages.
func NewReplayer(c Config, mode Mode, pages int) (*Replayer, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if mode != ModeMap && mode != ModeCache {
		return nil, fmt.Errorf("unknown prefetch mode %q: choose %s or %s", mode, ModeMap, ModeCache)
	}
	if pages < 1 || pages > MaxCachePages {
		return nil, fmt.Errorf("prefetch cache of %d pages: give 1 to %d", pages, MaxCachePages)
	}
	c = c.WithDefaults()
	r := &Replayer{
		config: c,
		mode:   mode,
		procs:  make(map[uint32]*process),
		cache:  NewFIFO[cacheKey](pages),
		issued: make([]uint64, pages),
		out:    make([]uint64, 0, c.Max),
		used:   make([]uint64, 0, c.Max),
		leads:  make([]uint64, leadBuckets+1),
		m:      Metrics{Prefetcher: c.Name, Mode: mode, Max: c.Max},
	}
	return r, nil
}

// MaxCachePages bounds a replay's unused prefetched pages (2^24 pages: 64 GiB).
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
		r.cache.Remove(i) // the page is the process's: mapped, not waiting
		r.m.Hits++
		r.leads[min(lead, leadBuckets)]++
		r.leadSum += float64(lead)
		if lead == 1 {
			r.m.LeadOne++
		}
	}
	if r.mode == ModeCache {
		if hit {
			r.m.FedHits++
		}
		r.out = proc.p.Access(page, hit, r.out[:0])
		r.issue(pid, proc, false)
		return
	}
	if hit {
		return // installed: the program never faulted, so nothing saw it
	}
	r.used = ConsumedBetween(proc.lastMiss, proc.window, page, r.used[:0])
	for _, u := range r.used {
		r.out = proc.p.Access(u, true, r.out[:0]) // as fetcher: the answer to a hit is dropped
	}
	r.m.FedHits += uint64(len(r.used))
	r.out = proc.p.Access(page, false, r.out[:0])
	proc.lastMiss, proc.window = page, proc.window[:0]
	r.issue(pid, proc, true)
}

// issue prefetches the pages of r.out that are not waiting unused already, for pid's fault
// just counted; with window, it also records them as proc's map-mode window.
func (r *Replayer) issue(pid uint32, proc *process, window bool) {
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
		if window {
			proc.window = append(proc.window, p)
		}
	}
}

// Metrics returns the measures so far; pages still waiting unused count as pollution. The
// replay may go on afterwards.
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
func Replay(c Config, mode Mode, pages int, accesses []Access) (Metrics, error) {
	r, err := NewReplayer(c, mode, pages)
	if err != nil {
		return Metrics{}, err
	}
	for _, a := range accesses {
		r.Access(a.Pid, a.Page)
	}
	return r.Metrics(), nil
}
