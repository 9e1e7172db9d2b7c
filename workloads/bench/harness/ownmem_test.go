package main

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
)

// farmem's own memory against its store: met, not met, a memory server's run left out, and the
// figures survive the CSV (-render makes the same table from the committed rows).
func TestOwnMemory(t *testing.T) {
	fm50, fm25, tcp := config{kind: "farmem", pct: 50}, config{kind: "farmem", pct: 25}, config{kind: "farmem", remote: "tcp", pct: 50}
	var rs []result
	for round := 1; round <= 3; round++ {
		a, b, c := run("w", fm50, round, 10, false, false), run("w", fm25, round, 5, false, false), run("w", tcp, round, 3, false, false)
		a.storePeakB, a.farmemRSSB = 400<<20, int64(430+round)<<20 // 1.1 x 400 + 64 = 504: met
		b.storePeakB, b.farmemRSSB = 456<<20, 1100<<20             // 565: not met
		c.storePeakB, c.farmemRSSB = 400<<20, 40<<20               // the pages are on the server
		rs = append(rs, a, b, c)
	}
	path := filepath.Join(t.TempDir(), "swap.csv")
	if err := writeCSV(path, rs); err != nil {
		t.Fatal(err)
	}
	back, _, err := readResults(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range [][]result{rs, back} {
		var b strings.Builder
		ownMemory(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, []workload{{name: "w", title: "W"}}, []config{fm50, fm25, tcp}, in)
		out := b.String()
		for _, want := range []string{"| W | farmem | 50 | 400 | 432 | 504 | met |", "| W | farmem | 25 | 456 | 1100 | 566 | **not met** |"} {
			if !strings.Contains(out, want) {
				t.Errorf("no row %q in\n%s", want, out)
			}
		}
		if strings.Contains(out, "farmem-tcp") {
			t.Errorf("a memory server's run has a row:\n%s", out)
		}
	}
	// Rows from a farmem that did not report its RSS: no section at all.
	for i := range rs {
		rs[i].farmemRSSB = 0
	}
	var b strings.Builder
	ownMemory(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, []workload{{name: "w", title: "W"}}, []config{fm50, fm25}, rs)
	if b.Len() != 0 {
		t.Errorf("a section with no figures:\n%s", b.String())
	}
}
