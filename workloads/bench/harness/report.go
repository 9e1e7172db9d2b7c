package main

import (
	"encoding/csv"
	"fmt"
	"image/color"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// facts are the machine's, at the start and the end of the run.
type facts struct {
	started             time.Time
	took                time.Duration
	cpu, kernel, commit string
	memGiB              int
	loadStart, loadEnd  string
	busyStart, busyEnd  string
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// busy names what else was running: the machine is shared, and the numbers should say so. Not
// a process younger than two seconds, such as the ps and awk that look, whose share (CPU time
// over a few milliseconds of life) is high.
func busy() string {
	out, _ := exec.Command("sh", "-c", `ps -eo pcpu=,etimes=,args= --sort=-pcpu | awk '$1 > 20 && $2 >= 2 {$2 = ""; print}' | grep -v farmem-bench | head -3 | cut -c1-70`).Output()
	s := strings.TrimSpace(string(out))
	if s == "" {
		return "nothing else above 20 % CPU"
	}
	return strings.ReplaceAll(s, "\n", "; ")
}

func machineFacts() *facts {
	f := &facts{started: time.Now().UTC(), loadStart: loadavg(), busyStart: busy()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "model name") {
				_, f.cpu, _ = strings.Cut(l, ": ")
				break
			}
		}
	}
	if out, err := exec.Command("uname", "-r").Output(); err == nil {
		f.kernel = strings.TrimSpace(string(out))
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		fmt.Sscanf(string(b), "MemTotal: %f kB", &kb)
		f.memGiB = int(kb/(1<<20) + 0.5)
	}
	f.commit = commit
	defer func() {
		if f.commit == "" {
			f.commit = "(unknown commit)"
		}
		// The tree's state says what was checked out; the binary's stamp says what ran: they
		// differ when the tree changed since the last build.
		if v, err := exec.Command(farmemBin, "version").Output(); err == nil {
			f.commit += fmt.Sprintf(" (%s: %s)", farmemBin, strings.TrimSpace(string(v)))
		}
		if beforeBin != "" {
			v, err := exec.Command(beforeBin, "version").Output()
			f.commit += fmt.Sprintf("; farmem-before: %s, %s", beforeBin, strings.TrimSpace(string(v)))
			if err != nil {
				f.commit += fmt.Sprintf(" (its version: %v)", err)
			}
		}
	}()
	if out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output(); err == nil && f.commit == "" {
		f.commit = strings.TrimSpace(string(out))
		if out, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no").Output(); len(out) > 0 {
			f.commit += " with uncommitted changes"
		}
	}
	return f
}

func (f *facts) end(start time.Time) {
	f.took = time.Since(start)
	f.loadEnd, f.busyEnd = loadavg(), busy()
}

// stat is the medians of one workload's runs in one configuration: over the runs that
// finished. A run stopped at its time limit or OOM-killed has no throughput; it is counted
// (timeouts, ooms), never entered as a zero, which would drag the median down (and flatter
// whatever it is compared with).
type stat struct {
	cfgName               string
	n, timeouts, ooms     int // runs, and of them stopped (timeouts counts the OOM kills too)
	tput, wall, p50, p99  float64
	faults, inMiB, outMiB float64
	fsP50, fsP99          float64
	peakMiB               float64
	capMiB                int
	limitMiB              float64
}

// done is how many of the runs finished.
func (s stat) done() int { return s.n - s.timeouts }

// comparable: the runs that finished are most of the rounds, so their median stands for the
// configuration; a median of the few runs that survived would be the survivors' figure.
func (s stat) comparable() bool { return s.n > 0 && 2*s.done() > s.n }

// stopped says how many runs were stopped and why, "" when none was: "1 of 3 OOM-killed".
func (s stat) stopped() string {
	var w []string
	if s.ooms > 0 {
		w = append(w, fmt.Sprintf("%d of %d OOM-killed", s.ooms, s.n))
	}
	if t := s.timeouts - s.ooms; t > 0 {
		w = append(w, fmt.Sprintf("%d of %d timed out", t, s.n))
	}
	return strings.Join(w, ", ")
}

func summarize(rs []result, wl string, c config) (s stat, ok bool) {
	var tp, wa, p5, p9, fa, in, out, f5, f9, pk []float64
	for _, r := range rs {
		if r.wl != wl || r.cfg != c {
			continue
		}
		s.n++
		s.cfgName = c.name()
		s.capMiB, s.limitMiB = r.capMiB, float64(r.limitB)/(1<<20)
		if r.oom {
			s.ooms++
		}
		if r.timeout || r.oom {
			s.timeouts++
			continue // counted, not measured
		}
		tp = append(tp, r.tput)
		wa = append(wa, r.wall)
		p5, p9 = append(p5, r.p50), append(p9, r.p99)
		fa = append(fa, float64(r.faults))
		in, out = append(in, float64(r.inB)/(1<<20)), append(out, float64(r.outB)/(1<<20))
		f5, f9 = append(f5, r.fsP50), append(f9, r.fsP99)
		pk = append(pk, float64(r.peakB)/(1<<20))
	}
	s.peakMiB = median(pk)
	s.fsP50, s.fsP99 = median(f5), median(f9)
	if s.n == 0 {
		return s, false
	}
	s.tput, s.wall, s.p50, s.p99 = median(tp), median(wa), median(p5), median(p9)
	s.faults, s.inMiB, s.outMiB = median(fa), median(in), median(out)
	return s, true
}

func ratio(a, b float64) string {
	if b <= 0 || math.IsNaN(a) || math.IsNaN(b) {
		return "-"
	}
	if a/b < 0.1 {
		return fmt.Sprintf("%.3f", a/b) // paging micro walks run at 1/100 of native and below
	}
	return fmt.Sprintf("%.2f", a/b)
}

// versus is a/b for two configurations' medians, or why there is none: a side whose runs
// finished in fewer than most of its rounds is not comparable.
func versus(a, b stat) string {
	for _, s := range []stat{a, b} {
		if !s.comparable() {
			return fmt.Sprintf("not comparable (%s finished %d of %d)", s.cfgName, s.done(), s.n)
		}
	}
	return ratio(a.tput, b.tput)
}

func (h *harness) report(out string, wls []workload, cfgs []config, pcts []int, rounds int, rs []result, f *facts, plots bool) error {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	cmd := "bin/farmem-bench " + strings.Join(os.Args[1:], " ")
	if v := os.Getenv("ROUNDS"); v != "" {
		cmd = "ROUNDS=" + v + " " + cmd
	}
	p("# farmem vs Linux swap, side by side\n\n")
	if h.preamble != "" {
		// -render: the run's own header, as its report had it; the note says what was redone.
		p("%s\n", h.preamble)
		p("\n%s\n", h.rendered)
	} else {
		p("Command: `%s` (from the repository root, as root), started %s, took %.0f s.\n",
			strings.TrimSpace(cmd), f.started.Format("2006-01-02 15:04 UTC"), f.took.Seconds())
		p("Machine: %d cores (%s), %d GiB, Linux %s; farmem %s; Go %s.\n", runtime.NumCPU(), f.cpu, f.memGiB, f.kernel, f.commit, runtime.Version())
		p("Load average at the start: %s (%s); at the end: %s (%s).\n", f.loadStart, f.busyStart, f.loadEnd, f.busyEnd)
		l0, _ := strconv.ParseFloat(strings.Fields(f.loadStart + " 0")[0], 64)
		l1, _ := strconv.ParseFloat(strings.Fields(f.loadEnd + " 0")[0], 64)
		if max(l0, l1) > float64(runtime.NumCPU())/2 {
			p("\n**This run was not on an idle machine** (1-minute load %.1f at the start and %.1f at the end, on %d cores): other work ran alongside, so absolute numbers are noisy and slower than on an idle machine; the interleaved rounds spread that over every configuration alike, which keeps the ratios more meaningful than the absolute figures.\n", l0, l1, runtime.NumCPU())
		}
		if d := damonPageout(); d != "" {
			p("\n**DAMON proactive reclaim was on** (%s). With no swap it can only drop clean file pages; while a swap run has swap on, it can also page out cold anonymous pages, of the measured program before its cgroup's limit would, and of any other process, whose swap traffic then counts in that run's pswpin/pswpout (the swap rows' MiB in/out); the swap rows' faults are the cgroup's own. It belongs to the machine's setup and was left alone.\n", d)
		}
	}
	p("\nEvery row is the median of the runs that finished, of up to %d rounds", h.rounds)
	if h.rounds < rounds || h.partial {
		p(" (%d were asked for; the run stopped at its time budget, -budget %v", rounds, h.budget)
		if h.partial {
			p(", in round %d, so the configurations after the stop have one run fewer: see the runs column", h.rounds)
		}
		p(")")
	}
	p("; the rounds were interleaved (each round runs every workload in every configuration once), so machine drift hits every configuration alike.\n")
	p("\n## How each configuration runs\n\n")
	p("- **native**: the program alone, no cap.\n")
	p("- **farmem**: `farmem run --local-mem CAP` with the embedded backend (pages kept raw in farmem's memory) and farmem's default prefetcher (streams in map mode, up to 32 pages: leap with a table of sequential walks, since a10cb0f; leap since 0645641; none before); **farmem-none** adds `--prefetch none`: no prefetching, the comparison that says what the prefetcher is worth (`-configs` also takes farmem-leap, -streams, -readahead, -stride, -nextn; **farmem-streams** is `--prefetch streams`: leap with a table of sequential walks beside it). **farmem-tcp / farmem-shm** (when asked for with `-configs`; not in the default run, for time): `farmem run --ctrl` with a ctrl and one memory server on this host, over tcp loopback or shared memory. **farmem-program** (when asked for): `--serve-faults program`, the faults that follow no trend served by a thread farmem starts in the program.\n")
	cg := cgroupWords()
	p("- **swap-zram / swap-file**: the program in a %s memory cgroup (%s) with swap on,", cg.version, cg.limit)
	p(" to `/dev/zram0` (lz4) or to a swap file on the root ext4 disk (a virtio disk: the host may cache it, which flatters the file numbers), set up before and torn down after every run by [workloads/swap/linux-swap.sh](../workloads/swap/linux-swap.sh). Only one swap device is on at a time, and none during the native and farmem runs.\n")
	if slices.ContainsFunc(cfgs, func(c config) bool { return c.kind == "floor" && !c.inproc }) {
		p("- **floor**: `bin/floorpager --local-mem CAP`, a minimal userfaultfd pager in C built the way farmem pages, with no prefetch and FIFO victims (the micro workloads and redis; see \"The floor\" below and [workloads/floor](../workloads/floor/README.md)).\n")
	}
	if slices.ContainsFunc(cfgs, func(c config) bool { return c.inproc }) {
		p("- **floor-inproc**: `bin/floorpager --inproc --local-mem CAP`, the same pager run by a thread of the program itself (its preload shim): faults served and batches moved, copied and dropped without leaving the program's process, the store in shared memory outside the program's anonymous memory. It measures what serving faults from within the program would give, beside the floor of farmem's cross-process design.\n")
	}
	p("- **Caps**: CAP is the given %% of the workload's peak RSS measured in its native run (VmHWM), at least farmem's 16 MiB. farmem caps the program's anonymous memory; a memory cgroup also charges the page cache the program brings in and kernel memory (page tables, socket buffers), so the swap runs' limit is CAP plus the kernel memory the native run's cgroup was charged (%s), the *overhead* column below; page cache gets nothing extra, as the cgroup reclaims it before it swaps anything (a server's binary and libraries were cached and charged before its cgroup existed and are not charged to it). Both therefore hold about CAP of anonymous memory; file-backed pages are outside both caps. At 100 %% both hold the whole native footprint.\n", cg.kmem)
	p("- Guest memory is warmed before every run (one `dd` block of twice the footprint plus 32 MiB): the first touch of guest memory the guest has not used lately is host work, several times a warm page's fault on a VM (docs/DESIGN.md, \"Latency\").\n")
	p("- Every run's data is checked: micro verifies every page it reads (`micro: OK bad=0`), redisdrive every value it reads (`redisdrive: OK`), the checksums of pagerank, numpy matmul, the JVM's HeapGraph and node's objects.js must equal the native run's (matmul also checks its product against a closed form, HeapGraph that every record is where it was put, objects.js that its links form one cycle through every object). A run that fails its check stops the benchmark. A run is stopped at 20x its native time (at least 60 s) (*timed out*); a swap run whose program the cgroup's OOM killer ended (Linux could not hold it at that limit even with swap) is *OOM-killed*. Neither has a throughput: each median is over the runs that finished, and the runs stopped are counted beside it (\"0.96 (1 of 3 OOM-killed)\"), never entered as a zero. A ratio or target whose either side finished in fewer than most of its rounds is *not comparable*.\n")
	p("- Faults: farmem's backend faults (the pages read back; first-touch zero fills are not counted), or the cgroup's major faults (`total_pgmajfault`). MiB in/out: pages read back / written out (farmem: its `--summary-json`'s bytes_in and bytes_out, prefetches included; swap: the `pswpin`/`pswpout` deltas in /proc/vmstat).\n")
	p("\n## Workloads\n\n| workload | command | peak RSS MiB | cgroup overhead MiB | native s | throughput metric |\n|---|---|---|---|---|---|\n")
	for _, w := range wls {
		r := h.refs[w.name]
		c := "`" + strings.Join(w.args, " ") + "`"
		if w.server != "" {
			c = fmt.Sprintf("`%s` driven by `bin/%s --keys %d --ops %d --get-ratio %g` (1000 B values, zipfian 0.99: populate, the zipfian phase, a get of every key)",
				showArgs(serverArgs(w, -1)), driverName(w), w.keys, w.ops, w.getRatio)
		}
		if len(w.args) > 0 && h.runtimeVer[w.args[0]] != "" {
			c += " on " + h.runtimeVer[w.args[0]]
		}
		if w.digest != nil {
			c += " (checksum " + r.checksum + ")"
		}
		if cc, ok := h.cmdCells[w.name]; ok {
			c = cc // -render: the run's
		}
		p("| %s | %s | %d | %.1f | %.2f | %s |\n", w.title, c, r.peakMiB, float64(r.overhead)/(1<<20), r.nativeSec, w.metric)
	}
	p("\n%s\n", footprints(wls, h.refs))

	// Headline: x native per cap, and farmem over swap.
	nat := map[string]stat{}
	for _, w := range wls {
		nat[w.name], _ = summarize(rs, w.name, config{kind: "native"})
	}
	find := func(kind, pf, sw string, pct int) config {
		return config{kind: kind, prefetch: pf, swap: sw, pct: pct}
	}
	p("\n## Headline: throughput x native (medians)\n\n")
	// The floor's columns only in a run that has it (an older run's re-render stays as it was).
	withFloor := slices.ContainsFunc(cfgs, func(c config) bool { return c.kind == "floor" && !c.inproc })
	p("| workload | cap | cap MiB | farmem | farmem-none | swap-zram | swap-file | farmem / swap-zram | farmem / swap-file |")
	if withFloor {
		p(" floor | farmem / floor |")
	}
	p("\n|---|---|---|---|---|---|---|---|---|")
	if withFloor {
		p("---|---|")
	}
	p("\n")
	for _, w := range wls {
		n := nat[w.name]
		for _, pct := range pcts {
			cell := func(c config) string {
				s, ok := summarize(rs, w.name, c)
				if !ok {
					return "-"
				}
				if s.done() == 0 {
					return "none finished (" + s.stopped() + ")"
				}
				v := ratio(s.tput, n.tput)
				if st := s.stopped(); st != "" && !s.comparable() {
					v += " (" + st + "; not comparable)"
				} else if st != "" {
					v += " (" + st + ")"
				}
				return v
			}
			vs := func(sw string) string {
				// farmem as users run it (its default prefetcher)
				a, ok := summarize(rs, w.name, find("farmem", "", "", pct))
				s, ok2 := summarize(rs, w.name, find("swap", "", sw, pct))
				if !ok || !ok2 {
					return "-"
				}
				return versus(a, s)
			}
			p("| %s | %d %% | %d | %s | %s | %s | %s | %s | %s |", w.title, pct, h.capMiB(w, pct), cell(find("farmem", "", "", pct)), cell(find("farmem", "none", "", pct)),
				cell(find("swap", "", "zram", pct)), cell(find("swap", "", "file", pct)), vs("zram"), vs("file"))
			if withFloor {
				fl := config{kind: "floor", pct: pct}
				vf := "-"
				a, ok := summarize(rs, w.name, find("farmem", "", "", pct))
				f, ok2 := summarize(rs, w.name, fl)
				if ok && ok2 {
					vf = versus(a, f)
				}
				p(" %s | %s |", cell(fl), vf)
			}
			p("\n")
		}
	}
	p("\nfarmem / swap: farmem's (default prefetcher) throughput over swap's at the same cap.")
	if withFloor {
		p(" floor: bin/floorpager, a minimal userfaultfd pager, at the same cap (micro only; see \"The floor\" below); farmem / floor: farmem's throughput over the floor's.")
	}
	p("\n")
	h.targets(p, wls, rs, nat)
	ownMemory(p, wls, cfgs, rs)
	for _, w := range wls {
		p("\n![%s](swap-%s.png)\n", w.title, w.name)
	}
	// The prefetcher comparison needs a --prefetch none configuration in this run; without one
	// an old swap-prefetch.png in out would be shown as this run's.
	withNone := slices.ContainsFunc(cfgs, func(c config) bool { return c.kind == "farmem" && c.prefetch == "none" && c.remote == "" })
	if withNone {
		p("\nThe prefetchers side by side: farmem's default's throughput over `--prefetch none`'s at each cap below 100 %% (above the dashed line, the default helped):\n\n![prefetchers](swap-prefetch.png)\n")
	} else {
		p("\nThis run had no `farmem-none` configuration, so it does not compare prefetchers (`-configs farmem,farmem-none,...` does; results/prefetch.md compares them on recorded traces and live runs).\n")
	}

	// Per workload, every configuration.
	latPanels := map[string][]latPanel{}
	for _, w := range wls {
		latPanels[w.name] = latencyPanels(rs, w.name, cfgs)
	}
	for _, w := range wls {
		n := nat[w.name]
		p("\n## %s\n\nNative: %s %s, %.2f s", w.title, fmtTput(n.tput), w.metric, n.wall)
		if w.server != "" {
			p(", request latency p50 %.0f µs / p99 %.0f µs", n.p50, n.p99)
		}
		p(".\n\n| config | cap %% | cap MiB | cgroup limit MiB | throughput | x native | wall s |")
		if w.server != "" {
			p(" p50 µs | p99 µs |")
		}
		p(" faults | MiB in | MiB out | peak MiB | farmem fault service p50/p99 µs | stopped (timeout / OOM-killed) |\n|---|---|---|---|---|---|---|---|---|")
		if w.server != "" {
			p("---|---|")
		}
		p("---|---|---|---|\n")
		for _, c := range append([]config{{kind: "native"}}, cfgs...) {
			s, ok := summarize(rs, w.name, c)
			if !ok {
				continue
			}
			lim := "-"
			if c.kind == "swap" {
				lim = fmt.Sprintf("%.1f", s.limitMiB)
			}
			cp, cm := "-", "-"
			if c.kind != "native" {
				cp, cm = strconv.Itoa(c.pct), strconv.Itoa(s.capMiB)
			}
			// A configuration none of whose runs finished has no figures, only its count.
			f := func(format string, v float64) string {
				if math.IsNaN(v) {
					return "-"
				}
				return fmt.Sprintf(format, v)
			}
			tp := "-"
			if s.done() > 0 {
				tp = fmtTput(s.tput)
			}
			p("| %s | %s | %s | %s | %s | %s | %s |", c.name(), cp, cm, lim, tp, ratio(s.tput, n.tput), f("%.2f", s.wall))
			if w.server != "" {
				p(" %s | %s |", f("%.0f", s.p50), f("%.0f", s.p99))
			}
			fs := "-"
			if c.kind == "farmem" && s.faults > 0 {
				fs = fmt.Sprintf("%.1f / %.0f", s.fsP50, s.fsP99)
			}
			pk := "-"
			if s.peakMiB > 0 {
				pk = fmt.Sprintf("%.1f", s.peakMiB)
			}
			p(" %s | %s | %s | %s | %s | %d / %d of %d |\n", f("%.0f", s.faults), f("%.1f", s.inMiB), f("%.1f", s.outMiB), pk, fs, s.timeouts-s.ooms, s.ooms, s.n)
		}
		srcs := h.latSrcs[w.name]
		for _, lp := range latPanels[w.name] {
			srcs = append(srcs, lp.what)
		}
		if plots && len(srcs) > 0 {
			p("\nThe fault-latency CDF by source (%s): farmem's fault-service time, a line per farmem configuration and cap below 100 %% (colour: configuration; dash: cap), its rounds' histograms summed; n, p50 and p99 in the legend are those of the merged histogram. Swap has no such curve: the kernel gives no per-fault latency.\n\n![%s: fault-latency CDF by source](swap-%s-latency.png)\n",
				strings.Join(srcs, ", "), w.title, w.name)
		}
	}
	p("\n%s\n", peakNote(rs))
	p("\nfarmem fault service: farmem's own summary of its backend faults (reading the fault to the install's return, waits at the cap included), p50/p99 of each run, the median over the rounds in the table; the kernel gives no such figure for a swap-in, so the swap rows have none.\n")
	p("\n**Fault-latency CDF by source** (swap-WORKLOAD-latency.png, under each workload's section): every farmem run writes its whole fault-service distribution with `farmem run --latency-out` (histograms, log-linear buckets, 8 per power of two, so within 12.5 %% in time). Each plot has a panel per fault source that had any faults: *backend* (an evicted page read back from the backend: the faults that page), *zero* (first touch or a discarded page: zero-filled, no backend), *wp* (the first write to a clean page: un-write-protected, no copy), *cache* (a page found in the prefetch cache, cache mode only); up to three panels side by side, four as a 2x2 grid, all on the same latency axis so that the sources compare. In each panel a line per farmem configuration and cap below 100 %% (the rounds' histograms summed), x the latency in µs (log), y the fraction of that source's faults at or below it. The curve is plotted at every non-empty bucket's bounds, where it is exact (the fraction of faults below the bound), and is a straight line across a bucket; the p50/p99 in the legend and the CSV are bucket midpoints, as farmem's summary computes them. The swap configurations have no curve: the kernel gives no per-fault latency for a swap-in (only the cgroup's count of major faults).\n")
	if n := latMissing(rs); n > 0 && h.preamble == "" {
		p("\n%d farmem runs wrote no latency histograms (stopped at their time limit, so killed before farmem's exit; or see the progress log) and are not in the CDFs.\n", n)
	}
	p("\nswap.csv's columns after `oom_killed` are each farmem run's histograms summarized: per source (zero, backend, wp, cache) and for the eviction batches (`lat_eviction_batch_*`: the time to write one batch of evicted pages out), the count and p50/p99/p99.9 in µs; empty for native and swap runs.\n")
	h.floorSection(p, wls, pcts, rs, nat)
	p("\nEvery run is in [swap.csv](swap.csv).\n")
	if err := os.WriteFile(filepath.Join(out, "swap.md"), []byte(b.String()), 0o644); err != nil {
		return err
	}
	if h.preamble == "" { // -render reads the CSV; it never rewrites it
		if err := writeCSV(filepath.Join(out, "swap.csv"), rs); err != nil {
			return err
		}
	}
	if plots {
		if withNone {
			if err := plotPrefetch(filepath.Join(out, "swap-prefetch.png"), wls, pcts, rs, nat); err != nil {
				return fmt.Errorf("prefetch plot: %w", err)
			}
		} else {
			os.Remove(filepath.Join(out, "swap-prefetch.png")) // not this run's
		}
		for _, w := range wls {
			if err := plotWorkload(filepath.Join(out, "swap-"+w.name+".png"), w, cfgs, h.refs[w.name].peakMiB, rs, nat[w.name]); err != nil {
				return fmt.Errorf("plot %s: %w", w.name, err)
			}
			if h.preamble != "" {
				continue // -render: the CSV has no histograms, the run's latency plots stay
			}
			if err := plotLatency(filepath.Join(out, "swap-"+w.name+"-latency.png"), w, latPanels[w.name]); err != nil {
				return fmt.Errorf("latency plot %s: %w", w.name, err)
			}
		}
	}
	fmt.Fprint(os.Stdout, b.String())
	return nil
}

func writeCSV(path string, rs []result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.Write(append(append([]string{"workload", "config", "cap_pct", "cap_mib", "cgroup_limit_bytes", "round", "wall_s", "throughput", "p50_us", "p99_us", "faults", "bytes_in", "bytes_out", "stopped", "farmem_fault_p50_us", "farmem_fault_p99_us", "peak_bytes", "oom_killed", "peak_source", "store_peak_bytes", "farmem_rss_bytes"}, latCSVHeader()...), floorCSVHeader()...))
	for _, r := range rs {
		w.Write(append([]string{r.wl, r.cfg.name(), strconv.Itoa(r.cfg.pct), strconv.Itoa(r.capMiB), strconv.FormatInt(r.limitB, 10), strconv.Itoa(r.round),
			fmt.Sprintf("%.3f", r.wall), csvTput(r.tput), fmt.Sprintf("%.1f", r.p50), fmt.Sprintf("%.1f", r.p99),
			strconv.FormatUint(r.faults, 10), strconv.FormatUint(r.inB, 10), strconv.FormatUint(r.outB, 10), strconv.FormatBool(r.timeout),
			fmt.Sprintf("%.1f", r.fsP50), fmt.Sprintf("%.1f", r.fsP99), strconv.FormatInt(r.peakB, 10), strconv.FormatBool(r.oom), peakSource(r),
			strconv.FormatInt(r.storePeakB, 10), strconv.FormatInt(r.farmemRSSB, 10)}, append(latCSV(r), floorCSV(r)...)...))
	}
	w.Flush()
	if err := w.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// csvTput keeps a throughput's digits: one decimal for rates in the hundreds and up (ops/s,
// pages/s), six significant digits below (GFLOP/s), which one decimal would round by up to 3 %.
func csvTput(v float64) string {
	if v < 100 {
		return strconv.FormatFloat(v, 'g', 6, 64)
	}
	return fmt.Sprintf("%.1f", v)
}

// plotWorkload draws throughput (x native, log scale: swap to a file can be 100x slower) against
// local memory %, a line per configuration and native as the line at 1.
func plotWorkload(path string, w workload, cfgs []config, peakMiB int, rs []result, nat stat) error {
	pl := plot.New()
	pl.Title.Text = w.title + ": throughput vs local memory"
	pl.X.Label.Text = "local memory (the cap), % of the native peak RSS"
	pl.Y.Label.Text = "throughput x native (log)"
	pl.Y.Scale = plot.LogScale{}
	pl.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	pl.Legend.Top = true // above the curves: the room above native's line is left for it
	seen := map[string]bool{}
	lo, hi := 1.0, 1.0
	minX, maxX := 100.0, 0.0
	for i, c0 := range cfgs {
		name := c0.name()
		if seen[name] {
			continue
		}
		seen[name] = true
		var pts plotter.XYs
		for _, c := range cfgs {
			if c.name() != name || c.pct > 100 { // the no-paging run is in the tables, not on the curve
				continue
			}
			s, ok := summarize(rs, w.name, c)
			if !ok || nat.tput <= 0 || !s.comparable() {
				continue // no point where most runs did not finish (the tables say so)
			}
			y := math.Max(s.tput/nat.tput, 1e-3)
			lo, hi = math.Min(lo, y), math.Max(hi, y)
			// The cap actually given (16 MiB at least), not the nominal %.
			x := 100 * float64(s.capMiB) / float64(peakMiB)
			minX, maxX = math.Min(minX, x), math.Max(maxX, x)
			pts = append(pts, plotter.XY{X: x, Y: y})
		}
		if len(pts) == 0 {
			continue
		}
		l, sc, err := plotter.NewLinePoints(pts)
		if err != nil {
			return err
		}
		col, ok := cfgColors[name]
		if !ok {
			col = plotutilColor(i)
		}
		l.Color, sc.Color = col, col
		l.Width = vg.Points(1.5)
		sc.Shape = draw.CircleGlyph{}
		pl.Add(l, sc)
		pl.Legend.Add(name, l, sc)
	}
	nl, err := plotter.NewLine(plotter.XYs{{X: minX, Y: 1}, {X: maxX, Y: 1}})
	if err != nil {
		return err
	}
	nl.Color = color.Black
	nl.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	pl.Add(nl)
	pl.Legend.Add("native", nl)
	pl.Add(plotter.NewGrid())
	pl.Y.Min, pl.Y.Max = lo/1.5, hi*6
	return pl.Save(7*vg.Inch, 4.5*vg.Inch, path)
}

func plotutilColor(i int) color.Color {
	p := []color.Color{color.RGBA{R: 148, G: 103, B: 189, A: 255}, color.RGBA{R: 140, G: 86, B: 75, A: 255}, color.RGBA{R: 127, G: 127, B: 127, A: 255}}
	return p[i%len(p)]
}

// targets reports the target ratios the benchmark is held to, whatever they came to. A target whose either side
// finished in fewer than most of its rounds is "not comparable", never met: a swap run that the
// OOM killer ended has no throughput to be 1.5x of.
func (h *harness) targets(p func(string, ...any), wls []workload, rs []result, nat map[string]stat) {
	met := func(v, target float64) string {
		if v >= target {
			return "met"
		}
		return "**not met**"
	}
	// row prints one target: farmem as users run it (its default prefetcher), not the better
	// of two noisy runs, against the other side b (native or swap).
	row := func(what, title string, a, b stat, target float64) {
		if !a.comparable() || !b.comparable() {
			p("| %s | %s | %s | not comparable |\n", what, title, versus(a, b))
			return
		}
		v := a.tput / b.tput
		note := ""
		for _, s := range []stat{a, b} {
			if st := s.stopped(); st != "" {
				note += fmt.Sprintf(" (%s %s; the median of the runs that finished)", s.cfgName, st)
			}
		}
		p("| %s | %s | %.2fx%s | %s |\n", what, title, v, note, met(v, target))
	}
	p("\n## Issue 6's targets (the ratios reached)\n\n| target | workload | reached | |\n|---|---|---|---|\n")
	for _, w := range wls {
		if w.name != "redis-etc" {
			continue
		}
		n := nat[w.name]
		for _, t := range []struct {
			pct    int
			target float64
		}{{50, 0.9}, {25, 0.7}} {
			if a, ok := summarize(rs, w.name, config{kind: "farmem", pct: t.pct}); ok && n.tput > 0 {
				row(fmt.Sprintf("farmem at %d %% local memory >= %.1fx native", t.pct, t.target), w.title, a, n, t.target)
			}
		}
	}
	for _, w := range wls {
		for _, t := range []struct {
			sw     string
			target float64
		}{{"zram", 1.5}, {"file", 10}} {
			for _, pct := range []int{50, 25} {
				a, ok := summarize(rs, w.name, config{kind: "farmem", pct: pct})
				s, ok2 := summarize(rs, w.name, config{kind: "swap", swap: t.sw, pct: pct})
				if !ok || !ok2 {
					continue
				}
				row(fmt.Sprintf("farmem vs swap-%s at %d %% >= %gx", t.sw, pct, t.target), w.title, a, s, t.target)
			}
		}
	}
	for _, w := range wls {
		for _, r := range rs {
			if r.wl == w.name && r.cfg.kind == "farmem" && r.cfg.prefetch == "" && r.cfg.remote == "" && r.cfg.pct > 100 {
				a, _ := summarize(rs, w.name, r.cfg)
				if n := nat[w.name]; n.tput > 0 {
					row(fmt.Sprintf("no paging (farmem at %d %% of the peak) >= 0.95x native", r.cfg.pct), w.title, a, n, 0.95)
				}
				break
			}
		}
	}
}

// plotPrefetch compares farmem's prefetchers: the default's throughput over none's
// at the same cap, a bar per workload and cap below 100 % (the throughputs x native differ by
// orders of magnitude between workloads, the ratio reads on one axis).
func plotPrefetch(path string, wls []workload, pcts []int, rs []result, nat map[string]stat) error {
	pl := plot.New()
	pl.Title.Text = "farmem's prefetchers: the default's throughput over none's, same cap"
	pl.Y.Label.Text = "throughput, default / none"
	var labels []string
	var gain plotter.Values
	for _, w := range wls {
		n := nat[w.name].tput
		for _, pct := range pcts {
			if pct >= 100 || n <= 0 {
				continue
			}
			a, ok1 := summarize(rs, w.name, config{kind: "farmem", prefetch: "none", pct: pct})
			l, ok2 := summarize(rs, w.name, config{kind: "farmem", pct: pct})
			if !ok1 || !ok2 || !a.comparable() || !l.comparable() {
				continue
			}
			if a.tput <= 0 {
				continue
			}
			labels = append(labels, fmt.Sprintf("%s\n%d %%", w.name, pct))
			gain = append(gain, l.tput/a.tput)
		}
	}
	if len(labels) == 0 {
		return nil
	}
	b, err := plotter.NewBarChart(gain, vg.Points(12))
	if err != nil {
		return err
	}
	b.Color = color.RGBA{R: 44, G: 160, B: 44, A: 255}
	b.LineStyle.Width = 0
	one, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: 1}, {X: float64(len(gain)) - 0.5, Y: 1}})
	if err != nil {
		return err
	}
	one.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	pl.Add(plotter.NewGrid(), b, one)
	pl.Y.Min = 0
	pl.NominalX(labels...)
	pl.X.Tick.Label.Font.Size = vg.Points(7)
	return pl.Save(vg.Length(max(7, len(labels)/2))*vg.Inch, 4.5*vg.Inch, path)
}

// showArgs is a command line for the report: empty arguments quoted, port -1 shown as PORT.
func showArgs(args []string) string {
	var b []string
	for _, a := range args {
		switch a {
		case "":
			a = `""`
		case "-1":
			a = "PORT"
		}
		b = append(b, a)
	}
	return strings.Join(b, " ")
}

// damonPageout describes the running DAMON schemes that page memory out, if any: this VM runs
// one, and it interacts with swap.
func damonPageout() string {
	var found []string
	ks, _ := filepath.Glob("/sys/kernel/mm/damon/admin/kdamonds/*")
	for _, k := range ks {
		if b, _ := os.ReadFile(filepath.Join(k, "state")); strings.TrimSpace(string(b)) != "on" {
			continue
		}
		ss, _ := filepath.Glob(filepath.Join(k, "contexts/*/schemes/*"))
		for _, sc := range ss {
			act, _ := os.ReadFile(filepath.Join(sc, "action"))
			if strings.TrimSpace(string(act)) != "pageout" {
				continue
			}
			ops, _ := os.ReadFile(filepath.Join(sc, "../../operations"))
			age, _ := os.ReadFile(filepath.Join(sc, "access_pattern/age/min"))
			quota, _ := os.ReadFile(filepath.Join(sc, "quotas/bytes"))
			found = append(found, fmt.Sprintf("kdamond %s: %s, pageout of regions idle for at least %s aggregation intervals, quota %s bytes",
				filepath.Base(k), strings.TrimSpace(string(ops)), strings.TrimSpace(string(age)), strings.TrimSpace(string(quota))))
		}
	}
	return strings.Join(found, "; ")
}

// footprints says how large the workloads were, from their native peaks, whatever -scale made
// them.
func footprints(wls []workload, refs map[string]*ref) string {
	lo, hi := math.MaxInt, 0
	for _, w := range wls {
		if r := refs[w.name]; r != nil {
			lo, hi = min(lo, r.peakMiB), max(hi, r.peakMiB)
		}
	}
	if hi == 0 {
		return "The workloads' peaks were not measured."
	}
	span := fmt.Sprintf("%d MiB", hi)
	if lo != hi {
		span = fmt.Sprintf("%d-%d MiB", lo, hi)
	}
	if hi < 1024 {
		return "The footprints are small (native peaks " + span + ", not GiB): with 4 caps x 4 configurations plus native and no-paging, 3 rounds, and paging runs 10-100x slower than native, GiB-scale runs do not fit this machine's ~25-minute budget. Larger runs: `-scale` (`make bench-swap FLAGS=\"-scale 8\"`)."
	}
	return "The footprints are the native peaks in the workloads table: " + span + "."
}

// peakNote says how each side's peak was measured (not alike), and names every farmem run whose
// own peak went above its cap.
// peakSource names how a run's peak_bytes was measured: "cgroup" (the kernel's maximum charge of
// the program's memory cgroup) or "sampled" (farmem's own sampling of the anonymous RSS).
func peakSource(r result) string {
	if r.peakCgroup {
		return "cgroup"
	}
	return "sampled"
}

// peakNote says how each side's peak was measured and which farmem runs' peak exceeded what
// Linux swap's cgroup was allowed at the same cap (its limit: the cap plus the kernel memory the
// native run was charged), or the cap itself where there is no swap run to compare with.
func peakNote(rs []result) string {
	var s string
	sampled := slices.ContainsFunc(rs, func(r result) bool { return r.cfg.kind == "farmem" && !r.peakCgroup && r.peakB > 0 })
	if slices.ContainsFunc(rs, func(r result) bool { return r.cfg.kind == "floor" && r.peakB > 0 }) {
		s = "The floor's peak MiB is the program's anonymous RSS (RssAnon) as floorpager read it after each batch: what floorpager does not register (glibc's brk heap, thread stacks) is neither paged nor capped by it, so a floor run may hold more than its cap by that much. "
	}
	if sampled {
		s += "Peak MiB is measured differently on the two sides in some rows (the CSV's peak_source says which). Where farmem's is \"sampled\", it is the program's peak anonymous RSS as farmem's own sampling of it saw it (its summary's `peak anonymous RSS`, or `peak_anon_bytes` in its `--summary-json`: samples, so a peak between two of them is missed, and whole MiB). Swap's, and farmem's where it is \"cgroup\", is the kernel's exact maximum of the program's memory cgroup's charge (" + cgroupWords().peak + "), which counts page cache and kernel memory too."
	} else {
		s += "Peak MiB is the kernel's exact maximum of the program's memory cgroup's charge (" + cgroupWords().peak + ") on both sides: anonymous memory, page cache and kernel memory. farmem's cap holds only anonymous memory, so its peak may exceed the cap by the rest; the swap runs' cgroup limit is the cap plus the kernel memory the native run was charged."
	}
	limit := map[string]int64{}
	for _, r := range rs {
		if r.cfg.kind == "swap" && r.limitB > 0 {
			limit[fmt.Sprintf("%s/%d", r.wl, r.cfg.pct)] = r.limitB
		}
	}
	var over []string
	for _, r := range rs {
		if r.cfg.kind != "farmem" || r.capMiB <= 0 || r.peakB <= 0 {
			continue
		}
		bound, what := int64(r.capMiB)<<20, "cap"
		if l, ok := limit[fmt.Sprintf("%s/%d", r.wl, r.cfg.pct)]; ok && r.peakCgroup {
			bound, what = l, "swap's limit"
		}
		if r.peakB > bound {
			over = append(over, fmt.Sprintf("%s %s at %d %% round %d (%s peak %.1f MiB, %s %.1f MiB)", r.wl, r.cfg.name(), r.cfg.pct, r.round,
				peakSource(r), float64(r.peakB)/(1<<20), what, float64(bound)/(1<<20)))
		}
	}
	if len(over) == 0 {
		return s + " No farmem run's peak exceeded swap's limit at the same cap (or the cap, where it was sampled)."
	}
	return s + fmt.Sprintf(" %d farmem runs' peak exceeded swap's limit at the same cap (or the cap, where it was sampled): %s.", len(over), strings.Join(over, "; "))
}

// cgroupWordsT names the memory cgroup files the swap runs used, by cgroup version.
type cgroupWordsT struct{ version, limit, kmem, peak string }

// cgroupWords says which cgroup version linux-swap.sh runs on here (v2 where /sys/fs/cgroup is
// a cgroup2 mount, as the script decides) and what its limit and kernel-memory figures are.
func cgroupWords() cgroupWordsT {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return cgroupWordsT{"cgroup v2", "`memory.max`, `memory.swap.max` unbounded; the system's swappiness",
			"v2 keeps no kernel-memory peak: what the native run's cgroup was charged beyond its anonymous peak, less its file-backed RSS", "`memory.peak`"}
	}
	return cgroupWordsT{"cgroup v1", "`memory.limit_in_bytes`, swappiness 60", "`memory.kmem.max_usage_in_bytes`: page tables, slab", "`memory.max_usage_in_bytes`"}
}
