package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// render re-makes a run's report (swap.md and the throughput plots, in the CSV's directory)
// from the per-run rows of its swap.csv, without running anything: what -render CSV does, so
// that a change in how the rows are summarized reaches the committed tables. From the swap.md
// the run wrote beside the CSV it keeps only what the CSV does not hold: the header (command,
// machine, load) and the native reference of each workload (its peak, cgroup overhead, native
// time and checksum, from the workloads table). Every figure in the tables comes from the
// CSV. The fault-latency plots are left as the run drew them: the CSV keeps only their
// quantiles, not the histograms.
func (h *harness) render(csvPath string, plots bool) error {
	dir := filepath.Dir(csvPath)
	rs, latSrcs, err := readResults(csvPath)
	if err != nil {
		return err
	}
	if len(rs) == 0 {
		return fmt.Errorf("%s has no runs", csvPath)
	}
	md, err := os.ReadFile(filepath.Join(dir, "swap.md"))
	if err != nil {
		return fmt.Errorf("the run's swap.md (its header and native references): %w", err)
	}
	pre, cmdline, err := preamble(string(md))
	if err != nil {
		return err
	}
	scale, rounds := 1.0, 3
	if m := regexp.MustCompile(`-scale ([0-9.]+)`).FindStringSubmatch(cmdline); m != nil {
		scale, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := regexp.MustCompile(`(?:-rounds |ROUNDS=)(\d+)`).FindStringSubmatch(cmdline); m != nil {
		rounds, _ = strconv.Atoi(m[1])
	}

	// Workloads and configurations in the order the run ran them: its first round ran every
	// configuration once, in order.
	var names []string
	var cfgs []config
	var pcts []int
	for _, r := range rs {
		if !slices.Contains(names, r.wl) {
			names = append(names, r.wl)
		}
		h.rounds = max(h.rounds, r.round)
		// The first round ran every configuration; the first workload each of them but the
		// floor's, which runs on micro only: taken where it first appears.
		if r.round != rs[0].round || r.cfg.kind == "native" || slices.Contains(cfgs, r.cfg) {
			continue
		}
		cfgs = append(cfgs, r.cfg)
		if r.cfg.pct <= 100 && !slices.Contains(pcts, r.cfg.pct) {
			pcts = append(pcts, r.cfg.pct)
		}
	}
	wls, err := workloads(names, scale)
	if err != nil {
		return err
	}
	h.cmdCells = map[string]string{}
	if err := h.nativeRefs(string(md), wls); err != nil {
		return err
	}
	h.latSrcs = map[string][]string{}
	for _, w := range wls {
		if _, err := os.Stat(filepath.Join(dir, "swap-"+w.name+"-latency.png")); err == nil {
			h.latSrcs[w.name] = latSrcs[w.name]
		}
	}
	rel := csvPath
	if wd, err := os.Getwd(); err == nil {
		if r, err := filepath.Rel(wd, csvPath); err == nil {
			rel = r
		}
	}
	h.preamble = pre
	stopped := 0
	for _, r := range rs {
		if r.timeout || r.oom {
			stopped++
		}
	}
	why := "This run had no stopped run, so its medians are as they were. "
	if stopped > 0 {
		why = fmt.Sprintf("Why: the run's report entered its %d OOM-killed or timed-out runs as throughput 0 in its medians, which pulled a median down (flattering farmem against swap) and called a target met against a side none of whose runs finished. "+
			"Now each median is over the runs that finished, the stopped runs are counted beside it, and a ratio whose either side finished in fewer than most of its rounds is *not comparable*. ", stopped)
	}
	h.rendered = fmt.Sprintf("**Re-rendered** on %s by `bin/farmem-bench -render %s` at %s from the per-run rows of [swap.csv](swap.csv) as the run wrote them: nothing was re-run, and the header above and the workloads table are the run's. "+
		"%sThe sentence on the footprints now comes from the measured peaks (it said \"about 64 MiB\" at any scale), and the note under the tables says how each side's peak was measured. "+
		"The throughput plots are redrawn from the same medians; the fault-latency plots are the run's (the CSV keeps their quantiles, not the histograms). "+
		"The CSV's rows are rounded (throughput and latencies to one decimal, wall time to the ms), so a figure may differ from the run's report in its last digit, and a ratio of small rates (GFLOP/s) by a few hundredths.",
		time.Now().UTC().Format("2006-01-02"), rel, headCommit(), why)
	return h.report(dir, wls, cfgs, pcts, rounds, rs, nil, plots)
}

// headCommit names the commit the harness is built from (HEAD here), for the render note.
func headCommit() string {
	out, err := exec.Command("git", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "an unknown commit"
	}
	c := "commit " + strings.TrimSpace(string(out))
	// The harness's own code: a report re-rendered a moment ago does not make it another.
	if out, _ := exec.Command("git", "status", "--porcelain", "--untracked-files=no", "--", ":/workloads/bench/harness").Output(); len(out) > 0 {
		c += " with uncommitted changes"
	}
	return c
}

// preamble is the run's header in its swap.md: what follows the title up to the line on the
// medians (a note of an earlier -render dropped), and the command line in it.
func preamble(md string) (string, string, error) {
	_, rest, ok := strings.Cut(md, "\n")
	end := strings.Index(rest, "\nEvery row is the median")
	if !ok || end < 0 {
		return "", "", errors.New("swap.md: no header (the title, then up to \"Every row is the median\")")
	}
	var keep []string
	for _, para := range strings.Split(strings.TrimSpace(rest[:end]), "\n\n") {
		if !strings.HasPrefix(para, "**Re-rendered**") {
			keep = append(keep, para)
		}
	}
	pre := strings.Join(keep, "\n\n")
	m := regexp.MustCompile("(?m)^Command: `([^`]*)`").FindStringSubmatch(pre)
	if m == nil {
		return "", "", errors.New("swap.md: no Command: line in its header")
	}
	return pre, m[1], nil
}

// nativeRefs reads each workload's native reference from the run's workloads table.
func (h *harness) nativeRefs(md string, wls []workload) error {
	for _, w := range wls {
		var row []string
		for _, l := range strings.Split(md, "\n") {
			if strings.HasPrefix(l, "| "+w.title+" | ") {
				row = strings.Split(strings.Trim(l, "| "), " | ")
				break
			}
		}
		if len(row) != 6 {
			return fmt.Errorf("swap.md: no row for %q in its workloads table", w.title)
		}
		r := &ref{}
		var err1, err2, err3 error
		r.peakMiB, err1 = strconv.Atoi(row[2])
		ov, err2 := strconv.ParseFloat(row[3], 64)
		r.nativeSec, err3 = strconv.ParseFloat(row[4], 64)
		if err := errors.Join(err1, err2, err3); err != nil {
			return fmt.Errorf("swap.md: the workloads table's row for %q: %w", w.title, err)
		}
		r.overhead = int64(ov * (1 << 20))
		if m := regexp.MustCompile(`\(checksum ([^)]+)\)$`).FindStringSubmatch(row[1]); m != nil {
			r.checksum = m[1]
		}
		h.refs[w.name] = r
		// The command as the run gave it, not as this harness would: the workload's size or
		// mix may have changed since (redis's zipfian phase was one operation a key before e510a83).
		h.cmdCells[w.name] = row[1]
	}
	return nil
}

// readResults reads the rows writeCSV wrote (by column name), and for each workload the fault
// sources any farmem run below 100 % had faults of (as the latency plots show them).
func readResults(path string) ([]result, map[string][]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(rows) == 0 {
		return nil, nil, fmt.Errorf("%s is empty", path)
	}
	col := map[string]int{}
	for i, k := range rows[0] {
		col[k] = i
	}
	for _, k := range []string{"workload", "config", "cap_pct", "cap_mib", "cgroup_limit_bytes", "round", "wall_s", "throughput", "p50_us", "p99_us",
		"faults", "bytes_in", "bytes_out", "stopped", "farmem_fault_p50_us", "farmem_fault_p99_us", "peak_bytes", "oom_killed"} {
		if _, ok := col[k]; !ok {
			return nil, nil, fmt.Errorf("%s: no column %s", path, k)
		}
	}
	var rs []result
	srcs := map[string][]string{}
	for n, row := range rows[1:] {
		var errs []error
		get := func(k string) string { return row[col[k]] }
		num := func(k string) float64 {
			v, err := strconv.ParseFloat(get(k), 64)
			errs = append(errs, err)
			return v
		}
		flag := func(k string) bool {
			v, err := strconv.ParseBool(get(k))
			errs = append(errs, err)
			return v
		}
		pct := int(num("cap_pct"))
		var c config
		if get("config") == "native" {
			c = config{kind: "native"}
		} else {
			cs, _, err := configs([]string{get("config")}, []string{strconv.Itoa(pct)})
			if err != nil {
				return nil, nil, fmt.Errorf("%s line %d: %w", path, n+2, err)
			}
			c = cs[0]
		}
		r := result{wl: get("workload"), cfg: c, round: int(num("round")), capMiB: int(num("cap_mib")), limitB: int64(num("cgroup_limit_bytes")),
			wall: num("wall_s"), tput: num("throughput"), p50: num("p50_us"), p99: num("p99_us"), faults: uint64(num("faults")),
			inB: uint64(num("bytes_in")), outB: uint64(num("bytes_out")), timeout: flag("stopped"), fsP50: num("farmem_fault_p50_us"),
			fsP99: num("farmem_fault_p99_us"), peakB: int64(num("peak_bytes")), oom: flag("oom_killed")}
		// Runs before the peak_source column: swap's peak was the cgroup's, farmem's sampled.
		r.peakCgroup = c.kind == "swap"
		if i, ok := col["peak_source"]; ok && i < len(row) {
			r.peakCgroup = row[i] == "cgroup"
		}
		// Runs before these columns have no figures: ownMemory leaves them out.
		for k, v := range map[string]*int64{"store_peak_bytes": &r.storePeakB, "farmem_rss_bytes": &r.farmemRSSB} {
			if i, ok := col[k]; ok && i < len(row) {
				*v, _ = strconv.ParseInt(row[i], 10, 64)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, nil, fmt.Errorf("%s line %d: %w", path, n+2, err)
		}
		if err := readFloorCSV(&r, col, row); err != nil {
			return nil, nil, fmt.Errorf("%s line %d: %w", path, n+2, err)
		}
		if c.kind == "farmem" && c.pct < 100 {
			for _, s := range faultSources {
				if i, ok := col["lat_"+s.what+"_count"]; ok && i < len(row) {
					if v, _ := strconv.Atoi(row[i]); v > 0 && !slices.Contains(srcs[r.wl], s.what) {
						srcs[r.wl] = append(srcs[r.wl], s.what)
					}
				}
			}
		}
		rs = append(rs, r)
	}
	// In the plots' order (faultSources), not the order the rows first had each.
	for wl, ss := range srcs {
		slices.SortFunc(ss, func(a, b string) int { return srcIndex(a) - srcIndex(b) })
		srcs[wl] = ss
	}
	return rs, srcs, nil
}

func srcIndex(what string) int {
	return slices.IndexFunc(faultSources, func(s struct{ what, desc string }) bool { return s.what == what })
}
