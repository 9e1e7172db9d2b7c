// Package prefetch predicts, from one process's stream of demand page faults, which pages to
// fetch from far memory before the process asks for them.
//
// It is pure policy: a Prefetcher is a deterministic state machine fed one fault at a time
// (Access) that answers with page numbers. It does no I/O, reads no clock, starts no
// goroutine and takes no lock; the fault path (fetcher) owns one Prefetcher per process,
// calls it from that process's fault thread, and fetches what it returns. Recorded fault
// traces are scored offline by the same code through a Replayer, so what `farmem sim`
// measures is what `farmem run` does, in either of its modes: map mode installs predicted
// pages into the program, where its accesses to them are invisible and the hits fed back are
// inferred from where its next miss lands (ConsumedBetween); cache mode, Leap's, holds them in
// a prefetch cache, where a hit is a fault and seen as one.
//
// # Majority-trend prefetching (Leap)
//
// The default, "leap", is the prefetcher of Leap (H. Al Maruf and M. Chowdhury, "Effectively
// Prefetching Remote Memory with Leap", USENIX ATC 2020). It keeps, per process, a ring of
// the last H page deltas (page - previous faulting page; H = History, 32 by default) and
// looks for a trend with the Boyer-Moore majority vote over the newest w deltas, starting
// with a small window (w = H/Split, H/4 by default, as in the authors' kernel code) and
// doubling it up to H until some delta holds a strict majority (more than w/2 of the w
// slots; slots not filled yet vote for nothing). A small window follows a new trend fast; a
// wide one keeps a trend across a few irregular faults. A majority delta of 0 is no trend.
//
// How much to fetch (the prefetch window) follows the paper's GETPREFETCHWINDOWSIZE, and
// is decided on each miss (a fault not served by an earlier prediction), as the authors'
// kernel and Linux do; hits in between are counted, not answered:
//
//   - with h > 0 prefetch hits since the last decision, the window is h+1 rounded up to a
//     power of two (the last window was used up, so try twice as much), capped at Max;
//   - with no hit, it is 1 if a trend was found (start cautiously) and 0 if not;
//   - it never drops below half the previous window, so one bad guess does not stop a
//     stream that was working: 8 -> 4 -> 2 -> 1 -> 0;
//   - it fetches window pages page+d, page+2d, ... along the trend d found now or, when
//     none is found, speculatively along the previous trend, for as long as the window is
//     not zero. A zero window prefetches nothing until a trend appears again.
//
// The authors' kernel patch (mm/swap_state.c of their Leap tree) sizes the window with
// Linux's swap read-ahead heuristic and falls back to Linux's aligned cluster when no trend
// is found; like the paper, we use the window rules above and the previous trend instead.
//
// # Leap beside a table of walks ("streams")
//
// "streams" answers as Leap does and adds the pages after a miss that continues one of the
// process's last few sequential walks (streams.go): a collector that allocates or copies in
// order while the program reads its heap at random interleaves the two in one fault stream,
// where Leap's vote finds no trend.
//
// # Baselines
//
// The same interface offers the baselines Leap is compared with:
//
//   - "none" never prefetches.
//   - "nextn" fetches the next Max pages after every fault (next-N-line prefetching, issued
//     on hits too, so a sequential scan stays Max pages ahead).
//   - "stride" is Baer and Chen's reference-prediction entry ("An effective on-chip preloading
//     scheme to reduce data access penalty", Supercomputing 1991) for the one stream of a
//     process: a stride and a four-state confidence machine (initial, transient, steady,
//     no-prediction). In the steady state it fetches Max pages along the stride on every
//     fault; one irregular fault drops it back to initial without forgetting the stride.
//   - "readahead" is Linux's swap read-ahead (mm/swap_state.c: swapin_nr_pages and
//     swap_cluster_readahead), the swap-side sibling of the on-demand file read-ahead of
//     mm/readahead.c: on a miss, the window is the hits since the last miss plus 2, rounded up
//     to a power of two (at least 4), capped at Max and never below half the last window; with
//     no hit it is 2 if this fault is next to the last one and 1 (no read-ahead) otherwise.
//     It fetches the other pages of the aligned cluster of that many pages holding the fault
//     (from the fault's page rounded down to a multiple of the window), nearest first. Like
//     Linux it starts with 4 hits in hand, so a process's first fault reads a whole cluster.
//
// # Page numbers
//
// Pages are page numbers (a virtual address >> 12), one address space per Prefetcher.
// Predictions never include the faulting page, never wrap below page 0 or above the largest
// page number, and never exceed Max pages. They may name pages that are resident or already
// fetched: the caller drops those.
package prefetch

import (
	"fmt"
	"strings"
)

// Prefetcher predicts, from one process's stream of demand faults, which pages to fetch
// ahead. It is not safe for concurrent use: the fault path feeds each process's Prefetcher
// from that process's one fault thread.
type Prefetcher interface {
	// Access feeds one demand fault on page (a page number: address >> 12) and appends the
	// pages to fetch ahead of demand to out, nearest first. hit reports that the page was
	// served from pages this prefetcher predicted earlier (a prefetch-cache hit): it drives
	// window adaptation. It must not allocate when out has capacity (Max pages).
	//
	// Feed every fault that needs a page's contents (from far memory or the prefetch cache),
	// hits included: the history and the hit counts must see the whole stream. Leap and
	// readahead answer only on misses, as in their originals; nextn and stride on every fault.
	Access(page uint64, hit bool, out []uint64) []uint64
	// Name is the prefetcher's name as New takes it.
	Name() string
}

// The prefetchers' names, as Config.Name and the command line spell them.
const (
	NameLeap      = "leap"
	NameReadahead = "readahead"
	NameStride    = "stride"
	NameNextN     = "nextn"
	NameNone      = "none"
)

// Defaults for a zero Config field.
const (
	DefaultName    = NameLeap // farmem run's default too (cmd/farmem/prefetch_flags.go)
	DefaultHistory = 32       // Leap's deltas kept, as in the paper's evaluation
	DefaultSplit   = 4        // Leap's first window is History/4, as in the authors' code
	DefaultMax     = 8        // pages per prediction: Linux's default swap cluster (page-cluster 3)
)

// Bounds on Config: past them a setting is a mistake, not a tuning.
const (
	MaxHistory = 1 << 12 // deltas; each miss votes over at most this many
	MaxMax     = 1 << 10 // pages (4 MiB) fetched for one fault
)

// Config selects a prefetcher and its parameters. A zero field takes its default; every
// prefetcher accepts every field and ignores those it has no use for.
type Config struct {
	// Name is one of Names(); "" means DefaultName.
	Name string
	// History is how many page deltas Leap keeps and votes over at most (H).
	History int
	// Split sets Leap's first vote window to History/Split deltas; the window doubles up to
	// History. A power of two that divides History.
	Split int
	// Max is the most pages one fault may prefetch: Leap's and readahead's window cap
	// (readahead uses the largest power of two not above it: its clusters are aligned),
	// next-N's N and stride's degree.
	Max int
}

// Names lists the prefetchers New knows, the default first.
func Names() []string {
	return []string{NameLeap, NameStreams, NameReadahead, NameStride, NameNextN, NameNone}
}

// WithDefaults returns c with its zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.History == 0 {
		c.History = DefaultHistory
	}
	if c.Split == 0 {
		c.Split = DefaultSplit
	}
	if c.Max == 0 {
		c.Max = DefaultMax
	}
	return c
}

// Validate reports the first setting of c that New would refuse, naming the valid choices.
func (c Config) Validate() error {
	c = c.WithDefaults()
	known := false
	for _, n := range Names() {
		known = known || n == c.Name
	}
	switch {
	case !known:
		return fmt.Errorf("unknown prefetcher %q: choose one of %s", c.Name, strings.Join(Names(), ", "))
	case c.History < 2 || c.History > MaxHistory:
		return fmt.Errorf("prefetch history %d: give 2 to %d page deltas", c.History, MaxHistory)
	case c.Split < 1 || c.Split&(c.Split-1) != 0 || c.Split > c.History || c.History%c.Split != 0:
		return fmt.Errorf("prefetch split %d: give a power of two that divides the history (%d)", c.Split, c.History)
	case c.Max < 1 || c.Max > MaxMax:
		return fmt.Errorf("prefetch max %d: give 1 to %d pages", c.Max, MaxMax)
	}
	return nil
}

// New returns a fresh prefetcher (an empty history) configured by c.
func New(c Config) (Prefetcher, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	c = c.WithDefaults()
	switch c.Name {
	case NameLeap:
		return newLeap(c.History, c.Split, c.Max), nil
	case NameStreams:
		return newStreams(c.History, c.Split, c.Max), nil
	case NameReadahead:
		return newReadahead(c.Max), nil
	case NameStride:
		return &stride{degree: c.Max}, nil
	case NameNextN:
		return &nextN{n: c.Max}, nil
	default:
		return none{}, nil
	}
}

// none never prefetches: the baseline every other prefetcher must beat.
type none struct{}

func (none) Access(_ uint64, _ bool, out []uint64) []uint64 { return out }
func (none) Name() string                                   { return NameNone }

// appendStride appends page+k*delta for k = 1..n to out, stopping before a page would wrap
// below 0 or past the largest page number. delta must not be 0.
func appendStride(out []uint64, page uint64, delta int64, n int) []uint64 {
	// |delta| as uint64: correct for math.MinInt64 too, whose negation wraps to itself.
	step := uint64(delta)
	if delta < 0 {
		step = -step
	}
	for range n {
		if delta > 0 {
			if page > ^uint64(0)-step {
				break
			}
			page += step
		} else {
			if page < step {
				break
			}
			page -= step
		}
		out = append(out, page)
	}
	return out
}
