// Command ctrlsim drives the ctrl's state machine (ctrl.Cluster, the code `farmem ctrl` runs)
// with a simulated clock, simulated memory servers and client sessions, and counts what the
// etcd store would write (ctrl.EtcdSaveTxn, the function EtcdStore.Save calls): placement
// balance over time, the time and bytes to restore every replica after each loss of servers,
// etcd transactions and bytes per second, and the CPU of each decision. No etcd, no network:
// the only timing is the CPU the state machine's calls take, measured around each.
//
// It writes DIR/series.csv (one row per interval), DIR/losses.csv (one row per loss),
// DIR/cpu.csv (one row per kind of call), DIR/run.csv (the command, commit and parameters),
// then DIR/ctrlsim.md and DIR/ctrlsim.svg made from those files alone (-render DIR re-makes
// them without running).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ctrlsim:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	p := DefaultParams()
	fs := flag.NewFlagSet("ctrlsim", flag.ContinueOnError)
	fs.IntVar(&p.Servers, "servers", p.Servers, "memory servers at the start")
	fs.IntVar(&p.RackSize, "rack", p.RackSize, "servers per rack (a rack loss takes them all)")
	fs.IntVar(&p.Sessions, "sessions", p.Sessions, "client sessions kept open")
	fs.IntVar(&p.SlabsPerSession, "slabs", p.SlabsPerSession, "mean slabs per session")
	fs.IntVar(&p.Replicas, "replicas", p.Replicas, "copies per slab")
	capGiB := fs.Float64("capacity-gib", float64(p.CapacityPages*4096)/(1<<30), "each server's capacity, GiB")
	fs.Uint64Var(&p.Seed, "seed", p.Seed, "randomness of the ctrl and of the scenario")
	fs.DurationVar(&p.Duration, "duration", p.Duration, "simulated time")
	fs.DurationVar(&p.WarmUp, "warmup", p.WarmUp, "sessions open spread over this")
	fs.DurationVar(&p.ChurnFrom, "churn-from", p.ChurnFrom, "server churn starts then")
	fs.DurationVar(&p.ChurnEvery, "churn-every", p.ChurnEvery, "one server leaves and one joins this often (0: never)")
	losses := fs.String("rack-losses", durations(p.RackLosses), "times of whole-rack losses, comma-separated")
	fs.DurationVar(&p.RackReturn, "rack-return", p.RackReturn, "a lost rack comes back as new servers this long after (0: never)")
	gbit := fs.Float64("nic-gbit", p.ServerBW*8/1e9, "every server's and client host's NIC, Gbit/s each way")
	fs.DurationVar(&p.SaveEvery, "save-every", p.SaveEvery, "the changes of this interval are one etcd transaction")
	fs.BoolVar(&p.SavePerChange, "save-per-change", false, "also save after every request that changed the state (the service's pace when requests come one at a time)")
	out := fs.String("out", "results/ctrlsim", "directory of the results")
	commit := fs.String("commit", "", "the commit measured (default: git's HEAD, -dirty if tracked files differ)")
	render := fs.String("render", "", "re-make DIR's report from its CSVs; run nothing")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if *render != "" {
		return renderDir(*render)
	}
	var err error
	if p.RackLosses, err = parseDurations(*losses); err != nil {
		return err
	}
	p.CapacityPages = uint64(*capGiB * (1 << 30) / 4096)
	p.ServerBW, p.ClientBW = *gbit*1e9/8, *gbit*1e9/8
	if *commit == "" {
		*commit = gitCommit()
	}
	runtime.LockOSThread() // the meter reads this thread's CPU time
	meter := &cpuMeter{}
	sim, err := NewSim(p, meter)
	if err != nil {
		return err
	}
	sim.progress = func(format string, a ...any) { fmt.Fprintf(os.Stderr, format+"\n", a...) }
	var ru0 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	runErr := sim.Run()
	var ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := tv(ru1.Utime) + tv(ru1.Stime) - tv(ru0.Utime) - tv(ru0.Stime)
	info := runInfo{
		Command: "go run ./workloads/ctrlsim " + strings.Join(args, " "), Commit: *commit,
		Date: time.Now().UTC().Format("2006-01-02 15:04 UTC"), Go: runtime.Version(), CPUs: runtime.NumCPU(),
		WallS: time.Since(start).Seconds(), CPUS: cpu.Seconds(), Params: p,
	}
	if err := writeRun(*out, info, sim, meter); err != nil {
		return err
	}
	if runErr != nil {
		return runErr
	}
	return renderDir(*out)
}

func tv(t syscall.Timeval) time.Duration { return time.Duration(t.Nano()) }

func gitCommit() string {
	b, err := exec.Command("git", "rev-parse", "--short=12", "HEAD").Output()
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(string(b))
	if exec.Command("git", "diff", "--quiet", "HEAD", "--").Run() != nil {
		c += "-dirty"
	}
	return c
}

func durations(d []time.Duration) string {
	var s []string
	for _, v := range d {
		s = append(s, v.String())
	}
	return strings.Join(s, ",")
}

func parseDurations(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("-rack-losses: %q is not a positive duration", f)
		}
		out = append(out, d)
	}
	return out, nil
}
