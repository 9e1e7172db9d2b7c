// Command farmem-reach makes the reach table, results/reach.md: unmodified programs nobody on the
// project wrote, each run natively, under Linux swap to zram in a memory cgroup and under
// `farmem run` at the same cap (a share of its native peak), with its output checked against
// the native run's. Run it as root from the repository's root (make bench-reach); -h for its
// flags.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

const usage = `farmem-reach: the reach table (results/reach.md and reach.csv beside it).

Every program is run, one after the other:
  1. natively, in a memory cgroup of its own with no limit: its output's digest, its time, and
     its peak as the kernel counts it (the cgroup's memory.max_usage_in_bytes, v2 memory.peak:
     anonymous memory, the page cache it brought in, kernel memory), and the kernel memory
     (page tables, slab) that cgroup was charged;
  2. under Linux swap to zram (workloads/swap/linux-swap.sh): a memory cgroup limited to the
     cap plus that kernel memory (the cap itself is for anonymous memory, as farmem's), zram
     sized to the peak plus 64 MiB;
  3. under bin/farmem run --local-mem CAP, where CAP is -pct % of the native peak (at least
     farmem's 16 MiB); its peak is the kernel's maximum of the run's own memory cgroup, from
     its --summary-json (cgroup_peak_bytes), held to the zram run's limit;
  4. for the programs in -inject, also under farmem run --inject (a dynamic program entered by
     ptrace injection, as a static one is, instead of the preloaded shim).
Each run's output must equal the native run's; a run is killed after -timeout-factor times
the native time (at least -min-timeout) and counted as a timeout; an OOM kill is counted as
one; neither is ever a time.

The full table, as root, on a quiet machine (about 15 minutes on 2 CPUs):
    make bench-reach              # = make build && scripts/reach-deps.sh && bin/farmem-reach
A smoke run that checks every row works (not a result: tiny sizes, written to /tmp):
    bin/farmem-reach -scale 0.05 -out /tmp/reach-smoke
Flags:
`

// repoRoot is where the repository is: the programs' scripts and linux-swap.sh are found from it.
var repoRoot = "."

// workDir holds the generated inputs, the database cluster, sockets and summaries.
var workDir = "/var/tmp/farmem-reach"

func main() {
	flag.Usage = func() { fmt.Fprint(os.Stderr, usage); flag.PrintDefaults() }
	out := flag.String("out", "results/reach", "write OUT.md and OUT.csv")
	scale := flag.Float64("scale", 1, "every program's size, times this")
	pct := flag.Int("pct", 25, "the cap, % of each program's native peak")
	only := flag.String("only", "", "comma-separated programs to run (default: all); -list lists them")
	list := flag.Bool("list", false, "list the programs and exit")
	inject := flag.String("inject", "", "programs also run under farmem run --inject (default: those marked, numpy,perl,sqlite3,redis; none: none)")
	factor := flag.Float64("timeout-factor", 100, "a run is killed after this many times the native time (a program whose working set is four times the cap and walked at random pays a fault on most of its touches: perl's sort takes about 70x native at 25 %, and the table is to say whether it finishes, with its output)")
	minTimeout := flag.Duration("min-timeout", 30*time.Second, "but never before this")
	farmem := flag.String("farmem", "bin/farmem", "the farmem binary")
	configs := flag.String("configs", "zram,farmem,farmem-inject", "the configurations run beside native (-configs '' runs native only: the sizes and peaks)")
	flag.StringVar(&workDir, "work", workDir, "working directory (inputs, database cluster, sockets)")
	flag.Parse()
	if flag.NArg() > 0 {
		fail("unexpected argument %q", flag.Arg(0))
	}
	progs := programs()
	if *list {
		for _, p := range progs {
			fmt.Printf("%-13s %-8s %s\n", p.name, p.link, p.title)
		}
		return
	}
	if *scale <= 0 || *pct <= 0 || *pct > 100 || *factor <= 1 {
		fail("-scale must be > 0, -pct 1 to 100, -timeout-factor > 1")
	}
	if *only != "" {
		var sel []*program
		for _, n := range strings.Split(*only, ",") {
			i := slices.IndexFunc(progs, func(p *program) bool { return p.name == n })
			if i < 0 {
				fail("-only: no program %q (-list lists them)", n)
			}
			sel = append(sel, progs[i])
		}
		progs = sel
	}
	if *inject != "" {
		want := strings.Split(*inject, ",")
		all := programs()
		for _, n := range want {
			if n != "none" && !slices.ContainsFunc(all, func(p *program) bool { return p.name == n }) {
				fail("-inject: no program %q", n)
			}
		}
		for _, p := range progs {
			p.inject = slices.Contains(want, p.name) && p.link == "dynamic" && !p.attach
		}
	}
	if os.Geteuid() != 0 {
		fail("must run as root (memory cgroups, swap, userfaultfd)")
	}
	if _, err := os.Stat(*farmem); err != nil {
		fail("%s: %v (make build)", *farmem, err)
	}
	if b, _ := os.ReadFile("/proc/swaps"); strings.Count(string(b), "\n") > 1 {
		fail("swap is on (/proc/swaps): the native runs would swap, and linux-swap.sh refuses to mix devices")
	}
	if err := os.MkdirAll(workDir, 0o755); err != nil {
		fail("%v", err)
	}
	// The postgres row runs as the user postgres, which must reach its files here.
	os.Chmod(workDir, 0o755)
	r := &reach{farmem: *farmem, scale: *scale, pct: *pct, factor: *factor, minTimeout: *minTimeout, configs: map[string]bool{},
		commit: commit(), started: time.Now()}
	for _, c := range strings.Split(*configs, ",") {
		switch c {
		case "zram", "farmem", "farmem-inject":
			r.configs[c] = true
		case "":
		default:
			fail("-configs: no configuration %q (zram, farmem, farmem-inject)", c)
		}
	}
	tearDownOnSignal()
	var rows []outcome
	for _, p := range progs {
		rows = append(rows, r.program(p)...)
	}
	cmdline := "bin/farmem-reach " + strings.Join(os.Args[1:], " ")
	if err := writeReport(*out, cmdline, r, progs, rows); err != nil {
		fail("%v", err)
	}
	fmt.Fprintf(os.Stderr, "farmem-reach: wrote %s.md and %s.csv\n", *out, *out)
}

func fail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "farmem-reach: "+format+"\n", a...)
	os.Exit(2)
}

type reach struct {
	farmem     string
	scale      float64
	pct        int
	factor     float64
	minTimeout time.Duration
	configs    map[string]bool // which of zram, farmem, farmem-inject run
	// commit and started are the tree the run measured and when it began, taken at its start:
	// by the end the run has rewritten its own tracked results, and the tree looks changed.
	commit  string
	started time.Time
}

func (r *reach) say(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "%s farmem-reach: "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
}

// cgroupDir is where linux-swap.sh makes the cgroup NAME.
func cgroupDir(name string) string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "/sys/fs/cgroup/farmem-swap-" + name
	}
	return "/sys/fs/cgroup/memory/farmem-swap-" + name
}

func swapScript() string { return filepath.Join(repoRoot, "workloads", "swap", "linux-swap.sh") }

// swapCmd runs linux-swap.sh with args and returns its output.
func swapCmd(args ...string) (string, error) {
	out, err := exec.Command(swapScript(), args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("linux-swap.sh %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return strings.TrimSpace(string(out)), nil
}

// cgStats is linux-swap.sh stats NAME as a map.
func cgStats(name string) (map[string]int64, error) {
	out, err := swapCmd("stats", name)
	if err != nil {
		return nil, err
	}
	st := map[string]int64{}
	for _, f := range strings.Fields(out) {
		k, v, ok := strings.Cut(f, "=")
		if ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			st[k] = n
		}
	}
	return st, nil
}

// program runs every configuration of p and returns their rows.
func (r *reach) program(p *program) []outcome {
	notRun := func(config, why string) outcome {
		return outcome{prog: p.name, config: config, status: "not-run", exit: -1, detail: why}
	}
	for _, b := range p.needs {
		if _, err := os.Stat(b); err != nil {
			r.say("%s: not run: %s is missing (scripts/reach-deps.sh installs it)", p.name, b)
			return []outcome{notRun("native", b+" is missing (scripts/reach-deps.sh installs it)")}
		}
	}
	dir := filepath.Join(workDir, p.name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return []outcome{notRun("native", err.Error())}
	}
	if p.prepare != nil {
		if err := p.prepare(dir, r.scale); err != nil {
			r.say("%s: not run: preparing its input: %v", p.name, err)
			return []outcome{notRun("native", "preparing its input: "+err.Error())}
		}
	}

	// 1. Natively, in a cgroup of its own with no limit.
	nat := outcome{prog: p.name, config: "native", exit: -1}
	if _, err := swapCmd("cgroup", "reachref", "0"); err != nil {
		return []outcome{notRun("native", err.Error())}
	}
	shmemCgroup = cgroupDir("reachref")
	runProgram(p, []string{swapScript(), "exec", "reachref"}, dir, r.scale, 30*time.Minute, &nat)
	shmemCgroup = ""
	st, err := cgStats("reachref")
	swapCmd("rmcgroup", "reachref")
	if err != nil {
		nat.status, nat.detail = "failed", err.Error()
	}
	nat.peakB, nat.peakSrc = st["max_usage_bytes"], "cgroup"
	r.say("%s native: %s %.2f s, peak %.1f MiB (kernel memory %.1f MiB, shared memory %.1f MiB) %s", p.name, nat.status, nat.wall,
		mib(nat.peakB), mib(st["kmem_max_bytes"]), mib(nat.sharedB), nat.detail)
	rows := []outcome{nat}
	if nat.status != "ok" {
		return rows
	}
	capB := max(16<<20, nat.peakB*int64(r.pct)/100) &^ 4095
	// The cgroup counts what farmem does not cap: kernel memory, and a server's shared memory.
	limitB := capB + st["kmem_max_bytes"] + nat.sharedB
	limit := max(r.minTimeout, time.Duration(r.factor*nat.wall*float64(time.Second)))
	check := func(o *outcome) {
		if o.status == "ok" && o.digest != nat.digest {
			o.status, o.detail = "wrong-output", fmt.Sprintf("digest %s, native %s", o.digest, nat.digest)
		}
		if o.status == "timeout" {
			o.detail = strings.TrimSpace(fmt.Sprintf("killed after %.0f s (%.0fx native) %s", limit.Seconds(), limit.Seconds()/nat.wall, o.detail))
		}
		r.say("%s %s: %s %.2f s, peak %.1f MiB (%s) %s", p.name, o.config, o.status, o.wall, mib(o.peakB), o.peakSrc, o.detail)
	}

	// 2. Linux swap to zram.
	if r.configs["zram"] {
		z := outcome{prog: p.name, config: "zram", capB: capB, limitB: limitB, exit: -1}
		r.zram(p, dir, nat.peakB, limit, &z)
		check(&z)
		rows = append(rows, z)
	}

	// 3. farmem, and 4. farmem --inject.
	var configs []string
	if r.configs["farmem"] {
		configs = append(configs, "farmem")
	}
	if p.inject && r.configs["farmem-inject"] {
		configs = append(configs, "farmem-inject")
	}
	for _, c := range configs {
		o := outcome{prog: p.name, config: c, capB: capB, limitB: limitB, exit: -1}
		if p.attach {
			r.farmemAttach(p, dir, limit, &o)
		} else {
			r.farmemRun(p, dir, limit, c == "farmem-inject", &o)
		}
		check(&o)
		rows = append(rows, o)
	}
	return rows
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// zram runs p in a memory cgroup limited to o.limitB, swapping to zram.
func (r *reach) zram(p *program, dir string, peakB int64, limit time.Duration, o *outcome) {
	defer swapCmd("off")
	if _, err := swapCmd("on", "zram", strconv.FormatInt(peakB>>20+64, 10)); err != nil {
		o.status, o.detail = "failed", err.Error()
		return
	}
	if p.attach {
		r.zramAttach(p, dir, limit, o)
	} else {
		if _, err := swapCmd("cgroup", "reachrun", strconv.FormatInt(o.limitB, 10)); err != nil {
			o.status, o.detail = "failed", err.Error()
			return
		}
		runProgram(p, []string{swapScript(), "exec", "reachrun"}, dir, r.scale, limit, o)
	}
	if o.status == "not-run" {
		return
	}
	st, err := cgStats("reachrun")
	if err != nil {
		if o.status == "ok" {
			o.status, o.detail = "failed", err.Error()
		}
		return
	}
	o.peakB, o.peakSrc = st["max_usage_bytes"], "cgroup"
	if st["oom_kills"] > 0 && o.status != "ok" {
		o.status, o.detail = "oom-killed", fmt.Sprintf("the cgroup's OOM killer killed %d process(es); %s", st["oom_kills"], o.detail)
	}
}

// farmemRun runs p under farmem run at the cap.
func (r *reach) farmemRun(p *program, dir string, limit time.Duration, inject bool, o *outcome) {
	sum := filepath.Join(dir, "summary.json")
	os.Remove(sum)
	prefix := []string{r.farmem, "run", "--quiet", "--local-mem", strconv.FormatInt(o.capB, 10), "--summary-json", sum}
	if inject {
		prefix = append(prefix, "--inject")
	}
	runProgram(p, append(prefix, "--"), dir, r.scale, limit, o)
	readSummary(sum, o)
}

// readSummary takes farmem's peak from its --summary-json, and its failure if it stopped the
// program.
func readSummary(path string, o *outcome) {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return // killed at the timeout: no summary
	}
	var s struct {
		Failure         string `json:"failure"`
		PeakAnonBytes   int64  `json:"peak_anon_bytes"`
		CgroupPeakBytes *int64 `json:"cgroup_peak_bytes"`
	}
	if err := json.Unmarshal(b, &s); err != nil {
		o.detail = strings.TrimSpace(o.detail + " --summary-json: " + err.Error())
		return
	}
	if s.CgroupPeakBytes != nil {
		o.peakB, o.peakSrc = *s.CgroupPeakBytes, "cgroup"
	} else {
		o.peakB, o.peakSrc = s.PeakAnonBytes, "sampled"
	}
	if s.Failure != "" {
		o.detail = strings.TrimSpace(o.detail + " farmem stopped it: " + s.Failure)
	}
}

// within says whether a farmem run's peak was held: the cgroup's peak to the zram run's limit
// (the cap plus the native run's kernel memory), a sampled anonymous peak to the cap.
func within(o outcome) string {
	if o.peakB == 0 || !strings.HasPrefix(o.config, "farmem") {
		return ""
	}
	bound := o.limitB
	if o.peakSrc == "sampled" {
		bound = o.capB
	}
	if o.peakB <= bound {
		return "yes"
	}
	return "no"
}
