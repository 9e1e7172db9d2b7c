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

// simDefaultCachePages bounds the prefetched pages waiting unused: 16 MiB, room for a few
// thousand windows.
const simDefaultCachePages = 4096

// simModeBoth is --mode's default: a row per mode.
const simModeBoth = "both"

func simCommand() *cli.Command {
	return &cli.Command{
		Name:  "sim",
		Usage: "replay a fault trace through prefetchers and report their accuracy, coverage and timeliness;\n\tor, with --cap-pages, an access stream through eviction policies",
		Description: "Each process in the trace gets its own prefetcher. --mode says where predicted pages go,\n" +
			"as farmem run's --prefetch-mode; each row's MODE column says which:\n" +
			"  map    farmem run's default: a predicted page is installed in the program right away,\n" +
			"         so touching it never faults (a hit nobody sees). On each miss the prefetcher is fed\n" +
			"         the pages the program must have used to get there (those installed at the last\n" +
			"         miss that lie on its way), as farmem run infers them, then the miss. Max window\n" +
			fmt.Sprintf("         %d pages, as farmem run's --prefetch-max\n", runDefaultPrefetchMax) +
			"  cache  Leap's: predicted pages wait in a FIFO prefetch cache; a fault that finds its\n" +
			"         page there is a hit, seen and fed to the prefetcher, and frees its page. Max\n" +
			fmt.Sprintf("         window %d pages, as in the paper\n", prefetch.DefaultMax) +
			"Either way at most --cache-pages prefetched pages wait unused (installed or cached); when\n" +
			"full, the oldest goes first, as farmem run's evictor takes installed pages in install\n" +
			"order. Per row:\n" +
			"  MAX          the prefetch window cap (--prefetch-max, else the mode's default)\n" +
			"  HITS/MISSES  faults whose page was prefetched (map mode: would not have faulted) / the\n" +
			"               faults that went to far memory\n" +
			"  PREFETCHED   pages fetched ahead; POLLUTION: those never used (evicted or left over)\n" +
			"  ACCURACY     hits / prefetched;  COVERAGE: hits / faults\n" +
			"  LEAD         timeliness: faults of the process between a page's prefetch and its use\n" +
			"               (median and mean); LEAD=1 counts hits fetched by the fault just before,\n" +
			"               which a live run may not have received in time\n" +
			"  FED HITS     hits the prefetcher was told of: cache mode's hits; map mode's inferred\n\n" +
			"A trace is farmem run --record-faults FILE (record with --prefetch none: a trace holds the\n" +
			"run's misses only; first-touch and write-protect faults in it are skipped) or a text file\n" +
			"with one page number (address >> 12) per line, decimal or 0x-hex, optionally after a pid;\n" +
			"# starts a comment. Example: farmem sim --trace workloads/traces/leap-paper.txt\n\n" +
			"With --cap-pages, the file is an access stream instead, every access of the program (a\n" +
			"page stream from workloads/replay/pagetrace.c, or page numbers one a line), and each cap\n" +
			"gets a row per eviction policy: Belady's MIN, LRU, farmem's page table and its FIFO, with\n" +
			"their re-faults (misses on pages seen before) and farmem's contiguous runs evicted. A fault\n" +
			"trace is refused there: it holds the faults only, not the accesses to resident pages that\n" +
			"LRU counts as uses. make bench-replay compares them with live runs (results/replay.md).",
		Flags: append([]cli.Flag{
			&cli.StringFlag{Name: "trace", Usage: "the fault trace FILE to replay (binary or text); required"},
			&cli.StringFlag{Name: "prefetcher", Value: "all", Usage: "which prefetchers to compare: all, one of " + strings.Join(prefetch.Names(), ", ") + ", or a\n\tcomma list, one row each"},
			&cli.StringFlag{Name: "mode", Value: simModeBoth, Usage: "where predicted pages go: map (farmem run's default), cache (Leap's), or both (a row\n\teach)"},
			&cli.IntFlag{Name: "cache-pages", Value: simDefaultCachePages, Usage: "most prefetched pages waiting unused, in 4 KiB pages: the prefetch cache (cache mode)\n\tor the installed pages not touched yet (map mode)"},
			&cli.IntFlag{Name: "prefetch-history", Value: prefetch.DefaultHistory, Usage: "leap: page deltas kept and voted over"},
			&cli.IntFlag{Name: "prefetch-split", Value: prefetch.DefaultSplit, Usage: "leap: the first vote is over history/split deltas, doubling up to history (the paper's Nsplit)"},
			&cli.IntFlag{Name: "prefetch-max", Usage: "most pages prefetched for one fault (leap's and readahead's window cap, nextn's N, stride's\n\tdegree), in both modes",
				DefaultText: fmt.Sprintf("%d in map mode, as farmem run; %d in cache mode, as the paper", runDefaultPrefetchMax, prefetch.DefaultMax)},
			&cli.BoolFlag{Name: "json", Usage: "print the results as JSON instead of a table"},
		}, simEvictFlags()...),
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Action: func(c *cli.Context) error {
			if c.Args().Present() {
				return usagef("farmem sim takes no arguments (got %q): give the trace with --trace FILE", c.Args().First())
			}
			if c.String("trace") == "" {
				return usagef("--trace FILE is required: a fault trace from farmem run --record-faults, or a text file of page numbers")
			}
			if c.IsSet("cap-pages") {
				return simEvict(c)
			}
			for _, f := range []string{"reserve-pages", "evict-heat", "head"} {
				if c.IsSet(f) {
					return usagef("--%s is an eviction replay setting: give --cap-pages too", f)
				}
			}
			for _, f := range []string{"cache-pages", "prefetch-history", "prefetch-split", "prefetch-max"} {
				if c.Int(f) < 1 && (f != "prefetch-max" || c.IsSet(f)) {
					return usagef("--%s %d: give a positive number", f, c.Int(f))
				}
			}
			modes, err := simModes(c.String("mode"))
			if err != nil {
				return err
			}
			names, err := simPrefetchers(c.String("prefetcher"))
			if err != nil {
				return err
			}
			cfg := prefetch.Config{History: c.Int("prefetch-history"), Split: c.Int("prefetch-split"), Max: c.Int("prefetch-max")}
			if err := cfg.Validate(); err != nil {
				return usagef("%v", err)
			}
			res, err := simulate(c.String("trace"), cfg, modes, names, c.Int("cache-pages"))
			if err != nil {
				return err
			}
			return writeResult(c, res, func(w io.Writer) { printSim(w, res) })
		},
	}
}

// simModes reads --mode: map, cache, or both (map first: farmem run's default).
func simModes(arg string) ([]prefetch.Mode, error) {
	switch m := prefetch.Mode(strings.TrimSpace(arg)); m {
	case simModeBoth:
		return prefetch.Modes(), nil
	case prefetch.ModeMap, prefetch.ModeCache:
		return []prefetch.Mode{m}, nil
	}
	return nil, usagef("--mode %q: give map (farmem run's default), cache (Leap's) or both", arg)
}

// simMax is the window cap of mode's rows: --prefetch-max when given, else the mode's default
// (farmem run's in map mode, the paper's in cache mode).
func simMax(cfg prefetch.Config, mode prefetch.Mode) int {
	switch {
	case cfg.Max != 0:
		return cfg.Max
	case mode == prefetch.ModeMap:
		return runDefaultPrefetchMax
	}
	return prefetch.DefaultMax
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

// simResult is what sim reports, as the table shows it and --json prints it. Each row names
// its mode and window cap (Metrics.Mode, Metrics.Max).
type simResult struct {
	Trace      string             `json:"trace"`
	Format     string             `json:"format"`  // binary or text
	Records    uint64             `json:"records"` // in the trace
	Skipped    uint64             `json:"skipped"` // first-touch and write-protect faults: nothing to fetch
	Faults     uint64             `json:"faults"`  // replayed: Records - Skipped
	Processes  int                `json:"processes"`
	Modes      []prefetch.Mode    `json:"modes"`
	CachePages int                `json:"cache_pages"` // most prefetched pages waiting unused
	History    int                `json:"prefetch_history"`
	Split      int                `json:"prefetch_split"`
	Results    []prefetch.Metrics `json:"results"` // by mode as Modes, then by prefetcher as given
}

// simulate reads the trace at path a single time, feeding every fault to one Replayer per
// mode and name. cfg.Max 0 takes each mode's default (simMax). Trace problems are bad input:
// usage errors.
func simulate(path string, cfg prefetch.Config, modes []prefetch.Mode, names []string, cachePages int) (simResult, error) {
	res := simResult{Trace: path, Format: "text", Modes: modes, CachePages: cachePages, History: cfg.History, Split: cfg.Split}
	var reps []*prefetch.Replayer
	for _, mode := range modes {
		for _, n := range names {
			c := cfg
			c.Name, c.Max = n, simMax(cfg, mode)
			r, err := prefetch.NewReplayer(c, mode, cachePages)
			if err != nil {
				return res, usagef("%v", err)
			}
			reps = append(reps, r)
		}
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

// simModeNotes says in a line what each mode is, for the table's header.
var simModeNotes = map[prefetch.Mode]string{
	prefetch.ModeMap:   "map = farmem run's default: pages installed, hits unseen and inferred from the next miss",
	prefetch.ModeCache: "cache = Leap's: pages held in a prefetch cache, hits seen",
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
	fmt.Fprintf(out, "history %d, split %d; at most %d prefetched pages waiting unused\n", res.History, res.Split, res.CachePages)
	for _, mode := range res.Modes {
		fmt.Fprintf(out, "%s\n", simModeNotes[mode])
	}
	fmt.Fprintln(out)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PREFETCHER\tMODE\tMAX\tFAULTS\tHITS\tMISSES\tPREFETCHED\tPOLLUTION\tACCURACY\tCOVERAGE\tLEAD P50\tLEAD MEAN\tLEAD=1\tFED HITS")
	for _, m := range res.Results {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%.1f%%\t%.1f%%\t%d\t%.1f\t%d\t%d\n", m.Prefetcher, m.Mode, m.Max, m.Faults, m.Hits,
			m.Misses, m.Prefetched, m.Pollution, 100*m.Accuracy, 100*m.Coverage, m.LeadP50, m.LeadMean, m.LeadOne, m.FedHits)
	}
	tw.Flush()
}
