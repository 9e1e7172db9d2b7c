package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const sample = `what,lower_ns,upper_ns,count
zero,1024,1152,3
zero,2048,2304,1
backend,8192,9216,2
backend,16384,18432,6
backend,32768,36864,2
eviction-batch,131072,147456,1
`

func TestParseMergeQuantileCDF(t *testing.T) {
	m, err := parseLatency("sample", strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if m["zero"].count() != 4 || m["backend"].count() != 10 || m["wp"].count() != 0 || m["eviction-batch"].count() != 1 {
		t.Fatalf("counts: %v", m)
	}
	b := m["backend"]
	// farmem's rule: the midpoint of the bucket holding rank floor(q*(N-1))+1.
	for _, c := range []struct{ q, want float64 }{{0, 8.704}, {0.2, 8.704}, {0.25, 17.408}, {0.5, 17.408}, {0.99, 34.816}} {
		if got := b.quantile(c.q); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("quantile(%v) = %v, want %v", c.q, got, c.want)
		}
	}
	if !math.IsNaN(m["wp"].quantile(0.5)) {
		t.Error("an empty histogram has a quantile")
	}
	// Two rounds merged: counts add bucket by bucket, the buckets stay in order.
	mm := mergeHist(b, hist{{16384, 18432, 4}, {4096, 4608, 5}})
	if mm.count() != 19 || mm[0].lo != 4096 || mm[2].n != 10 {
		t.Fatalf("merged: %v", mm)
	}
	pts := b.cdf()
	if len(pts) != 6 || pts[0].X != 8.192 || pts[0].Y != 0 || pts[1].X != 9.216 || pts[1].Y != 0.2 ||
		pts[2].X != 16.384 || pts[2].Y != 0.2 || pts[5].Y != 1 {
		t.Fatalf("cdf: %v", pts)
	}
	for i := 1; i < len(pts); i++ {
		if pts[i].X < pts[i-1].X || pts[i].Y < pts[i-1].Y {
			t.Fatalf("cdf not monotone at %d: %v", i, pts)
		}
	}
	for _, bad := range []string{"", "what,lo\n", "what,lower_ns,upper_ns,count\nzero,5,4,1\n", "what,lower_ns,upper_ns,count\nzero,1,2\n"} {
		if _, err := parseLatency("bad", strings.NewReader(bad)); err == nil {
			t.Errorf("parsed %q", bad)
		}
	}
}

func TestLatencyPanelsAndPlot(t *testing.T) {
	m, err := parseLatency("sample", strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	f50 := config{kind: "farmem", pct: 50}
	n25 := config{kind: "farmem", prefetch: "none", pct: 25}
	rs := []result{
		{wl: "w", cfg: f50, round: 1, lat: m},
		{wl: "w", cfg: f50, round: 2, lat: m},
		{wl: "w", cfg: n25, round: 1, lat: map[string]hist{"backend": {{1000, 1100, 7}}}},
		{wl: "w", cfg: config{kind: "farmem", pct: 100}, round: 1, lat: m}, // not drawn: no cap below the peak
		{wl: "w", cfg: config{kind: "swap", swap: "zram", pct: 50}, round: 1},
		{wl: "w", cfg: n25, round: 2}, // stopped: no histograms
	}
	cfgs := []config{{kind: "farmem", pct: 100}, f50, n25, {kind: "swap", swap: "zram", pct: 50}}
	ps := latencyPanels(rs, "w", cfgs)
	if len(ps) != 2 || ps[0].what != "backend" || ps[1].what != "zero" || len(ps[0].lines) != 2 || len(ps[1].lines) != 1 {
		t.Fatalf("panels: %+v", ps)
	}
	if ps[0].lines[0].h.count() != 20 { // two rounds of 10
		t.Fatalf("rounds not summed: %v", ps[0].lines[0].h)
	}
	if latMissing(rs) != 1 {
		t.Fatalf("latMissing = %d", latMissing(rs))
	}
	path := filepath.Join(t.TempDir(), "lat.png")
	if err := plotLatency(path, workload{name: "w", title: "test"}, ps); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(path); err != nil || !strings.HasPrefix(string(b), "\x89PNG") {
		t.Fatalf("no PNG written: %v", err)
	}
	row := latCSV(rs[0])
	if len(row) != len(latCSVHeader()) || row[4] != "10" || row[5] != "17.41" || row[8] != "0" || row[9] != "" {
		t.Fatalf("csv row %v", row)
	}
	if r := latCSV(rs[4]); r[0] != "" || len(r) != 20 {
		t.Fatalf("swap row %v", r)
	}
	if os.Getenv("LATPLOT") != "" {
		b, _ := os.ReadFile(path)
		os.WriteFile(os.Getenv("LATPLOT"), b, 0o644)
	}
}
