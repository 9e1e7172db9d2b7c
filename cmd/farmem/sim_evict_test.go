package main

// `farmem sim --cap-pages`, run in-process: no root, no bin/farmem. Run alone with go test -run Sim.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/farmem/farmem/faulttrace"
)

// Belady's anomaly sequence, as a text access stream: 5 pages; at 3 frames MIN takes 7 misses,
// LRU 10 and FIFO 9 (2, 5 and 4 of them re-faults), CLOCK as FIFO. A text stream says nothing
// of writes: no clock-w row.
const beladyStream = "# Belady's sequence\n1\n2\n3\n4\n1\n2\n5\n1\n2\n3\n4\n5\n"

func TestSimEvictTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "belady.txt")
	os.WriteFile(path, []byte(beladyStream), 0o644)
	out, err := simRun(t, "--trace", path, "--cap-pages", "3,4", "--head", "0", "--evict-heat", "0")
	if err != nil {
		t.Fatal(err)
	}
	want := regexp.MustCompile(`(?s)^` + regexp.QuoteMeta(path) + `: 12 accesses to 5 pages \(each page's first access is a miss under every policy, not counted\)\n` +
		`.*CAP +HELD +POLICY +REFAULTS +X MIN +X LRU +HEAD +RUNS\n` +
		`3 +3 +min +2 +1\.00 +0\.40 +- +-\n` +
		`3 +3 +lru +5 +2\.50 +1\.00 +- +-\n` +
		`3 +3 +clock +4 +2\.00 +0\.80 +- +-\n` +
		`3 +3 +farmem +4 +2\.00 +0\.80 +0 +\d+\n` +
		`3 +3 +farmem-0 +4 +2\.00 +0\.80 +0 +\d+\n` +
		`3 +3 +fifo +4 +2\.00 +0\.80 +0 +\d+\n` +
		`4 +4 +min +1 +1\.00 +0\.33 .*\n` +
		`4 +4 +lru +3 +3\.00 +1\.00 .*\n` +
		`4 +4 +clock +5 +5\.00 +1\.67 .*\n` +
		`4 +4 +farmem +5 +5\.00 +1\.67 .*\n` +
		`4 +4 +farmem-0 +5 +5\.00 +1\.67 .*\n` +
		`4 +4 +fifo +5 +5\.00 +1\.67 .*\n\z`)
	if !want.MatchString(out) {
		t.Errorf("unexpected:\n%s", out)
	}
}

// A page stream with a reserve: the JSON's rows hold the cap less what the program holds
// outside the stream, and the ratios.
func TestSimEvictJSONReserve(t *testing.T) {
	b := []byte(faulttrace.PagesMagic)
	for _, p := range []uint64{1, 2, 3, 4, 1, 2, 5, 1, 2, 3, 4, 5} {
		b = binary.LittleEndian.AppendUint64(b, 0x7f0000000+p)
	}
	path := filepath.Join(t.TempDir(), "belady.pages")
	os.WriteFile(path, b, 0o644)
	out, err := simRun(t, "--trace", path, "--cap-pages", "5", "--anon-pages", "7", "--head", "0", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res simEvictResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if res.Accesses != 12 || res.Pages != 5 || res.Reserve != 2 || len(res.Rows) != 7 || res.Rows[3].Policy != "clock-w" {
		t.Fatalf("unexpected: %+v", res)
	}
	for _, r := range res.Rows {
		if r.Cap != 5 || r.Held != 3 {
			t.Errorf("row %+v: want cap 5 held 3 (7 anonymous pages, 5 in the stream)", r)
		}
	}
	if r := res.Rows[1]; r.Policy != "lru" || r.Refaults != 5 || r.XMIN != 2.5 || r.XLRU != 1 {
		t.Errorf("LRU's row %+v, want 5 re-faults, 2.5x MIN's", r)
	}
}

func TestSimEvictBadInput(t *testing.T) {
	dir := t.TempDir()
	stream := filepath.Join(dir, "s.txt")
	os.WriteFile(stream, []byte(beladyStream), 0o644)
	two := filepath.Join(dir, "two.txt")
	os.WriteFile(two, []byte("1 0x10\n2 0x10\n"), 0o644)
	faults := filepath.Join(dir, "run.fmtrace")
	w, _ := faulttrace.Create(faults)
	w.Record(faulttrace.Record{Pid: 1, Kind: faulttrace.KindRead, Source: faulttrace.SourceBackend, Addr: 0x1000})
	w.Close()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"fault trace", []string{"--trace", faults, "--cap-pages", "4"}, "is a fault trace (FMTRACE1), not an access stream"},
		{"no caps", []string{"--trace", stream, "--cap-pages", ""}, `--cap-pages "": give positive page counts`},
		{"zero cap", []string{"--trace", stream, "--cap-pages", "4,0"}, `--cap-pages "4,0": give positive page counts`},
		{"reserve too big", []string{"--trace", stream, "--cap-pages", "4", "--reserve-pages", "3"}, "--cap-pages 4 less --reserve-pages 3 leaves 1 pages"},
		{"negative reserve", []string{"--trace", stream, "--cap-pages", "4", "--reserve-pages", "-1"}, "--reserve-pages -1: give 0 or more"},
		{"both reserves", []string{"--trace", stream, "--cap-pages", "4", "--reserve-pages", "1", "--anon-pages", "9"}, "give one"},
		{"heat", []string{"--trace", stream, "--cap-pages", "4", "--evict-heat", "16"}, "--evict-heat 16: give 0 to 15"},
		{"head", []string{"--trace", stream, "--cap-pages", "4", "--head", "-1"}, "--head -1: give 0 or more"},
		{"prefetcher flag", []string{"--trace", stream, "--cap-pages", "4", "--prefetcher", "leap"}, "--prefetcher is a prefetcher setting"},
		{"evict flag alone", []string{"--trace", stream, "--evict-heat", "2"}, "--evict-heat is an eviction replay setting: give --cap-pages too"},
		{"two processes", []string{"--trace", two, "--cap-pages", "4"}, "holds the accesses of several processes (1 and 2)"},
		{"missing", []string{"--trace", filepath.Join(dir, "nope"), "--cap-pages", "4"}, "cannot read the access stream: open"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := simRun(t, c.args...)
			var ue usageError
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &ue) || strings.Contains(err.Error(), "\n") {
				t.Errorf("farmem sim %s: %v, want a one-line usage error with %q", strings.Join(c.args, " "), err, c.want)
			}
			if out != "" {
				t.Errorf("printed on bad input:\n%s", out)
			}
		})
	}
}
