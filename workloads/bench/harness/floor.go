package main

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// The floor configuration: the workload under bin/floorpager (workloads/floor), a minimal C
// userfaultfd pager built the way farmem pages, at the same cap. It runs the micro workloads
// and redis (single-threaded, and it never forks with saving off: floorpager refuses fork and
// mremap rather than serve them wrong). Its exit line's key=value pairs go into result.floor, and the report's "The floor"
// section sets farmem's throughput and stages against it.

var floorBin = "bin/floorpager"

// floorKeys are the floorpager line's keys the CSV keeps (as floor_KEY columns), in order.
var floorKeys = []string{"refaults", "evicted", "batches", "pages_per_batch", "runs_per_batch", "pages_per_sec", "bound_pages_per_sec",
	"fault_ns", "fault_p50_ns", "install_ns", "wake_ns", "evict_ns_page", "move_ns_page", "move_agent_ns_page",
	"readv_ns_page", "store_ns_page", "drop_ns_page", "drop_agent_ns_batch", "flush_est_ns", "peak_anon_kib"}

// floorRuns reports whether the floor configuration runs workload w (a micro walk or redis).
func floorRuns(w workload) bool { return strings.HasPrefix(w.name, "micro") || w.server == "redis" }

// parseFloor reads floorpager's exit line: every key=number pair on the line that starts
// "floorpager: cap_pages=". nil if there is none (it was killed, or is not floorpager's output).
func parseFloor(out string) map[string]float64 {
	line := regexp.MustCompile(`(?m)^floorpager: cap_pages=.*$`).FindString(out)
	if line == "" {
		return nil
	}
	m := map[string]float64{}
	for _, kv := range regexp.MustCompile(`(\w+)=([0-9.eE+-]+)`).FindAllStringSubmatch(line, -1) {
		if v, err := strconv.ParseFloat(kv[2], 64); err == nil {
			m[kv[1]] = v
		}
	}
	return m
}

// farmemStages is what farmem's --summary-json says of its eviction batches: how many, their mean
// pages, and the mean time a batch spent in each stage (evictor.StageNames, in order), in ns.
type farmemStages struct {
	batches, pages float64
	stage          [len(stageNames)]float64
}

// stageNames are farmem's eviction stages as its summary names them (evictor.StageNames).
var stageNames = [...]string{"move", "write-protect", "copy out", "store", "drop", "wake"}

// perPage is a stage's mean per page evicted, in ns.
func (s farmemStages) perPage(i int) float64 {
	if s.pages <= 0 {
		return math.NaN()
	}
	return s.stage[i] / s.pages
}

// microWork is the page accesses a micro workload's passes make (what its pages/s counts).
func microWork(w workload) float64 {
	mib, passes := 0.0, 0.0
	for i := 0; i+1 < len(w.args); i++ {
		switch w.args[i] {
		case "--mib":
			mib, _ = strconv.ParseFloat(w.args[i+1], 64)
		case "--passes":
			passes, _ = strconv.ParseFloat(w.args[i+1], 64)
		}
	}
	return mib * 256 * passes
}

// slowdownPerPageIn is the time a run's passes took beyond native's, per page brought back in
// (ns): what each page read back cost the program, everything included (the fault, the
// eviction it drove, the switches). work is the accesses its throughput counts.
func slowdownPerPageIn(tput, nativeTput, work float64, pagesIn uint64) float64 {
	if tput <= 0 || nativeTput <= 0 || pagesIn == 0 || work <= 0 {
		return math.NaN()
	}
	return (work/tput - work/nativeTput) * 1e9 / float64(pagesIn)
}

// cpuPerPage is the run's CPU time (system, or user+system: every process of the run, the
// pager's too) per page moved either way, in ns.
func cpuPerPage(secs float64, in, out uint64) float64 {
	if in+out == 0 || secs <= 0 {
		return math.NaN()
	}
	return secs * 1e9 / float64(in+out)
}

// medianOf is the median of f over the finished runs of wl in configuration c.
func medianOf(rs []result, wl string, c config, f func(result) float64) float64 {
	var v []float64
	for _, r := range rs {
		if r.wl == wl && r.cfg == c && !r.timeout && !r.oom {
			if x := f(r); !math.IsNaN(x) {
				v = append(v, x)
			}
		}
	}
	return median(v)
}

// nsAsUs prints ns as µs: two decimals below 10 µs, one below 100.
func nsAsUs(ns float64) string {
	switch {
	case math.IsNaN(ns):
		return "-"
	case ns < 10e3:
		return fmt.Sprintf("%.2f", ns/1e3)
	case ns < 100e3:
		return fmt.Sprintf("%.1f", ns/1e3)
	}
	return fmt.Sprintf("%.0f", ns/1e3)
}

func times(a, b float64) string {
	if math.IsNaN(a) || math.IsNaN(b) || b <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.1fx", a/b)
}

// floorSection writes "The floor": per micro workload and cap, farmem's throughput as a
// multiple of the floor's (and of its pages/s paged), each farmem stage per page against the
// floor's same part, and what Linux swap to zram costs per page beside both.
func (h *harness) floorSection(p func(string, ...any), wls []workload, pcts []int, rs []result, nat map[string]stat) {
	has := false
	for _, r := range rs {
		if r.cfg.kind == "floor" {
			has = true
		}
	}
	if !has {
		return
	}
	fl := func(pct int) config { return config{kind: "floor", pct: pct} }
	fm := func(pct int) config { return config{kind: "farmem", pct: pct} }
	zr := func(pct int) config { return config{kind: "swap", swap: "zram", pct: pct} }
	key := func(k string) func(result) float64 {
		return func(r result) float64 {
			if v, ok := r.floor[k]; ok {
				return v
			}
			return math.NaN()
		}
	}
	p("\n## The floor\n\n")
	p("**floor** is [bin/floorpager](../workloads/floor/README.md) at the same cap: a minimal pager in C built the way farmem pages (the uffd made in the program by a preload shim and sent over a unix socket, with farmem's features; the mappings registered MISSING|WP from the pager; faults served by one thread on the program's CPU; eviction in batches of up to 256 of the oldest pages, moved out by the shim's agent thread with UFFDIO_MOVE into a staging area, read with process_vm_readv, copied into a plain array of slots, the staging area dropped by the agent), with nothing else: no prefetch, no dirty tracking, FIFO. It runs the micro workloads and redis (single-threaded, no fork with saving off), and is verified as every run is (micro checks every page, redisdrive every value). What it sustains is the most a userfaultfd pager of this design does on this machine; farmem's figures as multiples of it say how far farmem is from that floor, stage by stage.\n")
	p("\n| workload | cap | floor throughput | floor x native | floor's peak anonymous MiB (cap MiB) | farmem throughput | farmem / floor | floor faults served /s | farmem-none / floor |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, w := range wls {
		if !floorRuns(w) {
			continue
		}
		for _, pct := range pcts {
			f, ok := summarize(rs, w.name, fl(pct))
			if !ok {
				continue
			}
			a, _ := summarize(rs, w.name, fm(pct))
			none, _ := summarize(rs, w.name, config{kind: "farmem", prefetch: "none", pct: pct})
			cell := func(s stat) string {
				if s.n == 0 || s.done() == 0 {
					return "-"
				}
				return fmtTput(s.tput)
			}
			vs := func(s stat) string {
				if s.n == 0 {
					return "-"
				}
				return versus(s, f)
			}
			xNative := "-"
			if n := nat[w.name]; n.tput > 0 && f.done() > 0 {
				xNative = fmt.Sprintf("%.2f", f.tput/n.tput)
			}
			peak := "-"
			if kib := medianOf(rs, w.name, fl(pct), key("peak_anon_kib")); kib > 0 {
				peak = fmt.Sprintf("%.1f (%d)", kib/1024, capMiBOf(rs, w.name, fl(pct)))
			}
			p("| %s | %d %% | %s | %s | %s | %s | %s | %s | %s |\n", w.title, pct, cell(f), xNative, peak, cell(a), vs(a), fmtTput(medianOf(rs, w.name, fl(pct), key("pages_per_sec"))), vs(none))
		}
	}
	p("\nThroughput is the workload's (%s, medians). *floor's peak anonymous MiB* is the program's RssAnon as floorpager read it after each batch: what floorpager does not register (glibc's brk heap, thread stacks) it neither pages nor caps, so the floor may hold that much more than the cap (farmem pages and caps it). *floor faults served /s* is floorpager's own count: faults served (first touches and pages read back) per second from its first eviction to the program's exit; in steady state each also evicts a page.\n", wls[0].metric)

	p("\n**Each part, per page** (µs, medians over the rounds; farmem's stage means come from its --summary-json: the time its batches spent in each stage over the pages they evicted):\n\n")
	p("| workload | cap | part | floor µs | farmem µs | farmem / floor |\n|---|---|---|---|---|---|\n")
	for _, w := range wls {
		if !floorRuns(w) {
			continue
		}
		for _, pct := range pcts {
			if _, ok := summarize(rs, w.name, fl(pct)); !ok {
				continue
			}
			st := func(i int) float64 {
				return medianOf(rs, w.name, fm(pct), func(r result) float64 {
					if r.stages.batches == 0 {
						return math.NaN()
					}
					return r.stages.perPage(i)
				})
			}
			allStages := medianOf(rs, w.name, fm(pct), func(r result) float64 {
				if r.stages.batches == 0 {
					return math.NaN()
				}
				t := 0.0
				for i := range stageNames {
					t += r.stages.perPage(i)
				}
				return t
			})
			fault := medianOf(rs, w.name, fl(pct), func(r result) float64 { return r.floor["fault_p50_ns"] + r.floor["wake_ns"] })
			fmFault := medianOf(rs, w.name, fm(pct), func(r result) float64 {
				if r.fsP50 <= 0 {
					return math.NaN()
				}
				return r.fsP50 * 1e3
			})
			row := func(part string, a, b float64) {
				p("| %s | %d %% | %s | %s | %s | %s |\n", w.title, pct, part, nsAsUs(a), nsAsUs(b), times(b, a))
			}
			row("fault round trip, p50: read to the install's return, the wake included", fault, fmFault)
			row("install (UFFDIO_COPY of a page read back)", medianOf(rs, w.name, fl(pct), key("install_ns")), math.NaN())
			row("move (the agent's UFFDIO_MOVE, request to reply)", medianOf(rs, w.name, fl(pct), key("move_ns_page")), st(0))
			row("copy out (process_vm_readv)", medianOf(rs, w.name, fl(pct), key("readv_ns_page")), st(2))
			row("store", medianOf(rs, w.name, fl(pct), key("store_ns_page")), st(3))
			row("drop (the agent's madvise of the staging area)", medianOf(rs, w.name, fl(pct), key("drop_ns_page")), st(4))
			row("write-protect + wake (the drop way; the floor moves every page)", 0, st(1)+st(5))
			row("eviction, the whole batch", medianOf(rs, w.name, fl(pct), key("evict_ns_page")), allStages)
		}
	}
	p("\nThe floor's fault round trip is its handler's median (`read` returning to the install's return) plus its mean `UFFDIO_WAKE`: the floor installs without waking and wakes apart, because on one CPU the woken thread preempts the pager inside the ioctl that wakes it and runs until it blocks again (its next fault), so the wake holds the switch to the program and its next stretch of work. farmem installs and wakes in one ioctl and its fault service (its --summary-json's backend p50) holds the same; the two are alike, not identical (a median against a median plus a mean), and the program's own work between faults is in both. The floor's install alone is `install_ns` (farmem gives no such figure). Inside the floor's parts: each page UFFDIO_MOVE moves clears its PTE and flushes that page from the TLB (floorpager's `move_agent_ns_page` is the ioctls alone, timed in the agent), and the drop flushes the staging range once; no counter in this kernel counts flushes, and floorpager's `flush_est_ns` (in the CSV: one PTE change and its local single-page flush, estimated by difference of mprotect flips; noisy) bounds what the flushes of a move can be. farmem's \"drop\" includes its page-table commit; its write-protect and wake stages are the drop way's, which the floor never takes.\n")

	p("\n**Faults that waited** (farmem's --summary-json, medians over the rounds): how many of farmem's faults could not be served when first read, by why (*room*: at the cap, waiting for the evictor to make room; *busy*: their page in an eviction batch or being read; *event*: behind an unread layout event), and the share of all its faults' service time (fault read to page installed) that went to them. The floor evicts on its fault thread and has no such wait.\n\n")
	p("| workload | cap | config | room | busy | event | share of fault service time |\n|---|---|---|---|---|---|---|\n")
	for _, w := range wls {
		if !floorRuns(w) {
			continue
		}
		for _, pct := range pcts {
			for _, c := range []config{fm(pct), {kind: "farmem", prefetch: "none", pct: pct}} {
				if _, ok := summarize(rs, w.name, c); !ok {
					continue
				}
				count := func(i int) string {
					return fmt.Sprintf("%.0f", medianOf(rs, w.name, c, func(r result) float64 { return r.held[i] }))
				}
				share := medianOf(rs, w.name, c, func(r result) float64 {
					if r.faultNs <= 0 {
						return math.NaN()
					}
					return r.heldNs / r.faultNs
				})
				cell := "-"
				if !math.IsNaN(share) {
					cell = fmt.Sprintf("%.1f %%", 100*share)
				}
				p("| %s | %d %% | %s | %s | %s | %s | %s |\n", w.title, pct, c.name(), count(0), count(1), count(2), cell)
			}
		}
	}

	// Linux swap to zram beside both: per page in, the program's slowdown; per page moved, CPU.
	p("\n**Per page moved, all three** (medians): *slowdown per page in* is the passes' time beyond native's divided by the pages brought back in (farmem: its --summary-json's bytes_in, prefetches included; floor: its refaults; swap: the `pswpin` delta of /proc/vmstat), everything one page read back costs the program, its eviction's share included. *sys µs per page moved* is the run's system CPU time (wait4's rusage: every process of the run, the pager's and farmem's too, and for swap the direct reclaim and the zram compression done in the program's context) over pages in + out (pswpin + pswpout for swap). The kernel does not split swap's system time between swap-in and reclaim, nor count kswapd's time against the run (a cgroup's limit is reclaimed directly by the task that charges it, so kswapd should do little here); *user+sys* adds the user time (farmem's Go runtime, the floor's pager, the program itself).\n\n")
	p("| workload | cap | config | pages in | pages out | major faults | slowdown µs per page in | sys µs per page moved | user+sys µs per page moved |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, w := range wls {
		if !floorRuns(w) {
			continue
		}
		work := microWork(w)
		for _, pct := range pcts {
			if _, ok := summarize(rs, w.name, fl(pct)); !ok {
				continue
			}
			for _, c := range []config{fl(pct), fm(pct), zr(pct)} {
				if s, ok := summarize(rs, w.name, c); !ok || s.done() == 0 {
					continue
				}
				in := medianOf(rs, w.name, c, func(r result) float64 { return float64(r.inB / 4096) })
				out := medianOf(rs, w.name, c, func(r result) float64 { return float64(r.outB / 4096) })
				mf := medianOf(rs, w.name, c, func(r result) float64 {
					if c.kind == "swap" {
						return float64(r.faults)
					}
					return math.NaN()
				})
				slow := medianOf(rs, w.name, c, func(r result) float64 {
					return slowdownPerPageIn(r.tput, nat[w.name].tput, work, r.inB/4096)
				})
				sys := medianOf(rs, w.name, c, func(r result) float64 { return cpuPerPage(r.sysS, r.inB/4096, r.outB/4096) })
				cpu := medianOf(rs, w.name, c, func(r result) float64 { return cpuPerPage(r.sysS+r.userS, r.inB/4096, r.outB/4096) })
				mfs := "-"
				if !math.IsNaN(mf) {
					mfs = fmt.Sprintf("%.0f", mf)
				}
				p("| %s | %d %% | %s | %.0f | %.0f | %s | %s | %s | %s |\n", w.title, pct, c.name(), in, out, mfs, nsAsUs(slow), nsAsUs(sys), nsAsUs(cpu))
			}
		}
	}
	p("\nMajor faults: the swap cgroup's `pgmajfault` (the CSV also has the /proc/vmstat delta, `vm_pgmajfault`, which counts every process).\n")
}

// floorCSVHeader and floorCSV are the CSV's columns after the latency ones: each run's CPU
// time and /proc/vmstat major faults, farmem's eviction stages (mean ns a batch), and the
// floor's line (floor_KEY, as floorpager printed it); empty where a run has none.
func floorCSVHeader() []string {
	r := []string{"user_s", "sys_s", "vm_pgmajfault", "farmem_batches", "farmem_batch_pages"}
	for _, n := range stageNames {
		r = append(r, stageColumn(n))
	}
	for _, k := range floorKeys {
		r = append(r, "floor_"+k)
	}
	for _, why := range heldReasons {
		r = append(r, "farmem_held_"+why)
	}
	return append(r, "farmem_held_ns", "farmem_fault_ns")
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

func floorCSV(r result) []string {
	out := []string{num(r.userS), num(r.sysS), strconv.FormatUint(r.vmMajflt, 10)}
	if r.stages.batches > 0 {
		out = append(out, num(r.stages.batches), num(r.stages.pages))
		for _, v := range r.stages.stage {
			out = append(out, num(v))
		}
	} else {
		out = append(out, make([]string, 2+len(stageNames))...)
	}
	for _, k := range floorKeys {
		if v, ok := r.floor[k]; ok {
			out = append(out, num(v))
		} else {
			out = append(out, "")
		}
	}
	for _, v := range r.held {
		out = append(out, num(v))
	}
	return append(out, num(r.heldNs), num(r.faultNs))
}

// readFloorCSV fills r's floorCSV fields from a row, where the CSV has them (a run's CSV from
// before them has none: left zero).
func readFloorCSV(r *result, col map[string]int, row []string) error {
	get := func(k string) (float64, bool, error) {
		i, ok := col[k]
		if !ok || i >= len(row) || row[i] == "" {
			return 0, false, nil
		}
		v, err := strconv.ParseFloat(row[i], 64)
		return v, err == nil, err
	}
	var errs []error
	f := func(k string) float64 {
		v, _, err := get(k)
		errs = append(errs, err)
		return v
	}
	r.userS, r.sysS, r.vmMajflt = f("user_s"), f("sys_s"), uint64(f("vm_pgmajfault"))
	r.stages.batches, r.stages.pages = f("farmem_batches"), f("farmem_batch_pages")
	for i, n := range stageNames {
		r.stages.stage[i] = f(stageColumn(n))
	}
	for i, why := range heldReasons {
		r.held[i] = f("farmem_held_" + why)
	}
	r.heldNs, r.faultNs = f("farmem_held_ns"), f("farmem_fault_ns")
	for _, k := range floorKeys {
		v, ok, err := get("floor_" + k)
		errs = append(errs, err)
		if ok {
			if r.floor == nil {
				r.floor = map[string]float64{}
			}
			r.floor[k] = v
		}
	}
	return errors.Join(errs...)
}

// stageColumn is the CSV column of one of farmem's stages: farmem_stage_write_protect_ns.
func stageColumn(name string) string {
	return "farmem_stage_" + strings.NewReplacer(" ", "_", "-", "_").Replace(name) + "_ns"
}

// capMiBOf is the cap of wl's runs in configuration c (0 if none ran).
func capMiBOf(rs []result, wl string, c config) int {
	for _, r := range rs {
		if r.wl == wl && r.cfg == c {
			return r.capMiB
		}
	}
	return 0
}
