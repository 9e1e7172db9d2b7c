package main

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/faulttrace"
	"github.com/farmem/farmem/pagetable"
)

// The eviction side of farmem sim: an access stream replayed at a cap through farmem's victim
// choice, LRU and Belady's MIN. It needs every access, not the faults of a run (see
// faulttrace.Accesses), so its input is a page stream (workloads/replay/pagetrace.c) or a text
// list of page numbers.

// simEvictFlags are the flags of the eviction replay; --cap-pages selects it.
func simEvictFlags() []cli.Flag {
	return []cli.Flag{
		&cli.StringFlag{Name: "cap-pages", Usage: "replay an access stream through eviction policies instead of faults through prefetchers:\n\tthe caps, in 4 KiB pages, a comma list (a row per cap and policy). --trace is then an access\n\tstream: a page stream from workloads/replay/pagetrace.c or a text list of page numbers"},
		&cli.IntFlag{Name: "reserve-pages", Usage: "with --cap-pages: pages of each cap held by memory the stream does not show (the stack,\n\tlibc's data): every policy holds the cap less these"},
		&cli.IntFlag{Name: "anon-pages", Usage: "with --cap-pages: the program's anonymous pages (its RssAnon at exit, in pages); those\n\tbeyond the stream's are reserved, as --reserve-pages"},
		&cli.IntFlag{Name: "evict-heat", Value: pagetable.DefaultMaxHeat, Usage: "with --cap-pages: farmem's row replays farmem run --evict-heat N (its fifo row is 0)"},
		&cli.IntFlag{Name: "head", Usage: "with --cap-pages: the room farmem's rows keep below the cap, in pages: eviction starts at\n\thalf of it and stops at all of it, as farmem run's evictor (0: a page over the cap goes as it comes)",
			DefaultText: fmt.Sprintf("the evictor's grown head: a 16th of the cap, from %d to %d pages", evictor.GrownHead(0), evictor.GrownHead(1<<40))},
	}
}

// simEvictResult is what the eviction replay reports, as the table shows it and --json prints it.
type simEvictResult struct {
	Trace    string         `json:"trace"`
	Accesses int            `json:"accesses"` // in the stream, repeats of a page at once folded
	Pages    int            `json:"pages"`    // distinct: the cold misses of every policy
	Reserve  int            `json:"reserve_pages"`
	Rows     []simEvictRow  `json:"rows"`
	Heat     int            `json:"evict_heat"`
	Caps     []int          `json:"caps"`
	Heads    map[string]int `json:"heads"` // farmem rows' head by cap
}

// simEvictRow is one policy at one cap.
type simEvictRow struct {
	Cap      int     `json:"cap_pages"`
	Held     int     `json:"held_pages"`      // the cap less the reserve
	Policy   string  `json:"policy"`          // min, lru, farmem, fifo
	Refaults uint64  `json:"refaults"`        // misses on pages seen before
	Runs     uint64  `json:"runs,omitempty"`  // farmem and fifo: contiguous runs evicted
	XMIN     float64 `json:"x_min,omitempty"` // Refaults over MIN's at this cap (0: MIN took none)
	XLRU     float64 `json:"x_lru,omitempty"` // Refaults over LRU's at this cap (0: LRU took none)
}

// simEvictPolicies are the rows of each cap, in order (clock-w only for a stream that says
// which accesses wrote).
var simEvictPolicies = []string{"min", "lru", "clock", "clock-w", "farmem", "farmem-0", "fifo"}

func simEvict(c *cli.Context) error {
	for _, f := range []string{"prefetcher", "mode", "cache-pages", "prefetch-history", "prefetch-split", "prefetch-max"} {
		if c.IsSet(f) {
			return usagef("--%s is a prefetcher setting: --cap-pages replays eviction policies, not prefetchers", f)
		}
	}
	caps, err := simCaps(c.String("cap-pages"))
	if err != nil {
		return err
	}
	reserve := c.Int("reserve-pages")
	if reserve < 0 {
		return usagef("--reserve-pages %d: give 0 or more pages", reserve)
	}
	if c.IsSet("anon-pages") && c.IsSet("reserve-pages") {
		return usagef("--anon-pages and --reserve-pages both say what to reserve: give one")
	}
	if c.Int("anon-pages") < 0 {
		return usagef("--anon-pages %d: give 0 or more pages", c.Int("anon-pages"))
	}
	acc, err := faulttrace.ReadAccesses(c.String("trace"))
	if err != nil {
		return usagef("cannot read the access stream: %v", err)
	}
	if c.IsSet("anon-pages") {
		reserve = max(0, c.Int("anon-pages")-acc.Distinct())
	}
	for _, cp := range caps {
		if cp-reserve < 2 {
			return usagef("--cap-pages %d less --reserve-pages %d leaves %d pages: the policies need at least 2", cp, reserve, cp-reserve)
		}
	}
	heat := c.Int("evict-heat")
	if heat < 0 || heat > 15 {
		return usagef("--evict-heat %d: give 0 to 15", heat)
	}
	if c.Int("head") < 0 {
		return usagef("--head %d: give 0 or more pages", c.Int("head"))
	}
	for _, p := range acc.Pages {
		if p.Pid != acc.Pages[0].Pid {
			return usagef("%s holds the accesses of several processes (%d and %d): farmem keeps a page table a process, so replay one process's stream", c.String("trace"), acc.Pages[0].Pid, p.Pid)
		}
	}
	res := simEvictResult{Trace: c.String("trace"), Accesses: len(acc.Seq), Pages: acc.Distinct(), Reserve: reserve, Heat: heat, Caps: caps, Heads: map[string]int{}}
	policies := simEvictPolicies
	if acc.Writes == nil {
		policies = slices.DeleteFunc(slices.Clone(policies), func(p string) bool { return p == "clock-w" })
	}
	for _, cp := range caps {
		held := cp - reserve
		head := int(evictor.GrownHead(int64(held)))
		if c.IsSet("head") {
			head = c.Int("head")
		}
		head = min(head, held-1) // at least a page held
		res.Heads[strconv.Itoa(cp)] = head
		for _, pol := range policies {
			row := simEvictRow{Cap: cp, Held: held, Policy: pol}
			switch pol {
			case "min":
				row.Refaults = faulttrace.MIN(acc, held).Refaults
			case "lru":
				row.Refaults = faulttrace.LRU(acc, held).Refaults
			case "clock":
				row.Refaults = faulttrace.Clock(acc, held, func(int) bool { return true }).Refaults
			case "clock-w":
				row.Refaults = faulttrace.Clock(acc, held, acc.Wrote).Refaults
			default:
				h, hd := uint8(heat), head
				switch pol {
				case "fifo":
					h = 0
				case "farmem-0":
					hd = 0
				}
				r := pagetable.Replay(func(yield func(uint64) bool) {
					for _, id := range acc.Seq {
						if !yield(acc.Pages[id].Page) {
							return
						}
					}
				}, pagetable.ReplayConfig{Cap: held, Head: hd, Batch: evictor.BatchPages, MaxHeat: h, VictimBlock: pagetable.DefaultVictimBlock})
				row.Refaults, row.Runs = r.Refaults, r.Runs
			}
			res.Rows = append(res.Rows, row)
		}
		rows := res.Rows[len(res.Rows)-len(policies):]
		for i := range rows {
			rows[i].XMIN, rows[i].XLRU = simRatio(rows[i].Refaults, rows[0].Refaults), simRatio(rows[i].Refaults, rows[1].Refaults)
		}
	}
	return writeResult(c, res, func(w io.Writer) { printSimEvict(w, res) })
}

// simCaps reads --cap-pages: positive page counts, a comma list.
func simCaps(arg string) ([]int, error) {
	var caps []int
	for s := range strings.SplitSeq(arg, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return nil, usagef("--cap-pages %q: give positive page counts, a comma list (4096,2048)", arg)
		}
		caps = append(caps, n)
	}
	return caps, nil
}

func printSimEvict(out io.Writer, res simEvictResult) {
	fmt.Fprintf(out, "%s: %d accesses to %d pages (each page's first access is a miss under every policy, not counted)\n", res.Trace, res.Accesses, res.Pages)
	if res.Reserve > 0 {
		fmt.Fprintf(out, "%d pages of each cap reserved for memory the stream does not show\n", res.Reserve)
	}
	fmt.Fprintf(out, "min = Belady's MIN; lru = least recently used; clock = second-chance FIFO on accessed bits;\n"+
		"clock-w = the same on written bits only (what UFFD_FEATURE_WP_ASYNC and PAGEMAP_SCAN tell without a fault);\n"+
		"farmem = its page table's queue (--evict-heat %d, victims in blocks of %d), evicting from half the head\n"+
		"below the cap to the head below it; farmem-0 = that with no head: the whole cap, as the others;\n"+
		"fifo = farmem at --evict-heat 0\n\n", res.Heat, pagetable.DefaultVictimBlock)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CAP\tHELD\tPOLICY\tREFAULTS\tX MIN\tX LRU\tHEAD\tRUNS")
	ratio := func(x float64) string {
		if x == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2f", x)
	}
	for _, r := range res.Rows {
		head, runs := "-", "-"
		switch r.Policy {
		case "farmem", "fifo":
			head, runs = strconv.Itoa(res.Heads[strconv.Itoa(r.Cap)]), strconv.FormatUint(r.Runs, 10)
		case "farmem-0":
			head, runs = "0", strconv.FormatUint(r.Runs, 10)
		}
		fmt.Fprintf(tw, "%d\t%d\t%s\t%d\t%s\t%s\t%s\t%s\n", r.Cap, r.Held, r.Policy, r.Refaults, ratio(r.XMIN), ratio(r.XLRU), head, runs)
	}
	tw.Flush()
}

// simRatio is a/b, or 0 when b is 0 (no re-fault to compare with).
func simRatio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
