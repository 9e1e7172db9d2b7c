// Command farmem-bench is issue 6's harness: each workload natively, under farmem at caps of
// 100/75/50/25 % of its measured native peak (the embedded backend, with the default prefetcher,
// streams, and with --prefetch none), and under Linux swap at the same caps (a cgroup v1 memory limit, swapping to
// zram and to a swap file on disk, set up and torn down by workloads/swap/linux-swap.sh), in
// rounds interleaved so that machine drift hits every configuration alike. The micro workloads
// also run under bin/floorpager (configuration floor: a minimal userfaultfd pager, the floor
// farmem's throughput and eviction stages are set against; workloads/floor). Every run's data is
// verified (micro checks every page, redisdrive every value, the checksums of pagerank, numpy,
// the JVM's and node's workloads must equal the native run's). It writes a markdown report, a
// CSV of every run and PNG plots. The managed runtimes (a JVM under G1 and under Parallel GC,
// node) and what they measure: runtimes.go.
//
// It lives in its own Go module (workloads/bench/harness/go.mod) so that the plotting
// library's dependencies stay out of farmem's.
//
// Usage (as root, from the repository root; make bench-swap):
//
//	bin/farmem-bench [-rounds N] [-workloads LIST] [-caps LIST] [-configs LIST] [-scale F] [-out DIR]
//	bin/farmem-bench -render results/swap.csv   # re-make a run's report from its rows, running nothing
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A workload is a batch program (args) or redis-server driven by redisdrive (server).
type workload struct {
	name, title string
	args        []string // batch: the command line
	server      string   // "redis": redis-server + bin/redisdrive; "memcached": memcached + bin/memcachedrive
	getRatio    float64
	keys, ops   int
	metric      string // what its throughput counts
	// digest: a batch program that prints a checksum; its group 1 is the checksum, which must
	// equal the native run's (nil: the program's own OK line is the check).
	digest *regexp.Regexp
}

// A config is one way of running a workload at one cap.
type config struct {
	kind     string // native, farmem, swap, floor
	before   bool   // farmem: run the -before build instead of bin/farmem
	prefetch string // farmem: the --prefetch value ("" = farmem's default)
	remote   string // farmem: "" (the embedded store), or tcp or shm (a memory server on this host)
	swap     string // swap: zram or file
	inproc   bool   // floor: the pager inside the program (floorpager --inproc)
	program  bool   // farmem: --serve-faults program
	pct      int    // cap as % of the native peak (0 for native)
}

func (c config) name() string {
	switch c.kind {
	case "native":
		return "native"
	case "farmem":
		n := "farmem"
		if c.before {
			n += "-before"
		}
		if c.program {
			return n + "-program"
		}
		if c.before {
			return n
		}
		if c.remote != "" {
			n += "-" + c.remote
		}
		if c.prefetch != "" {
			n += "-" + c.prefetch
		}
		return n
	case "floor":
		if c.inproc {
			return "floor-inproc"
		}
		return "floor"
	}
	return "swap-" + c.swap
}

// result is one run.
type result struct {
	wl       string
	cfg      config
	round    int
	capMiB   int
	limitB   int64 // swap: memory.limit_in_bytes
	wall     float64
	tput     float64 // the workload's metric per second
	p50, p99 float64 // redis: request latency, µs
	faults   uint64  // farmem: backend faults; swap: major faults
	inB      uint64  // bytes brought back (farmem backend reads; swap pswpin)
	outB     uint64  // bytes written out (farmem evictions written; swap pswpout)
	timeout  bool    // stopped at its time limit, or (oom) killed by the cgroup's OOM killer
	oom      bool
	fsP50    float64 // farmem: its backend fault-service latency, µs (its summary's)
	fsP99    float64
	peakB    int64 // swap, and farmem with peakCgroup: the cgroup's max usage; else farmem's sampled peak anonymous RSS
	// peakCgroup: peakB is the kernel's peak charge of the program's memory cgroup (swap's always;
	// farmem's where its summary gives it).
	peakCgroup bool
	// storePeakB, farmemRSSB: farmem's store's peak bytes and farmem's own peak RSS (VmHWM), from
	// its summary; 0 when it gave none.
	storePeakB, farmemRSSB int64
	// farmem: its --latency-out histograms by source (zero, backend, wp, cache) and of its
	// eviction batches; nil when it wrote none (a run stopped at its limit; native and swap runs).
	lat map[string]hist
	// userS, sysS: the run's CPU time, every process of it (wait4's rusage; batch workloads only).
	userS, sysS float64
	vmMajflt    uint64       // the pgmajfault delta of /proc/vmstat over the run (every process)
	stages      farmemStages // farmem: its eviction batches' mean stage times
	// farmem: its faults that waited before service, by reason (heldReasons), their service
	// time, and all its faults' service time (ns).
	held            [len(heldReasons)]float64
	heldNs, faultNs float64
	floor           map[string]float64 // floor: floorpager's exit line (nil for other configurations)
}

// ref is what the workload's native reference run measured.
type ref struct {
	peakMiB   int   // VmHWM
	cgMax     int64 // the cgroup's memory.max_usage_in_bytes
	overhead  int64 // what the swap runs' cgroup gets beyond the cap: the kernel memory the native run was charged
	checksum  string
	nativeSec float64
}

var (
	commit     string
	swapScript = "workloads/swap/linux-swap.sh"
	farmemBin  = "bin/farmem"
	// beforeBin is an earlier build of farmem (-before), run as the farmem-before configuration
	// beside bin/farmem: what a change did, measured side by side in one run.
	beforeBin string
)

type harness struct {
	ctx      context.Context
	work     string
	timeout  float64 // seconds; 0: 20x the native run, at least 60 s
	refs     map[string]*ref
	swapUsed bool
	log      *os.File
	budget   time.Duration
	rounds   int      // the rounds that ran
	partial  bool     // the last of them was cut short by the budget
	fileRSS  int64    // the last native server run's file-backed RSS (its binary and libraries)
	cluster  *cluster // the ctrl and memory server of the farmem-tcp/-shm configurations
	// -render: the run's header (from its swap.md), the note on what was re-rendered, and the
	// fault sources of each workload's latency plot (which is not redrawn).
	preamble, rendered string
	latSrcs            map[string][]string
	cmdCells           map[string]string // each workload's command cell in the run's workloads table
	runtimeVer         map[string]string // the java and node that ran, by binary (runtimes.go)
}

func main() {
	rounds := flag.Int("rounds", envInt("ROUNDS", 3), "rounds, interleaved (env ROUNDS)")
	wls := flag.String("workloads", "redis-etc,redis-sys,micro-random,micro-seq,pagerank", "workloads (memcached, micro-zipf, numpy-matmul, jvm-* and node are not in the default run, for time): redis-etc, redis-sys, memcached-etc, memcached-sys, micro-random, micro-seq, micro-zipf, pagerank, numpy-matmul, jvm-g1, jvm-parallel (a 400 MiB heap at scale 1), node (about 330 MiB)")
	caps := flag.String("caps", "100,75,50,25", "caps, % of each workload's native peak")
	cfgs := flag.String("configs", "farmem,farmem-none,swap-zram,swap-file,floor", "configurations run at every cap (native always runs): farmem (its default prefetcher, streams), farmem-none (or -leap, -streams, -readahead, -stride, -nextn), farmem-before (the -before build, defaults), farmem-before-program (the -before build, --serve-faults program), farmem-tcp, farmem-shm (a ctrl and one memory server on this host; -leap too), farmem-program (--serve-faults program), swap-zram, swap-file, floor (bin/floorpager, the micro workloads and redis), floor-inproc (bin/floorpager --inproc: the same pager run by a thread of the program)")
	flag.StringVar(&beforeBin, "before", "", "an earlier build of farmem (a binary), run as the farmem-before configuration; the report names its version")
	scale := flag.Float64("scale", 1, "multiplies the workload sizes")
	out := flag.String("out", "results", "directory for swap.md, swap.csv and the plots")
	timeout := flag.Float64("timeout", 0, "seconds a run may take before it is stopped (0: 20x its native run, at least 60)")
	plots := flag.Bool("plots", true, "write PNG plots")
	flag.StringVar(&commit, "commit", "", "the farmem commit to name in the report (default: git rev-parse HEAD here)")
	nopaging := flag.Int("nopaging", 150, "also run farmem at this % of the peak, where it should not page (0: not)")
	budget := flag.Duration("budget", 0, "start no round that would end after this long (0: no limit); the report says how many rounds ran")
	render := flag.String("render", "", "run nothing: re-make the report (swap.md, throughput plots) in this CSV's directory from its per-run rows, e.g. -render results/swap.csv")
	flag.Parse()
	if flag.NArg() > 0 || *rounds < 1 || *scale <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	h := &harness{ctx: ctx, timeout: *timeout, refs: map[string]*ref{}, budget: *budget}
	if *render != "" {
		if err := h.render(*render, *plots); err != nil {
			fmt.Fprintf(os.Stderr, "farmem-bench: -render: %v\n", err)
			os.Exit(1)
		}
		return
	}
	err := h.main(*rounds, split(*wls), split(*caps), split(*cfgs), *nopaging, *scale, *out, *plots)
	h.cluster.stop()
	// Swap and cgroups change the machine: always undo them, whatever happened.
	if h.swapUsed {
		if terr := swapOff(); terr != nil {
			fmt.Fprintf(os.Stderr, "farmem-bench: TEARDOWN FAILED: %v (check /proc/swaps and /sys/fs/cgroup/memory)\n", terr)
			if err == nil {
				err = terr
			}
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "farmem-bench: FAILED: %v\n", err)
		if h.work != "" {
			fmt.Fprintf(os.Stderr, "farmem-bench: logs kept in %s\n", h.work)
		}
		if ctx.Err() != nil {
			os.Exit(130)
		}
		os.Exit(1)
	}
	os.RemoveAll(h.work)
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil {
		return v
	}
	return def
}

func split(s string) []string {
	var r []string
	for _, f := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		r = append(r, f)
	}
	return r
}

func scaled(v int, s float64, lo int) int { return max(lo, int(float64(v)*s+0.5)) }

func workloads(names []string, s float64) ([]workload, error) {
	// About 64 MiB each at scale 1: the smallest footprints whose 25 % cap is not raised to
	// farmem's 16 MiB minimum, and which let the full run (5 workloads x 21 configurations x 3
	// rounds, swap runs of tens of seconds) finish in about 25 minutes on 2 cores.
	micro := scaled(64, s, 8)
	keys := scaled(46000, s, 2000)
	pr := scaled(64, s, 8)
	var r []workload
	for _, n := range names {
		switch n {
		case "redis-etc", "redis-sys", "memcached-etc", "memcached-sys":
			srv, mix, _ := strings.Cut(n, "-")
			// Four zipfian operations a key: with one (0.4 s natively, just after the populate)
			// the measured phase was mostly the hot set's first faults, and one run's ratio
			// moved 10-30 % between sittings (leap against none on redis at 75 %: 0.68 against
			// 0.91 in one run; leap 1.12x none over 150k operations, medians of 4 rounds).
			w := workload{name: n, server: srv, keys: keys, ops: 4 * keys, getRatio: 0.95, metric: "ops/s (zipfian phase)"}
			w.title = srv + " ETC (95 % GET)"
			if mix == "sys" {
				w.getRatio, w.title = 0.75, srv+" SYS (75 % GET)"
			}
			r = append(r, w)
		case "micro-random", "micro-seq", "micro-zipf":
			p := strings.TrimPrefix(n, "micro-")
			r = append(r, workload{name: n, title: "micro " + p, metric: "pages/s (2 passes)",
				args: []string{"bin/micro", "--mib", strconv.Itoa(micro), "--passes", "2", "--pattern", p}})
		case "numpy-matmul":
			// Debian's numpy over its default (reference) BLAS: slow, hence a small N.
			r = append(r, workload{name: n, title: "numpy matmul", metric: "GFLOP/s (2 multiplications)",
				args:   []string{"/usr/bin/python3", "workloads/numpy/matmul.py", "--mib", strconv.Itoa(scaled(24, s, 4)), "--reps", "2"},
				digest: regexp.MustCompile(`(?m)^matmul: OK n=\d+ checksum=([0-9a-f:]+) `)})
		case "pagerank":
			// 3 iterations, not pagerank's 10: each capped iteration re-reads the whole graph,
			// and 3 already show the steady state (the throughput counts the iterations only).
			r = append(r, workload{name: n, title: "pagerank", metric: "edges/s (3 iterations)",
				args:   []string{"bin/pagerank", "--mib", strconv.Itoa(pr), "--iters", "3"},
				digest: regexp.MustCompile(`(?m)^pagerank: OK checksum=([0-9a-f:]+) `)})
		case "jvm-g1":
			r = append(r, jvmWorkload(n, "G1", s))
		case "jvm-parallel":
			r = append(r, jvmWorkload(n, "Parallel", s))
		case "node":
			r = append(r, nodeWorkload(s))
		default:
			return nil, fmt.Errorf("unknown workload %q", n)
		}
	}
	return r, nil
}

func configs(names, caps []string) ([]config, []int, error) {
	var pcts []int
	for _, c := range caps {
		p, err := strconv.Atoi(c)
		if err != nil || p < 1 || p > 1000 {
			return nil, nil, fmt.Errorf("bad cap %q (a percentage)", c)
		}
		pcts = append(pcts, p)
	}
	var r []config
	for _, p := range pcts {
		for _, n := range names {
			switch n {
			case "farmem":
				r = append(r, config{kind: "farmem", pct: p})
			case "farmem-program":
				r = append(r, config{kind: "farmem", program: true, pct: p})
			case "farmem-before", "farmem-before-program":
				if beforeBin == "" {
					return nil, nil, fmt.Errorf("%s needs -before BIN, an earlier build of farmem", n)
				}
				r = append(r, config{kind: "farmem", before: true, program: n == "farmem-before-program", pct: p})
			case "farmem-leap", "farmem-streams", "farmem-readahead", "farmem-stride", "farmem-nextn", "farmem-none":
				r = append(r, config{kind: "farmem", prefetch: strings.TrimPrefix(n, "farmem-"), pct: p})
			case "farmem-tcp", "farmem-shm", "farmem-tcp-leap", "farmem-shm-leap":
				f := strings.Split(n, "-")
				c := config{kind: "farmem", remote: f[1], pct: p}
				if len(f) == 3 {
					c.prefetch = f[2]
				}
				r = append(r, c)
			case "swap-zram", "swap-file":
				r = append(r, config{kind: "swap", swap: strings.TrimPrefix(n, "swap-"), pct: p})
			case "floor":
				r = append(r, config{kind: "floor", pct: p})
			case "floor-inproc":
				r = append(r, config{kind: "floor", inproc: true, pct: p})
			default:
				return nil, nil, fmt.Errorf("unknown configuration %q", n)
			}
		}
	}
	return r, pcts, nil
}

func (h *harness) main(rounds int, wlNames, capNames, cfgNames []string, nopaging int, scale float64, out string, plots bool) error {
	if os.Geteuid() != 0 {
		return errors.New("must run as root (userfaultfd, swapon, cgroups)")
	}
	for _, b := range []string{farmemBin, "bin/micro", "bin/pagerank", "bin/redisdrive", "bin/memcachedrive", swapScript} {
		if _, err := os.Stat(b); err != nil {
			return fmt.Errorf("%s is missing: run make build from the repository root", b)
		}
	}
	wls, err := workloads(wlNames, scale)
	if err != nil {
		return err
	}
	cfgs, pcts, err := configs(cfgNames, capNames)
	if err != nil {
		return err
	}
	if nopaging > 0 {
		// The "no paging" target: a cap above the peak, where farmem should cost nothing.
		cfgs = append(cfgs, config{kind: "farmem", pct: nopaging})
	}
	for _, w := range wls {
		if w.server != "" {
			if _, err := exec.LookPath(serverBin(w)); err != nil {
				return fmt.Errorf("%s is missing: apt-get install %s", serverBin(w), w.server)
			}
		}
	}
	if err := prepareRuntimes(wls); err != nil {
		return err
	}
	h.runtimeVer = runtimeVersions(wls)
	if h.work, err = os.MkdirTemp("", "farmem-bench-swap."); err != nil {
		return err
	}
	if h.log, err = os.Create(filepath.Join(h.work, "progress.log")); err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	for _, c := range cfgs {
		if c.kind == "floor" {
			if _, err := os.Stat(floorBin); err != nil {
				return fmt.Errorf("%s is missing: run make build from the repository root", floorBin)
			}
		}
		if c.kind == "swap" {
			h.swapUsed = true
		}
		if c.remote != "" && h.cluster == nil {
			if h.cluster, err = startCluster(h.work); err != nil {
				return err
			}
		}
	}
	if h.swapUsed {
		// Another swap already on would mix devices and make the numbers meaningless.
		if b, _ := os.ReadFile("/proc/swaps"); strings.Count(string(b), "\n") > 1 {
			return fmt.Errorf("swap is already active:\n%s(swapoff it first; linux-swap.sh off removes what this harness sets up)", b)
		}
	}
	facts := machineFacts()
	start := time.Now()

	// 1. The native reference of each workload: its peak, what its cgroup was charged, its checksum.
	for _, w := range wls {
		if err := h.reference(w); err != nil {
			return err
		}
		r := h.refs[w.name]
		h.progress("%s: peak %d MiB, cgroup max %.1f MiB (overhead %.1f MiB), native %.2f s", w.name, r.peakMiB,
			float64(r.cgMax)/(1<<20), float64(r.overhead)/(1<<20), r.nativeSec)
	}

	// 2. Rounds, interleaved: every workload and configuration once per round.
	var results []result
	total := 0
	for _, w := range wls {
		for _, c := range cfgs {
			if c.kind != "floor" || floorRuns(w) {
				total++
			}
		}
		total++ // native
	}
	total *= rounds
	i := 0
	for round := 1; round <= rounds; round++ {
		if h.partial {
			break
		}
		if el := time.Since(start); h.budget > 0 && round > 1 && el+el/time.Duration(round-1) > h.budget {
			h.progress("stopping after %d of %d rounds: another would end past the %v budget", round-1, rounds, h.budget)
			break
		}
		h.rounds = round
	runs:
		for _, w := range wls {
			for _, c := range append([]config{{kind: "native"}}, cfgs...) {
				if c.kind == "floor" && !floorRuns(w) {
					continue // floorpager pages what the program maps itself: micro's walks
				}
				if h.budget > 0 && time.Since(start) > h.budget {
					// A hard stop too: on a loaded machine one round can outlast the budget.
					h.partial = true
					h.progress("stopping in round %d: the %v budget is spent", round, h.budget)
					break runs
				}
				i++
				res, err := h.run(w, c, round)
				if err != nil {
					return fmt.Errorf("%s %s %d%% round %d: %w", w.name, c.name(), c.pct, round, err)
				}
				results = append(results, res)
				st := ""
				if res.oom {
					st = " OOM-KILLED"
				} else if res.timeout {
					st = " TIMED OUT"
				}
				h.progress("[%d/%d] %s %s %d%% round %d: %.2f s, %s %s%s", i, total, w.name, c.name(), c.pct, round, res.wall, fmtTput(res.tput), w.metric, st)
			}
		}
	}
	facts.end(start)
	return h.report(out, wls, cfgs, pcts, rounds, results, facts, plots)
}

func (h *harness) progress(f string, a ...any) {
	msg := fmt.Sprintf("farmem-bench: "+f, a...)
	fmt.Fprintln(os.Stderr, msg)
	fmt.Fprintln(h.log, msg)
}

// warm touches guest memory before a run: on a VM the first touch of guest memory the guest
// has not used lately is host work, several times a warm page's fault (docs/DESIGN.md,
// "Latency", and results/machine.md per host), which would bill whichever run came first. dd's
// one block of twice the footprint plus 32 MiB (the program and farmem's store of its pages;
// 64 MiB to 1 GiB) is written into, then given back. It costs about as long as a short run.
func warm(peakMiB int) {
	mib := min(max(2*peakMiB+32, 64), 1024)
	exec.Command("dd", "if=/dev/zero", "of=/dev/null", fmt.Sprintf("bs=%dM", mib), "count=1").Run()
}

// limit is how long a run may take.
func (h *harness) limit(w workload) time.Duration {
	if h.timeout > 0 {
		return time.Duration(h.timeout * float64(time.Second))
	}
	n := 30.0
	if r := h.refs[w.name]; r != nil {
		n = r.nativeSec
	}
	return time.Duration(max(60, 20*n) * float64(time.Second))
}

func (h *harness) reference(w workload) error {
	r := &ref{}
	h.refs[w.name] = r
	if err := runSwap("cgroup", "ref", "0"); err != nil {
		return err
	}
	h.swapUsed = true // a cgroup to remove
	warm(256)
	prefix := []string{swapScript, "exec", "ref"}
	res, out, hwm, err := h.exec(w, prefix, 30*time.Minute)
	if err != nil {
		return fmt.Errorf("%s natively: %w", w.name, err)
	}
	if res.timeout {
		return fmt.Errorf("%s natively: took more than 30 minutes", w.name)
	}
	if w.digest != nil {
		m := w.digest.FindStringSubmatch(out)
		if m == nil {
			return fmt.Errorf("%s natively: no OK checksum line", w.name)
		}
		r.checksum = m[1]
	}
	if err := h.verify(w, out); err != nil {
		return fmt.Errorf("%s natively: %w", w.name, err)
	}
	st, err := cgStats("ref")
	if err != nil {
		return err
	}
	if err := runSwap("rmcgroup", "ref"); err != nil {
		return err
	}
	r.peakMiB = int((hwm + 512<<10) >> 20)
	r.cgMax = st["max_usage_bytes"]
	// What the cgroup must hold that farmem's cap does not count, so that the swap runs hold as
	// much anonymous memory as farmem's: the kernel memory (page tables, slab) the native run was
	// charged. Not the page cache: the cgroup reclaims it before it swaps, so a limit raised for
	// it goes to anonymous memory. Nor the file-backed RSS: a server's binary and libraries (9
	// MiB of redis's 62) were cached, and charged, before its cgroup existed; counting them
	// gave swap-zram at "50 %" 41 MiB of redis's 53 MiB anonymous memory against farmem's 31.
	if k, ok := st["kmem_max_bytes"]; ok {
		r.overhead = k
	} else {
		// No kernel-memory accounting: whatever was charged beyond the anonymous peak.
		r.overhead = max(0, r.cgMax-(hwm-h.fileRSS))
	}
	h.fileRSS = 0
	r.nativeSec = res.wall
	return nil
}

// capMiB is pct % of the native peak, at least farmem's 16 MiB minimum.
func (h *harness) capMiB(w workload, pct int) int {
	return max(16, (h.refs[w.name].peakMiB*pct+50)/100)
}

func (h *harness) run(w workload, c config, round int) (result, error) {
	res := result{wl: w.name, cfg: c, round: round}
	var prefix []string
	// farmem writes its latency histograms here at exit (none if it is killed).
	latPath := filepath.Join(h.work, "latency.csv")
	os.Remove(latPath)
	// and its whole summary, in raw numbers.
	sumPath := filepath.Join(h.work, "summary.json")
	os.Remove(sumPath)
	switch c.kind {
	case "farmem":
		res.capMiB = h.capMiB(w, c.pct)
		bin := farmemBin
		if c.before {
			bin = beforeBin
		}
		prefix = []string{bin, "run", "--local-mem", fmt.Sprintf("%dMiB", res.capMiB), "--latency-out", latPath, "--summary-json", sumPath}
		if c.remote != "" {
			prefix = append(prefix, "--ctrl", h.cluster.ctrl, "--token-file", h.cluster.token)
			if c.remote == "shm" {
				prefix = append(prefix, "--transport", "shm", "--shm", h.cluster.shm)
			}
		}
		if c.prefetch != "" {
			prefix = append(prefix, "--prefetch", c.prefetch)
		}
		if c.program {
			prefix = append(prefix, "--serve-faults", "program")
		}
		prefix = append(prefix, "--")
	case "swap":
		res.capMiB = h.capMiB(w, c.pct)
		// The cgroup's limit charges page cache and kernel memory too, which farmem's cap does
		// not: give it what the native run was charged beyond its peak RSS.
		res.limitB = int64(res.capMiB)<<20 + h.refs[w.name].overhead
		swapMiB := h.refs[w.name].peakMiB + 64
		if err := runSwap("on", c.swap, strconv.Itoa(swapMiB)); err != nil {
			return res, fmt.Errorf("swap setup: %w", err)
		}
		if err := runSwap("cgroup", "run", strconv.FormatInt(res.limitB, 10)); err != nil {
			return res, err
		}
		prefix = []string{swapScript, "exec", "run"}
	case "floor":
		res.capMiB = h.capMiB(w, c.pct)
		prefix = []string{floorBin, "--local-mem", fmt.Sprintf("%dMiB", res.capMiB)}
		if c.inproc {
			prefix = append(prefix, "--inproc")
		}
		prefix = append(prefix, "--")
	}
	warm(h.refs[w.name].peakMiB)
	vm0 := vmstat()
	r, out, _, err := h.exec(w, prefix, h.limit(w))
	vm1 := vmstat()
	if c.kind == "swap" {
		st, serr := cgStats("run")
		if st["oom_kills"] > 0 {
			// The kernel's OOM killer ended the program: Linux swap could not hold it at this
			// limit. That is a result (reported, throughput 0), not the harness failing.
			res.oom, err = true, nil
		}
		if offErr := swapOff(); offErr != nil && err == nil {
			err = offErr
		}
		if err == nil && serr != nil {
			err = serr
		}
		res.faults = uint64(st["pgmajfault"])
		res.peakB, res.peakCgroup = st["max_usage_bytes"], true
		res.inB = (vm1["pswpin"] - vm0["pswpin"]) * 4096
		res.outB = (vm1["pswpout"] - vm0["pswpout"]) * 4096
	}
	if err != nil {
		return res, err
	}
	res.wall, res.tput, res.p50, res.p99, res.timeout = r.wall, r.tput, r.p50, r.p99, r.timeout
	res.userS, res.sysS = r.userS, r.sysS
	res.vmMajflt = vm1["pgmajfault"] - vm0["pgmajfault"]
	if res.oom {
		res.tput, res.timeout = 0, true // stopped (the CSV's 0 is no throughput: summarize skips it)
		return res, nil
	}
	if res.timeout {
		return res, nil
	}
	if err := h.verify(w, out); err != nil {
		path := filepath.Join(h.work, fmt.Sprintf("%s-%s-%d-%d.log", w.name, c.name(), c.pct, round))
		os.WriteFile(path, []byte(out), 0o644)
		return res, fmt.Errorf("%w (output in %s)", err, path)
	}
	if c.kind == "floor" {
		res.floor = parseFloor(out)
		if res.floor == nil {
			return res, fmt.Errorf("floorpager printed no summary line:\n%s", tail(out, 10))
		}
		res.faults = uint64(res.floor["refaults"])
		res.inB, res.outB = res.faults*4096, uint64(res.floor["evicted"])*4096
		res.peakB = int64(res.floor["peak_anon_kib"]) << 10 // sampled after each batch
	}
	if c.kind == "farmem" {
		// Its numbers, raw (none if it was stopped before it could write them).
		if sum, err := readSummary(sumPath); err == nil {
			sum.apply(&res)
		} else {
			h.progress("%s %s %d%% round %d: no --summary-json: %v", w.name, c.name(), c.pct, round, err)
		}
		os.Remove(sumPath)
		// The whole distribution, for the fault-latency CDF. A run without it still counts
		// (the report says how many lack it).
		lat, err := readLatency(latPath)
		if err != nil {
			h.progress("%s %s %d%% round %d: no latency histograms: %v", w.name, c.name(), c.pct, round, err)
		}
		res.lat = lat
		os.Remove(latPath)
	}
	return res, nil
}

// verify checks the workload's own verdict.
func (h *harness) verify(w workload, out string) error {
	switch {
	case w.server != "":
		if !regexp.MustCompile(`(?m)^` + driverName(w) + `: OK `).MatchString(out) {
			return fmt.Errorf("%s did not report OK", driverName(w))
		}
	case strings.HasPrefix(w.name, "micro"):
		if !regexp.MustCompile(`(?m)^micro: OK bad=0$`).MatchString(out) {
			return errors.New("micro did not report OK bad=0")
		}
	case w.digest != nil:
		// The program checks what it can itself (matmul.py its product against a closed
		// form, HeapGraph and objects.js their structures); the checksum must also be native's.
		m := w.digest.FindStringSubmatch(out)
		if m == nil {
			return fmt.Errorf("%s: no OK checksum line", w.name)
		}
		if want := h.refs[w.name].checksum; m[1] != want {
			return fmt.Errorf("%s: checksum %s, the native run's is %s", w.name, m[1], want)
		}
	}
	return nil
}

// exec runs the workload once under prefix and returns its timing and output (the program's,
// then farmem's summary) and, for a batch program run natively, its peak RSS in bytes
// (redis-server's VmHWM for a server).
func (h *harness) exec(w workload, prefix []string, limit time.Duration) (result, string, int64, error) {
	if w.server != "" {
		return h.execServer(w, prefix, limit)
	}
	var res result
	args := append(append([]string{}, prefix...), w.args...)
	ctx, cancel := context.WithTimeout(h.ctx, limit)
	defer cancel()
	cmd := command(ctx, args)
	var buf strings.Builder
	cmd.Stdout, cmd.Stderr = &buf, &buf
	t0 := time.Now()
	err := cmd.Run()
	res.wall = time.Since(t0).Seconds()
	if h.ctx.Err() != nil {
		return res, buf.String(), 0, h.ctx.Err()
	}
	if ctx.Err() != nil {
		res.timeout = true
		return res, buf.String(), 0, nil
	}
	if err != nil {
		return res, buf.String(), 0, fmt.Errorf("%s: %v; last output:\n%s", strings.Join(args, " "), err, tail(buf.String(), 10))
	}
	out := buf.String()
	var hwm int64
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		hwm = ru.Maxrss << 10
		// The process and the children it waited for: farmem's program, the floor's, a
		// swap run's shell exec'ed into the program.
		res.userS = float64(ru.Utime.Nano()) / 1e9
		res.sysS = float64(ru.Stime.Nano()) / 1e9
	}
	// micro: pages over the passes' time; pagerank: edges over the iterations' time.
	var work, secs float64
	re := regexp.MustCompile(`(?m)^micro: pass\d+ pages=(\d+) secs=([0-9.]+)`)
	rate := false // the match is (secs, rate), not (work, secs)
	switch w.name {
	case "pagerank":
		re, rate = regexp.MustCompile(`(?m)^pagerank: iter\d+ secs=([0-9.]+) edges_per_sec=(\d+)`), true
	case "numpy-matmul":
		re, rate = regexp.MustCompile(`(?m)^matmul: rep\d+ secs=([0-9.]+) gflops=([0-9.]+)`), true
	case "jvm-g1", "jvm-parallel", "node":
		re = runtimePass // updates over the passes' time
	}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		a, _ := strconv.ParseFloat(m[1], 64)
		b, _ := strconv.ParseFloat(m[2], 64)
		if rate {
			work, secs = work+a*b, secs+a
		} else {
			work, secs = work+a, secs+b
		}
	}
	if secs > 0 {
		res.tput = work / secs
	}
	return res, out, hwm, nil
}

func command(ctx context.Context, args []string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, args[0], args[1:]...)
	// Its own process group, so that a stop reaches farmem's child (or redis-server) too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (h *harness) execServer(w workload, prefix []string, limit time.Duration) (result, string, int64, error) {
	var res result
	port, err := freePort()
	if err != nil {
		return res, "", 0, err
	}
	args := append(append([]string{}, prefix...), serverArgs(w, port)...)
	ctx, cancel := context.WithTimeout(h.ctx, limit+30*time.Second)
	defer cancel()
	srv := command(ctx, args)
	var sbuf strings.Builder
	srv.Stdout, srv.Stderr = &sbuf, &sbuf
	if err := srv.Start(); err != nil {
		return res, "", 0, err
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	stopServer := func() {
		syscall.Kill(-srv.Process.Pid, syscall.SIGKILL)
		<-done
	}
	dctx, dcancel := context.WithTimeout(h.ctx, limit)
	defer dcancel()
	drv := command(dctx, []string{"bin/" + driverName(w), "--addr", fmt.Sprintf("127.0.0.1:%d", port), "--keys", strconv.Itoa(w.keys),
		"--ops", strconv.Itoa(w.ops), "--get-ratio", strconv.FormatFloat(w.getRatio, 'f', -1, 64), "--wait", "30s"})
	var dbuf strings.Builder
	drv.Stdout, drv.Stderr = &dbuf, &dbuf
	t0 := time.Now()
	derr := drv.Run()
	res.wall = time.Since(t0).Seconds()
	if h.ctx.Err() != nil {
		stopServer()
		return res, "", 0, h.ctx.Err()
	}
	if dctx.Err() != nil {
		stopServer()
		res.timeout = true
		return res, dbuf.String(), 0, nil
	}
	if derr != nil {
		stopServer()
		return res, "", 0, fmt.Errorf("%s: %v:\n%s\nserver:\n%s", driverName(w), derr, tail(dbuf.String(), 5), tail(sbuf.String(), 10))
	}
	// The server's peak RSS (it runs under the wrapper's exec, so its pid is the leader's,
	// unless farmem runs it: then this is unused).
	var hwm int64
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", srv.Process.Pid)); err == nil {
		if m := regexp.MustCompile(`VmHWM:\s+(\d+) kB`).FindSubmatch(b); m != nil {
			v, _ := strconv.ParseInt(string(m[1]), 10, 64)
			hwm = v << 10
		}
		if m := regexp.MustCompile(`RssFile:\s+(\d+) kB`).FindSubmatch(b); m != nil {
			v, _ := strconv.ParseInt(string(m[1]), 10, 64)
			h.fileRSS = v << 10
		}
	}
	if w.server == "redis" {
		exec.Command("redis-cli", "-p", strconv.Itoa(port), "shutdown", "nosave").Run()
	} else {
		// memcached stops on SIGTERM (farmem forwards it when it runs memcached).
		srv.Process.Signal(syscall.SIGTERM)
	}
	select {
	case err := <-done:
		if err != nil && !(w.server == "memcached" && termExit(err)) {
			return res, "", 0, fmt.Errorf("redis-server exited: %v:\n%s", err, tail(sbuf.String(), 10))
		}
	case <-time.After(60 * time.Second):
		stopServer()
		return res, "", 0, fmt.Errorf("%s did not exit within 60 s of being stopped:\n%s", w.server, tail(sbuf.String(), 10))
	}
	out := dbuf.String() + sbuf.String()
	if m := regexp.MustCompile(`(?m)^` + driverName(w) + `: run .* ops_per_sec=(\d+)$`).FindStringSubmatch(out); m != nil {
		res.tput, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := regexp.MustCompile(`(?m)^` + driverName(w) + `: run_latency .* p50_us=([0-9.]+) p99_us=([0-9.]+)`).FindStringSubmatch(out); m != nil {
		res.p50, _ = strconv.ParseFloat(m[1], 64)
		res.p99, _ = strconv.ParseFloat(m[2], 64)
	}
	return res, out, hwm, nil
}

// driverName: redisdrive or memcachedrive (its binary and the prefix of its output lines).
func driverName(w workload) string {
	if w.server == "redis" {
		return "redisdrive"
	}
	return "memcachedrive"
}

func serverBin(w workload) string {
	if w.server == "redis" {
		return "redis-server"
	}
	return "memcached"
}

// serverArgs is the server's command line: no persistence for redis; for memcached room for
// every item (an evicted item would fail the driver's check) and its default 4 threads.
func serverArgs(w workload, port int) []string {
	if w.server == "redis" {
		return []string{"redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}
	}
	mib := w.keys*2200/(1<<20) + 64
	return []string{"memcached", "-p", strconv.Itoa(port), "-l", "127.0.0.1", "-U", "0", "-m", strconv.Itoa(mib), "-u", "root"}
}

// termExit: the process ended because of the SIGTERM it was sent (directly, or forwarded by
// farmem, which then exits 128+15).
func termExit(err error) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
		return true
	}
	return ee.ExitCode() == 128+int(syscall.SIGTERM)
}

func runSwap(args ...string) error {
	out, err := exec.Command(swapScript, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("linux-swap.sh %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func swapOff() error { return runSwap("off") }

func cgStats(name string) (map[string]int64, error) {
	out, err := exec.Command(swapScript, "stats", name).Output()
	if err != nil {
		return nil, fmt.Errorf("linux-swap.sh stats %s: %v", name, err)
	}
	m := map[string]int64{}
	for _, f := range strings.Fields(string(out)) {
		k, v, ok := strings.Cut(f, "=")
		if n, err := strconv.ParseInt(v, 10, 64); ok && err == nil {
			m[k] = n
		}
	}
	return m, nil
}

func vmstat() map[string]uint64 {
	m := map[string]uint64{}
	f, err := os.Open("/proc/vmstat")
	if err != nil {
		return m
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, _ := strings.Cut(s.Text(), " ")
		if k == "pswpin" || k == "pswpout" || k == "pgmajfault" {
			m[k], _ = strconv.ParseUint(v, 10, 64)
		}
	}
	return m
}

// median of the values (summarize gives it the runs that finished only: a stopped run has no
// throughput, and is counted beside the median, not entered as a 0).
func median(v []float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// fmtTput prints a throughput: whole numbers for rates in the hundreds and up, three significant
// digits below (GFLOP/s).
func fmtTput(v float64) string {
	if v < 100 {
		return fmt.Sprintf("%.3g", v)
	}
	return fmt.Sprintf("%.0f", v)
}
