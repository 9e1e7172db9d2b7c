package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/farmem/farmem/launcher"
)

// --summary-json holds the summary's own numbers, raw: the numbers the summary on stderr prints
// are the file's, each histogram's buckets add up to its count, and the bytes moved are the
// pages counted; --quiet does not turn it off, and leaves stderr to the program.
func TestSummaryJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "summary.json")
	out := runMicro(t, nil, "--prefetch", "none", "--summary-json", path)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s launcher.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("--summary-json: %v\n%s", err, b)
	}
	if s.ExitStatus != 0 || s.CapBytes != 16<<20 || len(s.Program) == 0 || !strings.HasSuffix(s.Program[0], "micro") || !s.Armed {
		t.Fatalf("summary: exit %d, cap %d, program %q, armed %v", s.ExitStatus, s.CapBytes, s.Program, s.Armed)
	}
	checkHumanSummary(t, out, &s)
	if !strings.Contains(out, "farmem: armed from the start: micro's pages beyond its 16 MiB cap go to the embedded store\n") {
		t.Errorf("no line saying the run armed from the start:\n%s", out)
	}
	if s.BytesOut != s.Evicted.Written*4096 || s.BytesIn != int64(s.Faults["backend"].Count)*4096 {
		t.Errorf("bytes out %d for %d pages written, in %d for %d backend faults (no prefetch)",
			s.BytesOut, s.Evicted.Written, s.BytesIn, s.Faults["backend"].Count)
	}
	hists := map[string]launcher.Histogram{"batches": s.Batches.Latency}
	for k, h := range s.Faults {
		hists["faults."+k] = h
	}
	for k, h := range s.Held {
		hists["held."+k] = h
	}
	for name, h := range hists {
		var n uint64
		for _, b := range h.Buckets {
			if b.UpperNs <= b.LowerNs || b.Count == 0 {
				t.Errorf("%s: bucket %+v", name, b)
			}
			n += b.Count
		}
		if n != h.Count || (h.Count > 0 && (h.SumNs == 0 || h.P50Ns <= 0 || h.P99Ns < h.P50Ns)) {
			t.Errorf("%s: count %d, buckets add up to %d, sum %d ns, p50 %d p99 %d", name, h.Count, n, h.SumNs, h.P50Ns, h.P99Ns)
		}
	}
	var stages int64
	for _, ns := range s.Batches.StageNs {
		stages += ns
	}
	if len(s.Batches.StageNs) != 6 || stages <= 0 || uint64(stages) > s.Batches.Latency.SumNs*11/10 {
		t.Errorf("batch stages %v (sum %d ns) against batches' %d ns", s.Batches.StageNs, stages, s.Batches.Latency.SumNs)
	}
	if s.CgroupPeakBytes != nil && (*s.CgroupPeakBytes < s.CapBytes/2 || *s.CgroupPeakBytes > s.CapBytes+capSlack) {
		t.Errorf("memory cgroup peak %d bytes, cap %d", *s.CgroupPeakBytes, s.CapBytes)
	}
	os.Remove(path)
	out = runMicro(t, nil, "--quiet", "--summary-json", path)
	if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), `"exit_status": 0`) {
		t.Fatalf("--quiet run: --summary-json %q, %v", b, err)
	}
	if strings.Contains(out, "farmem:") {
		t.Errorf("--quiet run: farmem said something:\n%s", out)
	}
}

// summarized returns farmem run's args with --summary-json added, to a file of the test's, and
// what reads that file once the run has ended.
func summarized(t *testing.T, args []string) ([]string, func() *launcher.Summary) {
	t.Helper()
	if len(args) == 0 || args[0] != "run" {
		t.Fatalf("summarized: not farmem run's args: %q", args)
	}
	path := filepath.Join(t.TempDir(), "summary.json")
	args = append([]string{"run", "--summary-json", path}, args[1:]...)
	return args, func() *launcher.Summary { t.Helper(); return readSummary(t, path) }
}

// readSummary reads a --summary-json file.
func readSummary(t *testing.T, path string) *launcher.Summary {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var s launcher.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("--summary-json: %v\n%s", err, b)
	}
	return &s
}

// runMicroSummarized runs micro with args under farmem at capacity, and returns what farmem and
// micro printed and farmem's --summary-json; it fails the test unless micro verified its pages.
func runMicroSummarized(t *testing.T, capacity string, args ...string) (string, *launcher.Summary) {
	t.Helper()
	argv, summary := summarized(t, append([]string{"run", "--local-mem", capacity, "--", filepath.Join(binDir, "micro")}, args...))
	b, err := exec.Command(farmemBin(t), argv...).CombinedOutput()
	out := string(b)
	t.Logf("%s", out)
	if err != nil || !strings.Contains(out, "micro: OK bad=0") {
		t.Fatalf("micro under farmem: %v", err)
	}
	return out, summary()
}

// The summary on stderr, for a run that armed on its way past the cap and paged with the
// default prefetcher, and for one that never armed: a line when the run arms, then a few short
// lines in plain words whose numbers are --summary-json's.
func TestHumanSummary(t *testing.T) {
	t.Run("paged", func(t *testing.T) {
		out, s := runMicroSummarized(t, "48MiB", "--mib", "80", "--pattern", "seq", "--passes", "2")
		if !s.Armed || s.ArmedAtBytes == 0 || s.Faults["backend"].Count == 0 || s.Prefetch == nil {
			t.Fatalf("the run did not arm on its way, page and prefetch: %+v", s)
		}
		m := mustCompile(`(?m)^farmem: armed at ` + printedSize + ` of micro's memory \(cap 48 MiB\): pages beyond the cap now go to the embedded store$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no line saying the run armed")
		}
		checkSize(t, "armed at", m[1], s.ArmedAtBytes)
		checkHumanSummary(t, out, s)
	})
	t.Run("never armed", func(t *testing.T) {
		out, s := runMicroSummarized(t, "512MiB", "--mib", "8", "--pattern", "seq", "--passes", "1")
		if s.Armed {
			t.Fatalf("8 MiB armed at a 512 MiB cap")
		}
		checkHumanSummary(t, out, s)
	})
}

const (
	printedSize     = `([0-9]+(?:\.[0-9])? (?:B|KiB|MiB|GiB|TiB))`
	printedDuration = `([0-9]+(?:\.[0-9]+)? (?:ns|µs|ms|s))`
	printedCount    = `([0-9]{1,3}(?:,[0-9]{3})*)`
)

// checkHumanSummary checks the summary farmem printed in out against s, its --summary-json:
// the lines a run of its kind gives, in plain words, none longer than 160 characters, their
// numbers s's (counts exact, sizes and durations as rounded), and no duration given to more
// than two significant digits.
func checkHumanSummary(t *testing.T, out string, s *launcher.Summary) {
	t.Helper()
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "farmem: ") && !strings.HasPrefix(l, "farmem: armed ") {
			lines = append(lines, l)
		}
	}
	text := strings.Join(lines, "\n")
	for _, l := range lines {
		if n := utf8.RuneCountInString(l); n > 160 {
			t.Errorf("a line of %d characters: %s", n, l)
		}
		for _, m := range mustCompile(printedDuration).FindAllStringSubmatch(l, -1) {
			digits := strings.Trim(strings.Replace(strings.Fields(m[1])[0], ".", "", 1), "0")
			if len(digits) > 2 {
				t.Errorf("a duration to more than two digits, %q: %s", m[1], l)
			}
		}
	}
	for _, word := range []string{"wp", "p50", "p99", "removes", "REMOVE", "zero-fill", "fault service", "x)", "batches"} {
		if strings.Contains(text, word) {
			t.Errorf("the summary says %q:\n%s", word, text)
		}
	}
	find := func(re string) []string {
		t.Helper()
		m := mustCompile(`(?m)^farmem: ` + re).FindStringSubmatch(text)
		if m == nil {
			t.Fatalf("the summary has no line matching %q:\n%s", re, text)
		}
		return m
	}
	name := filepath.Base(s.Program[0])
	if !s.Armed {
		m := find(`never armed: ` + name + ` stayed below ` + printedSize + ` of its ` + printedSize + ` cap \((?:at its peak the kernel counted ` +
			printedSize + `|its anonymous memory peaked at ` + printedSize + `, sampled)\), no fault taken$`)
		checkSize(t, "arming threshold", m[1], s.ArmThresholdBytes)
		checkSize(t, "cap", m[2], s.CapBytes)
		if cg := s.CgroupPeakBytes; cg != nil && *cg < s.ArmThresholdBytes {
			checkSize(t, "cgroup peak", m[3], *cg)
		} else {
			checkSize(t, "sampled peak", m[4], s.PeakAnonBytes)
		}
		if len(lines) != 1 {
			t.Errorf("a run that never armed: %d lines, want 1:\n%s", len(lines), text)
		}
		return
	}

	// What the cap held.
	m := find(`held ` + name + ` to ` + printedSize + `; (?:at its peak the kernel counted ` + printedSize +
		`|its anonymous memory peaked at ` + printedSize + ` \(sampled\))(.*)$`)
	checkSize(t, "cap", m[1], s.CapBytes)
	switch cg := s.CgroupPeakBytes; {
	case cg == nil:
		checkSize(t, "sampled peak", m[3], s.PeakAnonBytes)
	default:
		checkSize(t, "cgroup peak", m[2], *cg)
		if *cg > s.CapBytes {
			a := mustCompile(`^: ` + printedSize + ` anonymous, the rest page cache and kernel memory, not capped$`).FindStringSubmatch(m[4])
			if a == nil {
				t.Fatalf("a peak over the cap, unexplained: %s", m[0])
			}
			checkSize(t, "anonymous peak", a[1], min(s.PeakAnonBytes, *cg))
		}
	}
	if over := s.PeakAnonBytes - s.CapBytes; over > 0 {
		checkSize(t, "over the cap", find(`its anonymous memory went ` + printedSize + ` over the cap: `)[1], over)
	} else if strings.Contains(text, "over the cap") {
		t.Errorf("anonymous memory within the cap said to be over it:\n%s", text)
	}

	// Pages in and out.
	wentOut := s.Evicted.Written + s.Evicted.DroppedClean + s.Evicted.Zero
	m = find(printedCount + ` pages came back \(` + printedSize + `(?:, ` + printedCount + ` of them prefetched)?\) and ` + printedCount + ` went out \(` + printedSize + ` written(.*)\)$`)
	checkCount(t, "pages that came back", m[1], s.BytesIn/4096)
	checkSize(t, "bytes that came back", m[2], s.BytesIn)
	if s.Prefetch != nil && s.Prefetch.Placed > 0 {
		checkCount(t, "pages prefetched", m[3], s.Prefetch.Placed)
	}
	checkCount(t, "pages that went out", m[4], wentOut)
	checkSize(t, "bytes written", m[5], s.BytesOut)
	checkCounted(t, m[6], printedCount+` unchanged since stored`, s.Evicted.DroppedClean)
	checkCounted(t, m[6], printedCount+` all zeros`, s.Evicted.Zero)

	// What the faults cost.
	var cost int64
	for _, h := range s.Faults {
		cost += int64(h.SumNs)
	}
	m = find(`faults cost the program ` + printedDuration + `: (.*)$`)
	checkDuration(t, "the faults' cost", m[1], cost)
	b := s.Faults["backend"]
	if r := mustCompile(printedCount + ` read back \(median ` + printedDuration + `, 99th percentile ` + printedDuration + `\)`).FindStringSubmatch(m[2]); r == nil {
		t.Errorf("no faults read back: %s", m[0])
	} else {
		checkCount(t, "faults read back", r[1], int64(b.Count))
		checkDuration(t, "median", r[2], b.P50Ns)
		checkDuration(t, "99th percentile", r[3], b.P99Ns)
	}
	checkCounted(t, m[2], printedCount+` first touches`, int64(s.Faults["zero"].Count))
	checkCounted(t, m[2], printedCount+` first writes`, int64(s.Faults["wp"].Count))
	checkCounted(t, m[2], printedCount+` from the prefetch cache`, int64(s.Faults["cache"].Count))
	var held uint64
	for _, h := range s.Held {
		held += h.Count
	}
	if held > 0 {
		m = find(printedCount + ` of the faults waited, (.*): [0-9]+ % of the faults' time$`)
		checkCount(t, "faults that waited", m[1], int64(held))
		checkCounted(t, m[2], printedCount+` for room at the cap`, int64(s.Held["room"].Count))
		checkCounted(t, m[2], printedCount+` for their page to finish moving`, int64(s.Held["busy"].Count))
		checkCounted(t, m[2], printedCount+` behind a change to the program's mappings`, int64(s.Held["event"].Count))
	}

	// Whether prefetching paid.
	if p := s.Prefetch; p != nil && (p.Placed > 0 || b.Count > 0) {
		m = find(`prefetching \(` + p.Name + `, (?:map mode|cache mode)\) (?:paid|did not pay): ` + printedCount + ` pages (?:brought ahead of need|read ahead), ` +
			printedCount + ` used \(.*; (?:[0-9]+|over 99|under 1) % of the pages ` + name + ` needed back (?:took no fault|were in the cache)$`)
		checkCount(t, "pages prefetched", m[1], p.Placed)
		checkCount(t, "prefetched pages used", m[2], p.Used)
	} else if strings.Contains(text, "prefetching") {
		t.Errorf("a prefetch line with no prefetcher, or nothing to prefetch:\n%s", text)
	}
}

// checkCount checks a count as printed (thousands separated) against n.
func checkCount(t *testing.T, what, printed string, n int64) {
	t.Helper()
	if got, err := strconv.ParseInt(strings.ReplaceAll(printed, ",", ""), 10, 64); err != nil || got != n {
		t.Errorf("%s: the summary says %q, --summary-json %d", what, printed, n)
	}
}

// checkCounted checks the count re finds in text against n; re must find nothing when n is 0.
func checkCounted(t *testing.T, text, re string, n int64) {
	t.Helper()
	m := mustCompile(re).FindStringSubmatch(text)
	switch {
	case m == nil && n != 0:
		t.Errorf("%q: not said, --summary-json %d: %s", re, n, text)
	case m != nil:
		checkCount(t, re, m[1], n)
	}
}

// checkSize checks a size as printed against n bytes: to a tenth of its unit under 100 of it,
// whole from there.
func checkSize(t *testing.T, what, printed string, n int64) {
	t.Helper()
	f := strings.Fields(printed)
	v, err := strconv.ParseFloat(f[0], 64)
	unit := map[string]float64{"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}[f[1]]
	tol := 0.05
	if v >= 100 {
		tol = 0.5
	}
	if err != nil || math.Abs(v-float64(n)/unit) > tol+1e-9 {
		t.Errorf("%s: the summary says %q, --summary-json %d bytes", what, printed, n)
	}
}

// checkDuration checks a duration as printed (two significant digits) against ns.
func checkDuration(t *testing.T, what, printed string, ns int64) {
	t.Helper()
	f := strings.Fields(printed)
	v, err := strconv.ParseFloat(f[0], 64)
	v *= map[string]float64{"ns": 1, "µs": 1e3, "ms": 1e6, "s": 1e9}[f[1]]
	if err != nil || math.Abs(v-float64(ns)) > 0.05*float64(ns) {
		t.Errorf("%s: the summary says %q, --summary-json %s", what, printed, fmt.Sprint(ns, " ns"))
	}
}
