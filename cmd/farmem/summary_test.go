package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/farmem/farmem/launcher"
)

// --summary-json holds the summary's own numbers, raw: the counts the summary on stderr prints
// are the file's, each histogram's buckets add up to its count, and the bytes moved are the
// pages counted; --quiet does not turn it off.
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
	printed := func(re string) int64 {
		t.Helper()
		m := mustCompile(re).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("the summary has no %q", re)
		}
		v, _ := strconv.ParseInt(m[1], 10, 64)
		return v
	}
	if got, want := int64(s.Faults["backend"].Count), printed(`backend ([0-9]+) p50`); got != want || got == 0 {
		t.Errorf("backend faults: file %d, summary %d", got, want)
	}
	if got, want := s.Evicted.Written, printed(`evicted: written ([0-9]+),`); got != want {
		t.Errorf("pages written: file %d, summary %d", got, want)
	}
	if got, want := s.Batches.Count, printed(`eviction batches ([0-9]+) `); got != want {
		t.Errorf("eviction batches: file %d, summary %d", got, want)
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
	runMicro(t, nil, "--quiet", "--summary-json", path)
	if b, err := os.ReadFile(path); err != nil || !strings.Contains(string(b), `"exit_status": 0`) {
		t.Fatalf("--quiet run: --summary-json %q, %v", b, err)
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
