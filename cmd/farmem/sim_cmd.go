package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/faulttrace"
	"github.com/farmem/farmem/prefetch"
)

// simDefaultCachePages is sim's prefetch cache: 16 MiB, room for a few thousand windows.
const simDefaultCachePages = 4096

func simCommand() *cli.Command {
	return &cli.Command{
		Name:  "sim",
		Usage: "replay a fault trace through prefetchers and report their accuracy, coverage and timeliness",
		Description: "Each process in the trace gets its own prefetcher; one FIFO prefetch cache serves all (a hit\n" +
			"frees its page at once, the oldest page goes first when full). Per prefetcher:\n" +
			"  HITS/MISSES  faults served from the prefetch cache / from far memory\n" +
			"  PREFETCHED   pages fetched ahead; POLLUTION: those never used (evicted or left over)\n" +
			"  ACCURACY     hits / prefetched;  COVERAGE: hits / faults\n" +
			"  LEAD         timeliness: faults of the process between a page's prefetch and its use\n" +
			"               (median and mean); LEAD=1 counts hits fetched by the fault just before,\n" +
			"               which a live run may not have received in time\n\n" +
			"A trace is farmem run --record-faults FILE (record with --prefetch none: a trace holds the\n" +
			"run's misses only; first-touch and write-protect faults in it are skipped) or a text file\n" +
			"with one page number (address >> 12) per line, decimal or 0x-hex, optionally after a pid;\n" +
			"# starts a comment. Example: farmem sim --trace workloads/traces/leap-paper.txt",
		Flags: []cli.Flag{
			&cli.StringFlag{Name: "trace", Usage: "the fault trace FILE to replay (binary or text); required"},
			&cli.StringFlag{Name: "prefetcher", Value: "all", Usage: "which prefetchers to compare: all, one of " + strings.Join(prefetch.Names(), ", ") + ", or a\n\tcomma list, one row each"},
			&cli.IntFlag{Name: "cache-pages", Value: simDefaultCachePages, Usage: "prefetch cache size in 4 KiB pages"},
			&cli.IntFlag{Name: "prefetch-history", Value: prefetch.DefaultHistory, Usage: "leap: page deltas kept and voted over"},
			&cli.IntFlag{Name: "prefetch-split", Value: prefetch.DefaultSplit, Usage: "leap: the first vote is over history/split deltas, doubling up to history (the paper's Nsplit)"},
			&cli.IntFlag{Name: "prefetch-max", Value: prefetch.DefaultMax, Usage: "most pages prefetched for one fault (leap's and readahead's window cap, nextn's N, stride's degree)"},
			&cli.BoolFlag{Name: "json", Usage: "print the results as JSON instead of a table"},
		},
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("farmem sim takes no arguments (got %q): give the trace with --trace FILE", c.Args().First())
			}
			if c.String("trace") == "" {
				return usagef("--trace FILE is required: a fault trace from farmem run --record-faults, or a text file of page numbers")
			}
			for _, f := range []string{"cache-pages", "prefetch-history", "prefetch-split", "prefetch-max"} {
				if c.Int(f) < 1 {
					return usagef("--%s %d: give a positive number", f, c.Int(f))
				}
			}
			names, err := simPrefetchers(c.String("prefetcher"))
			if err != nil {
				return err
			}
			cfg := prefetch.Config{History: c.Int("prefetch-history"), Split: c.Int("prefetch-split"), Max: c.Int("prefetch-max")}
			if err := cfg.Validate(); err != nil {
				return usagef("%v", err)
			}
			res, err := simulate(c.String("trace"), cfg, names, c.Int("cache-pages"))
			if err != nil {
				return err
			}
			return writeResult(c, res, func(w io.Writer) { printSim(w, res) })
		},
	}
}

// simPrefetchers reads --prefetcher: all, a name, or a comma list of names.
func simPrefetchers(arg string) ([]string, error) {
	if strings.TrimSpace(arg) == "all" {
		return prefetch.Names(), nil
	}
	var names []string
	for n := range strings.SplitSeq(arg, ",") {
		n = strings.TrimSpace(n)
		if n == "" {
			return nil, usagef("--prefetcher %q: an empty name; give all, one of %s, or a comma list", arg, strings.Join(prefetch.Names(), ", "))
		}
		if !slices.Contains(prefetch.Names(), n) {
			return nil, usagef("--prefetcher: unknown prefetcher %q: choose all or among %s", n, strings.Join(prefetch.Names(), ", "))
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names, nil
}

// simResult is what sim reports, as the table shows it and --json prints it.
type simResult struct {
	Trace      string             `json:"trace"`
	Format     string             `json:"format"`  // binary or text
	Records    uint64             `json:"records"` // in the trace
	Skipped    uint64             `json:"skipped"` // first-touch and write-protect faults: nothing to fetch
	Faults     uint64             `json:"faults"`  // replayed: Records - Skipped
	Processes  int                `json:"processes"`
	CachePages int                `json:"cache_pages"`
	History    int                `json:"prefetch_history"`
	Split      int                `json:"prefetch_split"`
	Max        int                `json:"prefetch_max"`
	Results    []prefetch.Metrics `json:"results"`
}

// simulate replays the trace at path once, feeding every fault to one Replayer per name.
// Trace problems are bad input: usage errors.
func simulate(path string, cfg prefetch.Config, names []string, cachePages int) (simResult, error) {
	res := simResult{Trace: path, Format: "text", CachePages: cachePages, History: cfg.History, Split: cfg.Split, Max: cfg.Max}
	reps := make([]*prefetch.Replayer, len(names))
	for i, n := range names {
		c := cfg
		c.Name = n
		r, err := prefetch.NewReplayer(c, prefetch.ModeCache, cachePages)
		if err != nil {
			return res, usagef("%v", err)
		}
		reps[i] = r
	}
	tr, err := faulttrace.Open(path)
	if err != nil {
		return res, usagef("cannot read the trace: %v", err)
	}
	defer tr.Close()
	if tr.Binary() {
		res.Format = "binary"
	}
	for {
		rec, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return res, usagef("%v", err)
		}
		res.Records++
		if !rec.Fetched() {
			res.Skipped++
			continue
		}
		for _, r := range reps {
			r.Access(rec.Pid, rec.Page())
		}
	}
	res.Faults = res.Records - res.Skipped
	if res.Faults == 0 {
		return res, usagef("%s has no faults to replay (%d records, none fetched from far memory or the prefetch cache)", path, res.Records)
	}
	for _, r := range reps {
		m := r.Metrics()
		res.Processes = m.Processes
		res.Results = append(res.Results, m)
	}
	return res, nil
}

func printSim(out io.Writer, res simResult) {
	skipped := ""
	if res.Skipped > 0 {
		skipped = fmt.Sprintf(" (%d first-touch and write-protect faults skipped)", res.Skipped)
	}
	procs := "process"
	if res.Processes != 1 {
		procs = "processes"
	}
	fmt.Fprintf(out, "%s (%s): %d faults from %d %s%s\n", res.Trace, res.Format, res.Faults, res.Processes, procs, skipped)
	fmt.Fprintf(out, "prefetch cache %d pages; history %d, split %d, max %d\n\n", res.CachePages, res.History, res.Split, res.Max)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PREFETCHER\tFAULTS\tHITS\tMISSES\tPREFETCHED\tPOLLUTION\tACCURACY\tCOVERAGE\tLEAD P50\tLEAD MEAN\tLEAD=1")
	for _, m := range res.Results {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%.1f%%\t%.1f%%\t%d\t%.1f\t%d\n", m.Prefetcher, m.Faults, m.Hits, m.Misses,
			m.Prefetched, m.Pollution, 100*m.Accuracy, 100*m.Coverage, m.LeadP50, m.LeadMean, m.LeadOne)
	}
	tw.Flush()
}
