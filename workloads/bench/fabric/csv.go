package main

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// The raw rows beside the report: fabric.md's figures are merged over the rounds (histograms
// summed, pages/s over the summed time), so the CSV holds what they are merged from, one row
// per path, round and latency bucket (log-linear, within 12.5 %): every p50, p99, mean and
// pages/s of the report, and each round's own, can be computed again from it.

// csvPath is the CSV written beside the report out: results/fabric.md -> results/fabric.csv.
func csvPath(out string) string { return strings.TrimSuffix(out, ".md") + ".csv" }

var csvHeader = []string{"commit", "section", "path", "round", "calls", "pages_per_call", "elapsed_ns", "bucket_lo_ns", "bucket_hi_ns", "count"}

// writeCSV writes every round of every path of the report's sections (latency: single pages;
// throughput: batched requests; fault: faults served through userfaultfd, one call a fault).
func writeCSV(path string, sections map[string][]*path) error {
	var b bytes.Buffer
	w := csv.NewWriter(&b)
	w.Write(csvHeader)
	for _, sec := range []string{"latency", "throughput", "fault"} {
		for _, p := range sections[sec] {
			for i, r := range p.rounds {
				head := []string{*commit, sec, p.name, strconv.Itoa(i + 1), strconv.Itoa(r.calls), strconv.Itoa(max(p.pages, 1)), strconv.FormatInt(r.elapsed.Nanoseconds(), 10)}
				r.h.Buckets(func(lo, hi time.Duration, n uint64) {
					w.Write(append(head[:len(head):len(head)], strconv.FormatInt(lo.Nanoseconds(), 10), strconv.FormatInt(hi.Nanoseconds(), 10), strconv.FormatUint(n, 10)))
				})
			}
		}
	}
	w.Flush()
	if err := w.Error(); err != nil {
		return err
	}
	if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
		return fmt.Errorf("the raw rows: %w", err)
	}
	return nil
}
