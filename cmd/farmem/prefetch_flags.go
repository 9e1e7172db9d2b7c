package main

import (
	"fmt"
	"os"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/faulttrace"
	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/prefetch"
)

// farmem run's prefetching defaults, chosen by the side-by-side benchmarks. Of the prefetchers
// Leap's paper and Linux offer, Leap in map mode was the only one never clearly slower than none
// (results/prefetch.md, "The default"). streams answers as Leap does and adds the sequential
// walks Leap's vote misses among random faults: it took fewer backend faults than Leap on every
// workload measured, for the same throughput (results/prefetch-streams/swap.md,
// results/runtimes/why.md). A window of up to 32 pages rather than the paper's 8 cuts a
// sequential or strided stream's remaining misses further (in map mode every miss is a uffd
// round trip plus a fetch, and a stream pays one miss per window) at no cost on random faults
// (results/prefetch.md). The package's own default (prefetch.DefaultMax: 8) stays the paper's:
// farmem sim scores cache mode with it, as Leap did, and map mode with this one, as farmem run
// does, unless told --prefetch-max.
const (
	runDefaultPrefetch    = prefetch.NameStreams
	runDefaultPrefetchMax = 32
)

// prefetchFlags are farmem run's prefetcher settings.
func prefetchFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "prefetch", Value: runDefaultPrefetch, Usage: "which evicted pages to bring back before they are touched: streams (leap, and the\n\tsequential walks it misses among random faults), leap (the majority trend of the recent page\n\tdeltas, as in Leap), readahead (Linux's swap read-ahead), stride, nextn, or none. farmem sim compares them on a trace recorded with --record-faults"},
		&cli.StringFlag{Name: "record-faults", Usage: "write every fault served to FILE (time, pid, page, kind, source) for farmem sim. It implies\n\t--prefetch none unless --prefetch is given: a prefetcher's right guesses never fault, so the\n\ttrace would miss them", TakesFile: true},
		&cli.IntFlag{Name: "prefetch-history", Value: prefetch.DefaultHistory, Usage: "leap: page deltas kept and voted over"},
		&cli.IntFlag{Name: "prefetch-max", Value: runDefaultPrefetchMax, Usage: fmt.Sprintf("most pages prefetched for one fault (1 to %d)", fetcher.MaxPrefetchBatch)},
		&cli.StringFlag{Name: "prefetch-mode", Value: modeMap, Usage: "where predicted pages go: map (installed in the program at once, so a right guess costs\n\tno fault) or cache (Leap's: held in a prefetch cache until their fault, which takes them out)"},
		&cli.IntFlag{Name: "prefetch-cache-pages", Usage: "cache mode: the prefetch cache's size in pages, counted against --local-mem", DefaultText: "1/16 of the cap, 64 to 8192"},
	}
}

const (
	modeMap   = "map"
	modeCache = "cache"
)

// prefetchCachePages reads --prefetch-mode and --prefetch-cache-pages for a cap of capBytes:
// the cache's size in cache mode, 0 in map mode.
func prefetchCachePages(c *cli.Context, capBytes int64) (int, error) {
	n, capPages := c.Int("prefetch-cache-pages"), capBytes/fetcher.PageSize
	switch c.String("prefetch-mode") {
	case modeMap:
		if c.IsSet("prefetch-cache-pages") {
			return 0, usagef("--prefetch-cache-pages applies to --prefetch-mode cache")
		}
		return 0, nil
	case modeCache:
	default:
		return 0, usagef("--prefetch-mode %q: give map or cache", c.String("prefetch-mode"))
	}
	if !c.IsSet("prefetch-cache-pages") {
		return int(max(64, min(capPages/16, 8192))), nil
	}
	if n < 1 || int64(n) > capPages/2 {
		return 0, usagef("--prefetch-cache-pages %d: give 1 to %d (half the cap)", n, capPages/2)
	}
	return n, nil
}

// prefetchOptions reads and checks the prefetch flags.
func prefetchOptions(c *cli.Context) (prefetch.Config, error) {
	cfg := prefetch.Config{Name: c.String("prefetch"), History: c.Int("prefetch-history"), Max: c.Int("prefetch-max")}
	if c.IsSet("record-faults") && !c.IsSet("prefetch") {
		cfg.Name = prefetch.NameNone // a trace for farmem sim holds every re-fault
	}
	// A zero field would take its default: as a flag it is a mistake.
	if h := cfg.History; h < 2 {
		return cfg, usagef("--prefetch-history %d: give at least 2 page deltas", h)
	}
	if m := cfg.Max; m < 1 || m > fetcher.MaxPrefetchBatch {
		return cfg, usagef("--prefetch-max %d: give 1 to %d pages", m, fetcher.MaxPrefetchBatch)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, usagef("--prefetch: %v", err)
	}
	return cfg, nil
}

// openTrace creates --record-faults's file, if given: a path that cannot be written is bad
// input, found before the program starts.
func openTrace(c *cli.Context) (*faulttrace.Writer, error) {
	path := c.String("record-faults")
	if path == "" {
		return nil, nil
	}
	w, err := faulttrace.Create(path)
	if err != nil {
		return nil, usagef("--record-faults: %v", err)
	}
	return w, nil
}

// closeTrace flushes the trace and says how many faults it holds.
func closeTrace(c *cli.Context, w *faulttrace.Writer) error {
	if err := w.Close(); err != nil {
		return fmt.Errorf("--record-faults %s: %w", c.String("record-faults"), err)
	}
	if !c.Bool("quiet") {
		fmt.Fprintf(os.Stderr, "farmem: recorded %d faults to %s\n", w.Records(), c.String("record-faults"))
	}
	return nil
}
