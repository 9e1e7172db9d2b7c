package launcher

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/latency"
	"github.com/farmem/farmem/procfs"
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
	// Attached: `farmem attach`, not run: the figures are of the time attached (before a
	// detach). AttachedAtBytes: the process's anonymous memory as farmem attached.
	Attached        bool  `json:"attached"`
	AttachedAtBytes int64 `json:"attached_at_bytes"`
	// BroughtBackPages: the pages a detach read back into the process; not in Faults.
	BroughtBackPages int64 `json:"brought_back_pages"`
	// ArmThresholdBytes is the programs' anonymous memory at which the run arms (the cap less
	// an arming margin); 0 when the cap is within that margin and the run armed from the start.
	ArmThresholdBytes int64 `json:"arm_threshold_bytes"`
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
	// FromStaging: pages served from a staging area: victims of a batch in flight touched
	// again once moved, and pages fork children read from a staging area of their parent's.
	FromStaging int64 `json:"from_staging"`
	// InProgram: faults served in the program, by the thread farmem starts there
	// (--serve-faults program), each a page read back from the embedded store; not in Faults,
	// nor in BytesIn.
	InProgram int64 `json:"in_program"`
	// AdoptedVanished: pages adopted (present before they were registered) that the kernel
	// later dropped at the program's request, served as zeros (pagetable.Adopt).
	AdoptedVanished int64     `json:"adopted_vanished"`
	Removes         int64     `json:"removes"` // REMOVE events read (the program's discards and our drops)
	Prefetch        *Prefetch `json:"prefetch,omitempty"`
	Evicted         Evicted   `json:"evicted"`
	Batches         Batches   `json:"batches"`
	// MappingsSeen: mmap and brk calls the mapping filter handed over; UnseenPages: pages the
	// rescan found already written in mappings it registered once armed.
	MappingsSeen int64 `json:"mappings_seen"`
	UnseenPages  int64 `json:"unseen_pages"`
	// OverCapFaults: faults let in over the cap because the evictor found nothing it could take.
	OverCapFaults int64 `json:"over_cap_faults"`
	// UnservedImages: images processes of the run exec'd that did not load the shim (a static
	// binary, LD_PRELOAD dropped) and that farmem could not enter: they ran without farmem.
	UnservedImages int64 `json:"unserved_images"`
	// UnfilteredProcesses: processes served without the mapping filter, which they could not
	// install (running as another user, they may not) and did not inherit: the mappings made in
	// them out of the shim's sight (glibc's internal ones; in a static program, all) were found
	// by polling.
	UnfilteredProcesses int64 `json:"unfiltered_processes"`
	// EnteredImages: images processes of the run exec'd that did not load the shim, which
	// farmem entered by injection, as it enters a static program, and served from then on.
	EnteredImages int64 `json:"entered_images"`
	// HeldThreadsMax: the most threads of one process farmem held on its fault thread's CPU at
	// once (one: the thread that faults; more: a process faulting hard from several threads);
	// BusyReleases: how often held threads were let go because they took most of that CPU
	// themselves (runtime/gather.go).
	HeldThreadsMax int64 `json:"held_threads_max"`
	BusyReleases   int64 `json:"busy_releases"`
	// BackendPeakPages and BackendPeakBytes: the most the backend held, in pages and in bytes
	// (fewer bytes than pages when it compresses).
	BackendPeakPages int64 `json:"backend_peak_pages"`
	BackendPeakBytes int64 `json:"backend_peak_bytes"`
	// FarmemPeakRSSBytes: the most of farmem's own memory the kernel ever counted resident
	// (VmHWM): its store, heap, code and stacks; 0 if it could not be read.
	FarmemPeakRSSBytes int64 `json:"farmem_peak_rss_bytes"`
	// BytesIn: page bytes read back (faults and prefetches); BytesOut: page bytes evictions wrote.
	BytesIn  int64 `json:"bytes_in"`
	BytesOut int64 `json:"bytes_out"`
	// PeakAnonBytes: the highest anonymous RSS of all processes together that the RSS poll saw
	// (a page shared with a fork child counts in each).
	PeakAnonBytes int64 `json:"peak_anon_bytes"`
	// Processes: how many processes the run served (the program, images it exec'd, fork children).
	Processes int64 `json:"processes"`
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
	Count     int64 `json:"count"`
	Runs      int64 `json:"runs"`      // contiguous runs of victims, over all batches
	Staged    int64 `json:"staged"`    // victims moved out (UFFDIO_MOVE) rather than dropped
	Removes   int64 `json:"removes"`   // REMOVE events the drops raised
	Aborted   int64 `json:"aborted"`   // batches whose drop way was given up: victims unmapped or moved meanwhile
	Unsettled int64 `json:"unsettled"` // of those, batches whose commit found a layout event not applied
	Stale     int64 `json:"stale"`     // victims not moved: the program's layout changed after the choice
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
		ArmThresholdBytes: max(rt.ArmPages(), 0) * runtime.PageSize, Faults: map[string]Histogram{}, Held: map[string]Histogram{},
		ZeroFills: s.ZeroFills.Load(), ZeroFillPages: s.ZeroPages.Load(), FromStaging: s.FromStaging.Load(), InProgram: s.InProgram.Load(), AdoptedVanished: s.Vanished.Load(),
		Removes: s.Removes.Load(),
		Evicted: Evicted{Written: e.Written.Load(), DroppedClean: e.Dropped.Load(), Zero: e.Zero.Load(), Absent: e.Absent.Load()},
		Batches: Batches{Count: e.Batches.Load(), Runs: e.Runs.Load(), Staged: e.Staged.Load(), Removes: e.Removes.Load(),
			Aborted: e.Aborted.Load(), Unsettled: e.Unsettled.Load(), Stale: e.Stale.Load(), StageNs: map[string]int64{}, Latency: histogram(&e.Batch)},
		MappingsSeen: s.MappingsSeen.Load(), UnseenPages: s.UnseenPages.Load(), OverCapFaults: s.OverCapFaults.Load(), UnservedImages: s.Unserved.Load(),
		UnfilteredProcesses: s.Unfiltered.Load(),
		EnteredImages:       s.Entered.Load(),
		HeldThreadsMax:      s.HeldThreadsMax.Load(), BusyReleases: s.BusyReleases.Load(),
		BackendPeakPages: e.PeakStored.Load(), BackendPeakBytes: e.PeakStoredBytes.Load(),
		BytesIn: rt.BytesIn(), BytesOut: rt.BytesOut(), PeakAnonBytes: s.PeakAnonPages.Load() * runtime.PageSize,
		Processes: s.Processes.Load(),
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
	out.FarmemPeakRSSBytes, _ = procfs.StatusBytes(0, "VmHWM")
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

// summaryLines is the summary on stderr, in plain words and a few short lines, all from s:
// what the cap held and the peak as the kernel counts it, the pages that came back and went
// out, what the faults cost the program and which of them had to wait, and whether prefetching
// paid. Everything else (eviction batches and their stages, mappings seen, the backend's peak,
// histograms) is in --summary-json, and the live figures in --stats.
func summaryLines(s *Summary) []string {
	name := "the program"
	if len(s.Program) > 0 {
		name = filepath.Base(s.Program[0])
	}
	if !s.Armed {
		// Nothing was registered: no fault could be taken, and no page moved. The cgroup's peak
		// is exact, the sampled one may miss a short program's; but the cgroup's holds page
		// cache too, and above the threshold would read as a contradiction.
		peak := fmt.Sprintf("its anonymous memory peaked at %s, sampled", size(s.PeakAnonBytes))
		if cg := s.CgroupPeakBytes; cg != nil && *cg < s.ArmThresholdBytes {
			peak = fmt.Sprintf("at its peak the kernel counted %s", size(*cg))
		}
		return []string{fmt.Sprintf("farmem: never armed: %s stayed below %s of its %s cap (%s), no fault taken",
			name, size(s.ArmThresholdBytes), size(s.CapBytes), peak)}
	}
	var out []string
	line := func(format string, a ...any) { out = append(out, "farmem: "+fmt.Sprintf(format, a...)) }

	// What the cap held. The cap counts the anonymous memory farmem manages; the kernel's count
	// of the run's memory cgroup adds page cache and kernel memory, which nothing caps.
	switch cg := s.CgroupPeakBytes; {
	case cg == nil:
		line("held %s to %s; its anonymous memory peaked at %s (sampled)", name, size(s.CapBytes), size(s.PeakAnonBytes))
	case *cg <= s.CapBytes:
		line("held %s to %s; at its peak the kernel counted %s", name, size(s.CapBytes), size(*cg))
	default:
		line("held %s to %s; at its peak the kernel counted %s: %s anonymous, the rest page cache and kernel memory, not capped",
			name, size(s.CapBytes), size(*cg), size(min(s.PeakAnonBytes, *cg)))
	}
	if s.AttachedAtBytes > s.CapBytes {
		line("it had %s when farmem attached: what was over the cap went to the store", size(s.AttachedAtBytes))
	}
	limit, limitWords := s.CapBytes, "the cap"
	if s.AttachedAtBytes > s.CapBytes {
		limit, limitWords = s.AttachedAtBytes, "what it had then"
	}
	if over := s.PeakAnonBytes - limit; over > 0 {
		// An eviction batch's pages leave the count the cap keeps when they are stored, and the
		// kernel's when the program's agent drops them, a moment later; the sampled peak adds up
		// each process's own count, so a page a fork child shares counts in both.
		why := "pages being evicted count until their batch drops them"
		if s.Processes-s.EnteredImages > 1 { // an entered image is counted as a process, but shares nothing
			why += ", and a page a fork child shares counts in each process"
		}
		line("its anonymous memory went %s over %s: %s", size(over), limitWords, why)
	}
	switch {
	case s.EnteredImages == 1:
		line("an image the program exec'd did not load farmem's shim: farmem entered it, and capped it with the rest")
	case s.EnteredImages > 1:
		line("%s images the program exec'd did not load farmem's shim: farmem entered them, and capped them with the rest", count(s.EnteredImages))
	}
	switch {
	case s.UnservedImages == 1:
		line("an image the program exec'd ran without farmem (named above), its memory not capped")
	case s.UnservedImages > 1:
		line("%s images the program exec'd ran without farmem (named above), their memory not capped", count(s.UnservedImages))
	}
	switch {
	case s.UnfilteredProcesses == 1:
		line("a process was served without the mapping filter (named above): what it mapped out of the shim's sight (glibc's internal mappings; in a static program, all) was found by polling, and may have passed the cap until it was")
	case s.UnfilteredProcesses > 1:
		line("%s processes were served without the mapping filter (the first named above): what they mapped out of the shim's sight (glibc's internal mappings; in a static program, all) was found by polling, and may have passed the cap until it was",
			count(s.UnfilteredProcesses))
	}
	if s.OverCapFaults > 0 {
		line("%s faults went in over the cap: the evictor found nothing it could take (the memory over the cap was in processes not yet set up for eviction, or not tracked)",
			count(s.OverCapFaults))
	}

	// Pages in and out, one count each.
	inPages, outPages := s.BytesIn/runtime.PageSize+s.InProgram, s.Evicted.Written+s.Evicted.DroppedClean+s.Evicted.Zero
	if inPages == 0 && outPages == 0 {
		line("no page had to go out: %s fit in its cap", name)
	} else {
		back := size(inPages * runtime.PageSize)
		if s.InProgram > 0 {
			back += fmt.Sprintf(", %s of them by faults served in the program", count(s.InProgram))
		}
		if s.Prefetch != nil && s.Prefetch.Placed > 0 {
			back += fmt.Sprintf(", %s of them prefetched", count(s.Prefetch.Placed))
		}
		parts := []string{size(s.BytesOut) + " written"}
		if n := s.Evicted.DroppedClean; n > 0 {
			parts = append(parts, count(n)+" unchanged since stored")
		}
		if n := s.Evicted.Zero; n > 0 {
			parts = append(parts, count(n)+" all zeros")
		}
		line("%s pages came back (%s) and %s went out (%s)", count(inPages), back, count(outPages), strings.Join(parts, ", "))
	}
	if n := s.BroughtBackPages; n > 0 {
		line("the detach read %s pages (%s) back into it", count(n), size(n*runtime.PageSize))
	}

	// What the faults cost: their service time, from reading the fault to the install, is time
	// the faulting thread of the program waited.
	var faults uint64
	var cost int64
	for _, h := range s.Faults {
		faults += h.Count
		cost += int64(h.SumNs)
	}
	if faults == 0 {
		line("no fault was taken")
	} else {
		var parts []string
		if h := s.Faults["backend"]; h.Count > 0 {
			parts = append(parts, fmt.Sprintf("%s read back (median %s, 99th percentile %s)", count(int64(h.Count)), duration(h.P50Ns), duration(h.P99Ns)))
		}
		for _, k := range []struct{ src, what string }{
			{"cache", "from the prefetch cache"}, {"zero", "first touches"}, {"wp", "first writes"},
		} {
			if h := s.Faults[k.src]; h.Count > 0 {
				parts = append(parts, count(int64(h.Count))+" "+k.what)
			}
		}
		what := "faults"
		if s.InProgram > 0 {
			what = "the faults farmem served"
		}
		line("%s cost the program %s: %s", what, duration(cost), strings.Join(parts, ", "))
	}
	if s.InProgram > 0 {
		line("%s faults were served in the program, by farmem's thread there, from the store (not timed)", count(s.InProgram))
	}
	var held uint64
	var heldNs int64
	var why []string
	for _, k := range []struct{ why, what string }{
		{"room", "for room at the cap"}, {"busy", "for their page to finish moving"}, {"event", "behind a change to the program's mappings"},
	} {
		if h := s.Held[k.why]; h.Count > 0 {
			held += h.Count
			heldNs += int64(h.SumNs)
			why = append(why, count(int64(h.Count))+" "+k.what)
		}
	}
	if held > 0 {
		line("%s of the faults waited, %s: %s of the faults' time", count(int64(held)), and(why), percent(heldNs, cost))
	}
	if s.HeldThreadsMax > 1 {
		let := ""
		if s.BusyReleases > 0 {
			let = "; let go once because they computed more than they waited for pages"
			if s.BusyReleases > 1 {
				let = fmt.Sprintf("; let go %s times because they computed more than they waited for pages", count(s.BusyReleases))
			}
		}
		line("up to %s threads of a process that faulted hard ran on one CPU with its fault thread, so that no fault woke a thread across CPUs%s",
			count(s.HeldThreadsMax), let)
	}

	// Whether prefetching paid: it did if most of the pages it brought were used. Map mode's
	// used pages took no fault at all; cache mode's were faults served from the cache.
	if p := s.Prefetch; p != nil && (p.Placed > 0 || s.Faults["backend"].Count > 0) {
		how, brought, spared := p.Name+", map mode", "brought ahead of need", "took no fault"
		if p.Mode == "cache" {
			how, brought, spared = p.Name+", cache mode", "read ahead", "were in the cache"
		}
		verdict := "did not pay"
		if p.Used > 0 && 2*p.Used >= p.Placed {
			verdict = "paid"
		}
		unused := ""
		if p.PushedOut > 0 {
			unused = fmt.Sprintf(", %s pushed out unused", count(p.PushedOut))
		}
		line("prefetching (%s) %s: %s pages %s, %s used (%s)%s; %s of the pages %s needed back %s",
			how, verdict, count(p.Placed), brought, count(p.Used), percent(min(p.Used, p.Placed), p.Placed), unused,
			percent(p.Used, p.Used+int64(s.Faults["backend"].Count)), name, spared)
	}
	return out
}

// printSummary writes the summary's lines to w.
func printSummary(w io.Writer, s *Summary) {
	for _, l := range summaryLines(s) {
		fmt.Fprintln(w, l)
	}
}

// count writes n with thousands separators: 48,312.
func count(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// size writes n bytes in the largest binary unit that keeps it at least 1, whole when it is,
// else to a tenth under 100 and whole from there: 32 MiB, 33.4 MiB, 189 MiB.
func size(n int64) string {
	v, unit := float64(n), "B"
	for _, u := range []string{"KiB", "MiB", "GiB", "TiB"} {
		if math.Abs(v) < 1024 {
			break
		}
		v, unit = v/1024, u
	}
	switch {
	case v == math.Trunc(v) || math.Abs(v) >= 99.95:
		return fmt.Sprintf("%.0f %s", v, unit)
	}
	return fmt.Sprintf("%.1f %s", v, unit)
}

// duration writes ns nanoseconds to two significant digits, in the unit that reads best:
// 850 ns, 9.7 µs, 60 µs, 1.5 ms, 0.62 s, 12 s.
func duration(ns int64) string {
	if ns <= 0 {
		return "0 s"
	}
	r := roundSig(float64(ns), 2)
	switch {
	case r < 1e3:
		return sig(r, 1) + " ns"
	case r < 1e6:
		return sig(r, 1e3) + " µs"
	case r < 1e8:
		return sig(r, 1e6) + " ms"
	}
	return sig(r, 1e9) + " s"
}

// roundSig rounds v > 0 to n significant digits.
func roundSig(v float64, n int) float64 {
	f := math.Pow(10, math.Floor(math.Log10(v))-float64(n-1))
	return math.Round(v/f) * f
}

// sig writes r (rounded to two significant digits) divided by unit, with as many decimals as
// those digits need.
func sig(r, unit float64) string {
	v := r / unit
	return strconv.FormatFloat(v, 'f', max(0, 1-int(math.Floor(math.Log10(v)+1e-9))), 64)
}

// percent writes a/b as a whole percentage; a share above 0 that rounds to 0 is "under 1 %".
func percent(a, b int64) string {
	if b <= 0 {
		return "0 %"
	}
	p := 100 * float64(a) / float64(b)
	switch {
	case p > 0 && p < 0.5:
		return "under 1 %"
	case p >= 99.5 && a < b:
		return "over 99 %"
	}
	return fmt.Sprintf("%.0f %%", p)
}

// and joins parts as a list is said: "a", "a and b", "a, b and c".
func and(parts []string) string {
	if len(parts) < 2 {
		return strings.Join(parts, "")
	}
	return strings.Join(parts[:len(parts)-1], ", ") + " and " + parts[len(parts)-1]
}
