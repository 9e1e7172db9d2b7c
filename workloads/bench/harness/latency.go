package main

import (
	"bufio"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// A latBucket is one line of farmem run --latency-out: a histogram bucket [lo, hi) ns holding n.
type latBucket struct {
	lo, hi int64
	n      uint64
}

// A hist is one histogram's non-empty buckets, in order. farmem's buckets are log-linear (8 per
// power of two), so any value read from them is within 12.5 % in time.
type hist []latBucket

// latWhats are what --latency-out names: the fault sources (fetcher.Source's names, in its
// order), then the eviction batches. The CSV's extra columns follow this order.
var latWhats = []string{"zero", "backend", "wp", "cache", "eviction-batch"}

// faultSources are the fault sources as the latency plot shows them, one panel each, the
// backend's (the faults that cost a read) first.
var faultSources = []struct{ what, desc string }{
	{"backend", "backend faults (an evicted page read back)"},
	{"zero", "zero-fill faults (first touch, no backend)"},
	{"wp", "wp faults (first write to a clean page)"},
	{"cache", "cache faults (a prefetch cache hit)"},
}

// readLatency parses a --latency-out file (CSV what,lower_ns,upper_ns,count).
func readLatency(path string) (map[string]hist, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseLatency(path, f)
}

func parseLatency(name string, rd io.Reader) (map[string]hist, error) {
	m := map[string]hist{}
	s := bufio.NewScanner(rd)
	line := 0
	for s.Scan() {
		line++
		t := strings.TrimSpace(s.Text())
		if line == 1 {
			if t != "what,lower_ns,upper_ns,count" {
				return nil, fmt.Errorf("%s: header %q, want what,lower_ns,upper_ns,count", name, t)
			}
			continue
		}
		if t == "" {
			continue
		}
		fs := strings.Split(t, ",")
		if len(fs) != 4 {
			return nil, fmt.Errorf("%s:%d: %q: want 4 fields", name, line, t)
		}
		lo, err1 := strconv.ParseInt(fs[1], 10, 64)
		hi, err2 := strconv.ParseInt(fs[2], 10, 64)
		n, err3 := strconv.ParseUint(fs[3], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil || lo < 0 || hi < lo {
			return nil, fmt.Errorf("%s:%d: %q: bad bucket", name, line, t)
		}
		m[fs[0]] = append(m[fs[0]], latBucket{lo, hi, n})
	}
	if err := s.Err(); err != nil {
		return nil, err
	}
	if line == 0 {
		return nil, fmt.Errorf("%s: empty", name)
	}
	for k, h := range m {
		m[k] = mergeHist(h) // sorted, one entry per bucket
	}
	return m, nil
}

// mergeHist sums histograms (the rounds' of one configuration): counts of the same bucket add.
func mergeHist(hs ...hist) hist {
	sum := map[latBucket]uint64{}
	for _, h := range hs {
		for _, b := range h {
			sum[latBucket{b.lo, b.hi, 0}] += b.n
		}
	}
	var r hist
	for b, n := range sum {
		if n > 0 {
			r = append(r, latBucket{b.lo, b.hi, n})
		}
	}
	sort.Slice(r, func(i, j int) bool { return r[i].lo < r[j].lo })
	return r
}

func (h hist) count() uint64 {
	var n uint64
	for _, b := range h {
		n += b.n
	}
	return n
}

// quantile is the q-quantile in µs as farmem's summary computes it (latency.Snapshot.Quantile):
// the midpoint of the bucket holding the rank floor(q*(N-1))+1. NaN when empty.
func (h hist) quantile(q float64) float64 {
	n := h.count()
	if n == 0 {
		return math.NaN()
	}
	rank := uint64(q*float64(n-1)) + 1
	var seen uint64
	for _, b := range h {
		if seen += b.n; seen >= rank {
			return float64(b.lo+(b.hi-b.lo)/2) / 1e3
		}
	}
	return float64(h[len(h)-1].lo) / 1e3
}

// cdf is the histogram's CDF in (µs, fraction) points: at each non-empty bucket's lower bound
// the fraction below it, at its upper bound the fraction below that (both exact), so drawn as
// a line it rises straight across each bucket and is flat across empty ones.
func (h hist) cdf() plotter.XYs {
	n := h.count()
	if n == 0 {
		return nil
	}
	var pts plotter.XYs
	var seen uint64
	for _, b := range h {
		lo := float64(b.lo) / 1e3
		if lo <= 0 { // the first buckets start at 0 ns, which a log axis cannot show
			lo = float64(b.hi) / 2e3
		}
		pts = append(pts, plotter.XY{X: lo, Y: float64(seen) / float64(n)})
		seen += b.n
		pts = append(pts, plotter.XY{X: float64(b.hi) / 1e3, Y: float64(seen) / float64(n)})
	}
	return pts
}

// latHist merges the rounds' histograms of what for one workload and configuration.
func latHist(rs []result, wl string, c config, what string) hist {
	var hs []hist
	for _, r := range rs {
		if r.wl == wl && r.cfg == c && r.lat != nil {
			hs = append(hs, r.lat[what])
		}
	}
	return mergeHist(hs...)
}

// A latLine is one CDF: a farmem configuration at one cap, its rounds merged.
type latLine struct {
	cfg config
	h   hist
}

// A latPanel is one fault source's CDFs.
type latPanel struct {
	what, desc string
	lines      []latLine
}

// latencyPanels are what the workload's latency plot draws: a panel per fault source that any
// farmem configuration at a cap below 100 % has faults of, a line per such configuration.
func latencyPanels(rs []result, wl string, cfgs []config) []latPanel {
	var ps []latPanel
	for _, src := range faultSources {
		p := latPanel{what: src.what, desc: src.desc}
		for _, c := range cfgs {
			if c.kind != "farmem" || c.pct >= 100 {
				continue
			}
			if h := latHist(rs, wl, c, src.what); h.count() > 0 {
				p.lines = append(p.lines, latLine{c, h})
			}
		}
		if len(p.lines) > 0 {
			ps = append(ps, p)
		}
	}
	return ps
}

var cfgColors = map[string]color.Color{
	"farmem":          color.RGBA{R: 31, G: 119, B: 180, A: 255},
	"farmem-leap":     color.RGBA{R: 44, G: 160, B: 44, A: 255},
	"farmem-none":     color.RGBA{R: 148, G: 103, B: 189, A: 255},
	"farmem-tcp":      color.RGBA{R: 23, G: 190, B: 207, A: 255},
	"farmem-shm":      color.RGBA{R: 188, G: 189, B: 34, A: 255},
	"farmem-tcp-leap": color.RGBA{R: 0, G: 110, B: 120, A: 255},
	"farmem-shm-leap": color.RGBA{R: 120, G: 120, B: 0, A: 255},
	"swap-zram":       color.RGBA{R: 255, G: 127, B: 14, A: 255},
	"swap-file":       color.RGBA{R: 214, G: 39, B: 40, A: 255},
}

// capDashes tell the caps apart on the latency plot (the colour is the configuration): the
// largest cap solid, then dashed, dotted, dash-dotted.
var capDashes = [][]vg.Length{
	nil,
	{vg.Points(6), vg.Points(3)},
	{vg.Points(1.5), vg.Points(2)},
	{vg.Points(6), vg.Points(2), vg.Points(1.5), vg.Points(2)},
}

// plotLatency draws the workload's fault-latency CDF by source: one panel per source (up to
// three side by side, four as 2x2, all on one x range), a line per farmem configuration and
// cap, n the faults.
func plotLatency(path string, w workload, panels []latPanel) error {
	if len(panels) == 0 {
		return nil
	}
	// Dash by cap (the same cap, the same dash in every panel), colour by configuration.
	var caps []int
	for _, p := range panels {
		for _, l := range p.lines {
			if i := sort.SearchInts(caps, -l.cfg.pct); i == len(caps) || caps[i] != -l.cfg.pct {
				caps = append(caps, -l.cfg.pct)
				sort.Ints(caps)
			}
		}
	}
	dash := func(pct int) []vg.Length {
		i := sort.SearchInts(caps, -pct)
		return capDashes[i%len(capDashes)]
	}
	// Up to three panels in a row, four as 2x2; all on the same x range, so that the sources
	// compare at a glance. Whole decades, so that the log axis has labelled ends.
	cols, rows := len(panels), 1
	if cols == 4 {
		cols, rows = 2, 2
	}
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, p := range panels {
		for _, l := range p.lines {
			pts := l.h.cdf()
			lo, hi = math.Min(lo, pts[0].X), math.Max(hi, pts[len(pts)-1].X)
		}
	}
	xmin, xmax := math.Pow10(int(math.Floor(math.Log10(lo)+1e-9))), math.Pow10(int(math.Ceil(math.Log10(hi)-1e-9)))
	if xmax <= xmin {
		xmax = 10 * xmin
	}
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
	}
	for i, p := range panels {
		pl := plot.New()
		pl.Title.Text = w.title + ": " + p.desc
		pl.X.Label.Text = "fault service latency, µs (log)"
		pl.Y.Label.Text = "fraction of faults ≤ latency"
		pl.X.Scale = plot.LogScale{}
		pl.X.Tick.Marker = decadeTicks{}
		// The legend goes above 1 (a row is about 3 % of a panel's height), clear of the curves.
		pl.Y.Min, pl.Y.Max = 0, 1.04+0.035*float64(len(p.lines))
		pl.Y.Tick.Marker = fractionTicks{}
		pl.Legend.Top, pl.Legend.Left = true, true
		pl.Legend.XOffs = vg.Points(6)
		pl.Legend.TextStyle.Font.Size = vg.Points(9)
		pl.Add(plotter.NewGrid())
		for j, l := range p.lines {
			ln, err := plotter.NewLine(l.h.cdf())
			if err != nil {
				return err
			}
			col, ok := cfgColors[l.cfg.name()]
			if !ok {
				col = plotutilColor(j)
			}
			ln.Color, ln.Width, ln.Dashes = col, vg.Points(1.5), dash(l.cfg.pct)
			pl.Add(ln)
			pl.Legend.Add(fmt.Sprintf("%s %d %% (n=%d, p50 %s, p99 %s µs)", l.cfg.name(), l.cfg.pct, l.h.count(),
				fmtUs(l.h.quantile(0.5)), fmtUs(l.h.quantile(0.99))), ln)
		}
		pl.X.Min, pl.X.Max = xmin, xmax
		grid[i/cols][i%cols] = pl
	}
	width, height := 8*vg.Inch, 5*vg.Inch*vg.Length(rows)
	if cols > 1 {
		width = 6 * vg.Inch * vg.Length(cols)
	}
	img := vgimg.New(width, height)
	dc := draw.New(img)
	t := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(24), PadY: vg.Points(18),
		PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(12)}
	cs := plot.Align(grid, t, dc)
	for i := range grid {
		for j, pl := range grid[i] {
			if pl != nil {
				pl.Draw(cs[i][j])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// fmtUs prints a latency in µs with three significant digits.
func fmtUs(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	if v >= 100 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// latCSVHeader and latCSV are the CSV's extra columns: per source (and eviction batches) the
// count and p50/p99/p99.9 in µs of the run's histogram (bucket midpoints, as farmem's summary),
// empty where farmem wrote none (native and swap runs, runs stopped at their limit).
func latCSVHeader() []string {
	var r []string
	for _, w := range latWhats {
		k := "lat_" + strings.ReplaceAll(w, "-", "_")
		r = append(r, k+"_count", k+"_p50_us", k+"_p99_us", k+"_p999_us")
	}
	return r
}

func latCSV(r result) []string {
	var out []string
	for _, w := range latWhats {
		if r.lat == nil {
			out = append(out, "", "", "", "")
			continue
		}
		h := r.lat[w]
		n := h.count()
		if n == 0 {
			out = append(out, "0", "", "", "")
			continue
		}
		out = append(out, strconv.FormatUint(n, 10), fmt.Sprintf("%.2f", h.quantile(0.5)), fmt.Sprintf("%.2f", h.quantile(0.99)),
			fmt.Sprintf("%.2f", h.quantile(0.999)))
	}
	return out
}

// latMissing counts the farmem runs that wrote no latency histograms.
func latMissing(rs []result) int {
	n := 0
	for _, r := range rs {
		if r.cfg.kind == "farmem" && r.lat == nil {
			n++
		}
	}
	return n
}

// fractionTicks label 0 to 1 by tenths (none above 1: that room is the legend's).
type fractionTicks struct{}

func (fractionTicks) Ticks(lo, hi float64) []plot.Tick {
	var t []plot.Tick
	for i := 0; i <= 10; i++ {
		v := float64(i) / 10
		if v < lo || v > hi {
			continue
		}
		t = append(t, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
	}
	return t
}

// decadeTicks label every power of ten (0.1, 1, 10, ...; µs) and mark 2..9 of each decade.
type decadeTicks struct{}

func (decadeTicks) Ticks(lo, hi float64) []plot.Tick {
	var t []plot.Tick
	for e := int(math.Floor(math.Log10(lo) + 1e-9)); e <= int(math.Ceil(math.Log10(hi)-1e-9)); e++ {
		v := math.Pow10(e)
		if v >= lo*(1-1e-9) && v <= hi*(1+1e-9) {
			t = append(t, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', -1, 64)})
		}
		for i := 2; i < 10; i++ {
			if m := v * float64(i); m > lo && m < hi {
				t = append(t, plot.Tick{Value: m})
			}
		}
	}
	return t
}
