package launcher

import (
	"encoding/json"
	"os"
	"time"

	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/latency"
	"github.com/farmem/farmem/runtime"
)

// Summary is the whole run summary in raw numbers, what `farmem run --summary-json FILE` writes:
// bytes, pages, nanoseconds and histograms' buckets, for programs to read (the benchmark harness
// does) where the summary on stderr is for people. README.md ("Using it") documents the fields.
type Summary struct {
	Program    []string `json:"program"`
	ExitStatus int      `json:"exit_status"`       // farmem's exit status: the program's own, 128+N for signal N
	Failure    string   `json:"failure,omitempty"` // why farmem stopped the program, if it did
	CapBytes   int64    `json:"cap_bytes"`
	Armed      bool     `json:"armed"`
	// ArmedAtBytes is the programs' anonymous memory when the run armed; 0 if it armed from the
	// start, or never.
	ArmedAtBytes int64 `json:"armed_at_bytes"`
	// ArmWatched: a memory cgroup's threshold said when to arm, rather than polling.
	ArmWatched bool `json:"arm_watched"`
	// Faults is each fault source's service time (zero, backend, wp, cache), reading the fault to
	// the install's return; Held the faults that could not be served when first read, by why
	// (room, busy, event): they are in Faults too.
	Faults map[string]Histogram `json:"faults"`
	Held   map[string]Histogram `json:"held"`
	// ZeroFills and ZeroFillPages: first touches served with zeros, and the pages they filled
	// (a fault may fill a window of pages).
	ZeroFills     int64 `json:"zero_fills"`
	ZeroFillPages int64 `json:"zero_fill_pages"`
	// FromStaging: pages fork children read from a staging area of their parent's.
	FromStaging int64     `json:"from_staging"`
	Removes     int64     `json:"removes"` // REMOVE events read (the program's discards and our drops)
	Prefetch    *Prefetch `json:"prefetch,omitempty"`
	Evicted     Evicted   `json:"evicted"`
	Batches     Batches   `json:"batches"`
	// MappingsSeen: mmap and brk calls the mapping filter handed over; UnseenPages: pages the
	// rescan found already written in mappings it registered once armed.
	MappingsSeen int64 `json:"mappings_seen"`
	UnseenPages  int64 `json:"unseen_pages"`
	// BackendPeakPages and BackendPeakBytes: the most the backend held, in pages and in bytes
	// (fewer bytes than pages when it compresses).
	BackendPeakPages int64 `json:"backend_peak_pages"`
	BackendPeakBytes int64 `json:"backend_peak_bytes"`
	// BytesIn: page bytes read back (faults and prefetches); BytesOut: page bytes evictions wrote.
	BytesIn  int64 `json:"bytes_in"`
	BytesOut int64 `json:"bytes_out"`
	// PeakAnonBytes: the highest anonymous RSS of all processes together that the RSS poll saw
	// (a page shared with a fork child counts in each).
	PeakAnonBytes int64 `json:"peak_anon_bytes"`
	// CgroupPeakBytes: the exact peak of the run's memory cgroup, the kernel's count of the
	// program and its children (anonymous memory, page cache, kernel memory); absent without a
	// cgroup of the run's own.
	CgroupPeakBytes *int64 `json:"cgroup_peak_bytes,omitempty"`
}

// Prefetch is what the prefetcher did.
type Prefetch struct {
	Name       string `json:"name"`
	Mode       string `json:"mode"`        // map or cache
	CachePages int    `json:"cache_pages"` // cache mode's prefetch cache; 0 in map mode
	Issued     int64  `json:"issued"`      // pages predicted and queued for fetching
	Placed     int64  `json:"placed"`      // pages installed (map mode) or cached (cache mode)
	Used       int64  `json:"used"`        // pages the program used (map mode: inferred)
	PushedOut  int64  `json:"pushed_out"`  // cache mode: cached pages pushed out unused
}

// Evicted counts the evicted pages by how they left.
type Evicted struct {
	Written      int64 `json:"written"`       // copied out and stored
	DroppedClean int64 `json:"dropped_clean"` // their stored copy was current: no write
	Zero         int64 `json:"zero"`          // all zeros: stored as nothing
	Absent       int64 `json:"absent"`        // victims absent from the program: left alone
}

// Batches describes the eviction batches.
type Batches struct {
	Count   int64 `json:"count"`
	Runs    int64 `json:"runs"`    // contiguous runs of victims, over all batches
	Staged  int64 `json:"staged"`  // victims moved out (UFFDIO_MOVE) rather than dropped
	Removes int64 `json:"removes"` // REMOVE events the drops raised
	Aborted int64 `json:"aborted"` // batches given up: victims unmapped or moved meanwhile
	// StageNs is the time all batches spent in each stage (evictor.StageNames).
	StageNs map[string]int64 `json:"stage_ns"`
	Latency Histogram        `json:"latency"` // one batch, victim choice to wake
}

// Histogram is a latency histogram: log-linear buckets, 8 to a power of two, so a quantile is
// within 12.5 % of the true value.
type Histogram struct {
	Count   uint64   `json:"count"`
	SumNs   uint64   `json:"sum_ns"`
	P50Ns   int64    `json:"p50_ns"`
	P99Ns   int64    `json:"p99_ns"`
	P999Ns  int64    `json:"p999_ns"`
	Buckets []Bucket `json:"buckets"` // the non-empty ones, in order
}

// Bucket is one histogram bucket: Count durations in [LowerNs, UpperNs).
type Bucket struct {
	LowerNs int64  `json:"lower_ns"`
	UpperNs int64  `json:"upper_ns"`
	Count   uint64 `json:"count"`
}

func histogram(h *latency.Histogram) Histogram {
	var s latency.Snapshot
	h.Snapshot(&s)
	out := Histogram{Count: s.N, SumNs: s.Sum, P50Ns: int64(s.Quantile(0.5)), P99Ns: int64(s.Quantile(0.99)),
		P999Ns: int64(s.Quantile(0.999)), Buckets: []Bucket{}}
	s.Buckets(func(lo, hi time.Duration, n uint64) {
		out.Buckets = append(out.Buckets, Bucket{int64(lo), int64(hi), n})
	})
	return out
}

// summarize takes the run's summary from rt.
func summarize(rt *runtime.Runtime, o Options, status int) *Summary {
	s, e := &rt.Stats, &rt.Evictor().Stats
	out := &Summary{
		Program: o.Argv, ExitStatus: status, CapBytes: o.LocalMem, Armed: rt.Armed(),
		ArmedAtBytes: s.ArmedAtPages.Load() * runtime.PageSize, ArmWatched: rt.ArmWatched(),
		Faults: map[string]Histogram{}, Held: map[string]Histogram{},
		ZeroFills: s.ZeroFills.Load(), ZeroFillPages: s.ZeroPages.Load(), FromStaging: s.FromStaging.Load(),
		Removes: s.Removes.Load(),
		Evicted: Evicted{Written: e.Written.Load(), DroppedClean: e.Dropped.Load(), Zero: e.Zero.Load(), Absent: e.Absent.Load()},
		Batches: Batches{Count: e.Batches.Load(), Runs: e.Runs.Load(), Staged: e.Staged.Load(), Removes: e.Removes.Load(),
			Aborted: e.Aborted.Load(), StageNs: map[string]int64{}, Latency: histogram(&e.Batch)},
		MappingsSeen: s.MappingsSeen.Load(), UnseenPages: s.UnseenPages.Load(),
		BackendPeakPages: e.PeakStored.Load(), BackendPeakBytes: e.PeakStoredBytes.Load(),
		BytesIn: rt.BytesIn(), BytesOut: rt.BytesOut(), PeakAnonBytes: s.PeakAnonPages.Load() * runtime.PageSize,
	}
	if f := rt.Failure(); f != nil {
		out.Failure = f.Error()
	}
	for src := fetcher.Source(0); src < fetcher.NumSources; src++ {
		out.Faults[src.String()] = histogram(&s.Latency[src])
	}
	for h := fetcher.Held(0); h < fetcher.NumHeld; h++ {
		out.Held[h.String()] = histogram(&s.Held[h])
	}
	for i, name := range evictor.StageNames {
		out.Batches.StageNs[name] = e.StageTime[i].Load()
	}
	if rt.Config().NewPrefetcher != nil {
		p := &Prefetch{Name: o.Prefetch.WithDefaults().Name, Mode: "map", Issued: s.PrefetchIssued.Load(),
			Placed: s.PrefetchInstalled.Load(), Used: s.PrefetchUsed.Load()}
		if c := rt.PrefetchCache(); c != nil {
			p.Mode, p.CachePages, p.PushedOut = "cache", c.Pages(), c.Evicted.Load()
		}
		out.Prefetch = p
	}
	if b, ok := rt.CgroupPeak(); ok {
		out.CgroupPeakBytes = &b
	}
	return out
}

// writeSummary writes the summary as one JSON object to path.
func writeSummary(path string, s *Summary) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
