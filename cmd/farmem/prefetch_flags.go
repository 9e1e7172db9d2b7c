package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/prefetch"
)

// prefetchFlags are farmem run's prefetcher settings.
func prefetchFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "prefetch", Value: prefetch.DefaultName, Usage: fmt.Sprintf("which pages to bring back before they are touched: leap (Leap's majority trend of\n\tthe page deltas), readahead (Linux's swap read-ahead), stride, nextn, or none (%s)", "farmem sim compares them on a recorded trace")},
		&cli.IntFlag{Name: "prefetch-history", Value: prefetch.DefaultHistory, Usage: "leap: page deltas kept and voted over"},
		&cli.IntFlag{Name: "prefetch-max", Value: prefetch.DefaultMax, Usage: "most pages prefetched for one fault (the fault path fetches at most 32)"},
		&cli.StringFlag{Name: "prefetch-mode", Value: "map", Usage: "map: install predicted pages straight into the program, so a right guess costs no fault;\n\tcache: Leap's prefetch cache, from which the fault installs the page"},
	}
}

// prefetchOptions reads and checks the prefetch flags.
func prefetchOptions(c *cli.Context) (prefetch.Config, fetcher.PrefetchMode, error) {
	cfg := prefetch.Config{Name: c.String("prefetch"), History: c.Int("prefetch-history"), Max: c.Int("prefetch-max")}
	if err := cfg.Validate(); err != nil {
		return cfg, 0, usagef("--prefetch: %v", err)
	}
	mode, err := fetcher.ParsePrefetchMode(c.String("prefetch-mode"))
	if err != nil {
		return cfg, 0, usagef("--prefetch-mode: %v", err)
	}
	return cfg, mode, nil
}
