package main

import (
	"encoding/csv"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
)

// writeReport writes OUT.csv (one row a run) and OUT.md (the table made from them).
func writeReport(out, cmdline string, r *reach, progs []*program, rows []outcome) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	f, err := os.Create(out + ".csv")
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	w.Write([]string{"program", "config", "status", "wall_s", "exit", "digest", "cap_bytes", "limit_bytes", "shared_bytes", "peak_bytes", "peak_source", "within", "detail"})
	for _, o := range rows {
		w.Write([]string{o.prog, o.config, o.status, strconv.FormatFloat(o.wall, 'f', 3, 64), strconv.Itoa(o.exit), o.digest,
			strconv.FormatInt(o.capB, 10), strconv.FormatInt(o.limitB, 10), strconv.FormatInt(o.sharedB, 10), strconv.FormatInt(o.peakB, 10), o.peakSrc, within(o), oneLine(o.detail)})
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.WriteFile(out+".md", []byte(markdown(out, cmdline, r, progs, rows)), 0o644)
}

func commit() string {
	c, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	s := strings.TrimSpace(string(c))
	if exec.Command("git", "diff", "--quiet", "HEAD", "--").Run() != nil {
		s += "-dirty"
	}
	return s
}

func find(rows []outcome, prog, config string) (outcome, bool) {
	for _, o := range rows {
		if o.prog == prog && o.config == config {
			return o, true
		}
	}
	return outcome{}, false
}

// cell is a run's time and its ratio to native, or what happened instead.
func cell(o outcome, ok bool, nat outcome) string {
	if !ok {
		return "–"
	}
	switch o.status {
	case "ok":
		return fmt.Sprintf("%.2f s (%.1fx)", o.wall, o.wall/nat.wall)
	case "timeout":
		return fmt.Sprintf("**timeout** (killed at %.0fx native)", o.wall/nat.wall)
	case "oom-killed":
		return "**OOM-killed**"
	case "wrong-output":
		return "**wrong output**"
	case "not-run":
		return "not run: " + o.detail
	}
	return "**failed**"
}

func markdown(out, cmdline string, r *reach, progs []*program, rows []outcome) string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	host, _ := os.Hostname()
	kernel, _ := exec.Command("uname", "-r").Output()
	p("# Reach: unmodified programs under farmem and under Linux swap at %d %% of their native peak\n\n", r.pct)
	p("Made by `%s` at commit %s on %s, %s (%s, Linux %s, %d CPUs). Raw per-run rows: [%s](%s).\n\n",
		strings.TrimSpace(cmdline), r.commit, r.started.UTC().Format("2006-01-02 15:04 UTC"), host, "scale "+strconv.FormatFloat(r.scale, 'g', -1, 64),
		strings.TrimSpace(string(kernel)), numCPU(), filepath.Base(out)+".csv", filepath.Base(out)+".csv")
	p("Each program ran once natively, once under Linux swap to zram and once under `farmem run` at the same cap (one run each: ")
	p("no medians). `bin/farmem-reach -h` says how each is run and measured. In short:\n\n")
	p("- **Native peak**: the kernel's maximum of the native run's own memory cgroup (`memory.max_usage_in_bytes`): anonymous memory, the page cache it brought in, and kernel memory.\n")
	p("- **Cap**: %d %% of that peak (at least 16 MiB), farmem's `--local-mem`, which caps anonymous memory. The zram run's cgroup limit is the cap plus the kernel memory (page tables, slab) the native run was charged, and a server's shared memory (postgres's: see the notes; the CSV's shared_bytes), which farmem does not cap either; page cache gets nothing extra: a cgroup reclaims it before it swaps.\n", r.pct)
	p("- **farmem peak**: the kernel's maximum of the run's own memory cgroup (farmem's `--summary-json`, `cgroup_peak_bytes`), held to the zram run's limit (*within*); where farmem had no cgroup of the run's own, its sampled anonymous peak, held to the cap.\n")
	p("- **Times**: wall time, and in brackets its ratio to native; servers are timed from ready to the digest's answer (load, rewrite, read back), the attach row from the cap's taking hold. *zram / farmem*: zram's time over farmem's (above 1: farmem faster).\n")
	p("- A run is killed after %gx its native time (at least %v) and counted as a timeout; an OOM kill is counted as one: neither is a time.\n", r.factor, r.minTimeout)
	p("- **Output**: farmem's digest against the native run's (a zram run's that differs shows in its own column).\n\n")
	p("| program | what it runs | entered by | native | native peak MiB | cap MiB | Linux swap→zram | farmem | zram / farmem | farmem peak MiB (limit) | within | output |\n")
	p("|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	counts := map[string]int{}
	for _, pr := range progs {
		nat, ok := find(rows, pr.name, "native")
		if !ok {
			continue
		}
		entered := pr.link
		if pr.link == "dynamic" {
			entered = "LD_PRELOAD"
		} else {
			entered = "injection (static)"
		}
		if pr.attach {
			entered = "`farmem attach`"
		}
		if nat.status != "ok" {
			p("| %s | %s | %s | %s | | | | | | | | |\n", pr.name, pr.title, entered, cell(nat, true, nat))
			counts["native "+nat.status]++
			continue
		}
		z, zok := find(rows, pr.name, "zram")
		fm, fok := find(rows, pr.name, "farmem")
		ratio := ""
		if z.status == "ok" && fm.status == "ok" {
			ratio = fmt.Sprintf("%.2f", z.wall/fm.wall)
		}
		peak, in, outEq := "", "", ""
		if fok && fm.peakB > 0 {
			bound := fm.limitB
			if fm.peakSrc == "sampled" {
				bound = fm.capB
			}
			peak = fmt.Sprintf("%.1f (%.1f)", mib(fm.peakB), mib(bound))
			if fm.peakSrc == "sampled" {
				peak += " sampled"
			}
			in = within(fm)
		}
		switch fm.status {
		case "ok":
			outEq = "equal"
		case "wrong-output":
			outEq = "**differs**"
		}
		p("| %s | %s | %s | %.2f s | %.1f | %.1f | %s | %s | %s | %s | %s | %s |\n", pr.name, pr.title, entered, nat.wall, mib(nat.peakB),
			mib(fm.capB), cell(z, zok, nat), cell(fm, fok, nat), ratio, peak, in, outEq)
		counts["zram "+z.status]++
		counts["farmem "+fm.status]++
	}
	p("\nCounts: ")
	var cs []string
	for _, k := range []string{"farmem ok", "farmem wrong-output", "farmem timeout", "farmem oom-killed", "farmem failed", "farmem not-run",
		"zram ok", "zram wrong-output", "zram timeout", "zram oom-killed", "zram failed", "zram not-run", "native failed", "native not-run"} {
		if counts[k] > 0 {
			cs = append(cs, fmt.Sprintf("%s %d", k, counts[k]))
		}
	}
	p("%s.\n", strings.Join(cs, ", "))

	// LD_PRELOAD against injection.
	var inj []string
	for _, pr := range progs {
		nat, _ := find(rows, pr.name, "native")
		fm, ok1 := find(rows, pr.name, "farmem")
		fi, ok2 := find(rows, pr.name, "farmem-inject")
		if !ok1 || !ok2 {
			continue
		}
		ratio := ""
		if fm.status == "ok" && fi.status == "ok" {
			ratio = fmt.Sprintf("%.2f", fi.wall/fm.wall)
		}
		peakI := ""
		if fi.peakB > 0 {
			peakI = fmt.Sprintf("%.1f", mib(fi.peakB))
		}
		peakP := ""
		if fm.peakB > 0 {
			peakP = fmt.Sprintf("%.1f", mib(fm.peakB))
		}
		inj = append(inj, fmt.Sprintf("| %s | %s | %s | %s | %s / %s | %s |", pr.name, cell(fm, true, nat), cell(fi, true, nat), ratio, peakP, peakI, within(fi)))
	}
	if len(inj) > 0 {
		p("\n## LD_PRELOAD against injection\n\n")
		p("farmem enters a dynamic program by preloading its shim and a static one by ptrace injection (launcher/static.go). ")
		p("`farmem run --inject` (hidden) enters a dynamic program by injection too, with no shim: the same agent, the mapping filter installed from the start ")
		p("(so every mmap and brk is a round trip through farmem even before the run arms), and no wrapper of pthread_create. ")
		p("The same cap, one run each, right after each other; *inject / preload* is the time under injection over the time under the shim (below 1: injection faster).\n\n")
		p("| program | farmem, LD_PRELOAD | farmem --inject | inject / preload | peak MiB preload / inject | inject within |\n|---|---|---|---|---|---|\n")
		p("%s\n", strings.Join(inj, "\n"))
	}

	var notes []string
	for _, pr := range progs {
		if pr.note != "" {
			notes = append(notes, "- "+pr.note)
		}
	}
	if len(notes) > 0 {
		p("\n## Notes\n\n%s\n", strings.Join(notes, "\n"))
	}
	var bad []string
	for _, o := range rows {
		if o.status != "ok" && o.detail != "" {
			bad = append(bad, fmt.Sprintf("- %s %s: %s: %s", o.prog, o.config, o.status, oneLine(o.detail)))
		}
	}
	if len(bad) > 0 {
		p("\n## Runs that did not finish with the native output\n\n%s\n", strings.Join(bad, "\n"))
	}
	return b.String()
}

func numCPU() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return 0
	}
	n := 0
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, found := strings.Cut(r, "-")
		a, _ := strconv.Atoi(lo)
		if !found {
			n++
			continue
		}
		z, _ := strconv.Atoi(hi)
		n += z - a + 1
	}
	return n
}
