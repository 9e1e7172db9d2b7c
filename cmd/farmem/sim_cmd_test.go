package main

// `farmem sim`, run in-process: no root, no bin/farmem. Run alone with go test -run Sim.

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/faulttrace"
	"github.com/farmem/farmem/prefetch"
)

func simRun(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, errw := newCtrlLog(), newCtrlLog()
	app := &cli.App{
		Name:            "farmem",
		Writer:          out,
		ErrWriter:       errw,
		HideHelpCommand: true,
		ExitErrHandler:  func(*cli.Context, error) {},
		OnUsageError:    func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Commands:        []*cli.Command{simCommand()},
	}
	err := app.Run(append([]string{"farmem", "sim"}, args...))
	return out.String(), err
}

const paperTrace = "../../workloads/traces/leap-paper.txt"

// The paper's example with its settings: the rows are the replays prefetch's tests compute
// by hand (TestReplayWorkedExampleMap, TestReplayWorkedExample), map mode's first, each
// saying its mode and window cap.
func TestSimTablePaperExample(t *testing.T) {
	out, err := simRun(t, "--trace", paperTrace, "--prefetcher", "leap", "--prefetch-history", "8", "--prefetch-split", "2")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"leap-paper.txt (text): 16 faults from 1 process\n",
		"history 8, split 2; at most 4096 prefetched pages waiting unused\n",
		"\nmap = farmem run's default: pages installed, hits unseen and inferred from the next miss\n",
		"\ncache = Leap's: pages held in a prefetch cache, hits seen\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	rows := regexp.MustCompile(`(?m)^PREFETCHER +MODE +MAX +FAULTS .* FED HITS\n` +
		`leap +map +32 +16 +4 +12 +8 +4 +50\.0% +25\.0% +1 +1\.0 +4 +2\n` +
		`leap +cache +8 +16 +4 +12 +10 +6 +40\.0% +25\.0% +1 +1\.0 +4 +4\n\z`)
	if !rows.MatchString(out) || strings.Count(out, "\n") != 8 {
		t.Errorf("want a leap map row (max 32, 8 prefetched, 2 hits fed) then a leap cache row (max 8, 10 prefetched, 4 fed):\n%s", out)
	}
	// Columns line up: every row starts its mode and faults columns where the header's do.
	lines := strings.Split(strings.TrimSpace(out), "\n")
	header := lines[len(lines)-3]
	for _, data := range lines[len(lines)-2:] {
		mode := strings.Fields(data)[1]
		if strings.Index(header, "MODE") != strings.Index(data, " "+mode+" ")+1 || strings.Index(header, "FAULTS") != strings.Index(data, "16") {
			t.Errorf("columns not aligned:\n%s\n%s", header, data)
		}
	}
}

func TestSimAllAndJSON(t *testing.T) {
	out, err := simRun(t, "--trace", "../../workloads/traces/two-processes.txt", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var res simResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	if res.Faults != 28 || res.Processes != 2 || res.Format != "text" || res.CachePages != simDefaultCachePages ||
		len(res.Results) != 2*len(prefetch.Names()) || !slices.Equal(res.Modes, []prefetch.Mode{"map", "cache"}) {
		t.Fatalf("%+v", res)
	}
	// Each row is what prefetch.Replay reports for the same stream and settings: every
	// prefetcher in map mode with farmem run's window, then in cache mode with the paper's.
	recs, err := faulttrace.ReadFile("../../workloads/traces/two-processes.txt")
	if err != nil {
		t.Fatal(err)
	}
	var acc []prefetch.Access
	for _, r := range recs {
		acc = append(acc, prefetch.Access{Pid: r.Pid, Page: r.Page()})
	}
	check := func(res simResult, rows []prefetch.Metrics, modes []prefetch.Mode, max map[prefetch.Mode]int) {
		t.Helper()
		i := 0
		for _, mode := range modes {
			for _, name := range prefetch.Names() {
				want, _ := prefetch.Replay(prefetch.Config{Name: name, Max: max[mode]}, mode, simDefaultCachePages, acc)
				if rows[i] != want || rows[i].Mode != mode || rows[i].Max != max[mode] {
					t.Errorf("row %d: %+v, want %+v", i, rows[i], want)
				}
				i++
			}
		}
	}
	check(res, res.Results, prefetch.Modes(), map[prefetch.Mode]int{"map": runDefaultPrefetchMax, "cache": prefetch.DefaultMax})
	// On this trace the modes differ: map mode's rows are not cache mode's under another name.
	n := len(prefetch.Names())
	if res.Results[0].Prefetcher != "leap" || res.Results[0].FedHits == res.Results[n].FedHits {
		t.Errorf("leap fed %d hits in map mode and %d in cache mode: want them to differ", res.Results[0].FedHits, res.Results[n].FedHits)
	}

	// --prefetch-max sets both modes' window.
	out, err = simRun(t, "--trace", "../../workloads/traces/two-processes.txt", "--json", "--prefetch-max", "4")
	if err != nil {
		t.Fatal(err)
	}
	res = simResult{}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("%v:\n%s", err, out)
	}
	check(res, res.Results, prefetch.Modes(), map[prefetch.Mode]int{"map": 4, "cache": 4})

	// A comma list, repeats dropped, in the order given, in each mode.
	out, err = simRun(t, "--trace", paperTrace, "--prefetcher", "nextn, leap,nextn")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?s)\nnextn +map .*\nleap +map .*\nnextn +cache .*\nleap +cache `).MatchString(out) || strings.Count(out, "\n") != 10 {
		t.Errorf("want rows nextn then leap, map mode then cache mode:\n%s", out)
	}
}

// --mode map or cache gives that mode's rows only, and its line of the header.
func TestSimModeFlag(t *testing.T) {
	for _, c := range []struct {
		mode, row, note, other string
	}{
		{"map", `(?m)^leap +map +32 +16 +4 +12 +8 `, "map = farmem run's default", "cache"},
		{" cache", `(?m)^leap +cache +8 +16 +4 +12 +10 `, "cache = Leap's", "map"},
	} {
		out, err := simRun(t, "--trace", paperTrace, "--prefetcher", "leap", "--prefetch-history", "8", "--prefetch-split", "2", "--mode", c.mode)
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(c.row).MatchString(out) || !strings.Contains(out, "\n"+c.note) ||
			strings.Contains(out, " "+c.other+" ") || strings.Contains(out, "\n"+c.other+" = ") || strings.Count(out, "\n") != 6 {
			t.Errorf("--mode %q: want one row matching %s and only its mode's note:\n%s", c.mode, c.row, out)
		}
		var res simResult
		out, err = simRun(t, "--trace", paperTrace, "--mode", c.mode, "--json")
		if err != nil || json.Unmarshal([]byte(out), &res) != nil {
			t.Fatalf("--mode %q --json: %v\n%s", c.mode, err, out)
		}
		for _, m := range res.Results {
			if string(m.Mode) == c.other {
				t.Errorf("--mode %q --json has a %s row: %+v", c.mode, c.other, m)
			}
		}
		if len(res.Results) != len(prefetch.Names()) || len(res.Modes) != 1 {
			t.Errorf("--mode %q --json: %d rows, modes %v", c.mode, len(res.Results), res.Modes)
		}
	}
}

// A binary trace replays only the faults that fetched a page: first touches and
// write-protect faults are skipped and counted.
func TestSimBinaryTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run.fmtrace")
	w, err := faulttrace.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w.Record(faulttrace.Record{Pid: 5, Kind: faulttrace.KindWrite, Source: faulttrace.SourceZero, Addr: 0x500000})
	for i := range uint64(40) {
		w.Record(faulttrace.Record{Time: int64(i), Pid: 5, Kind: faulttrace.KindRead, Source: faulttrace.SourceBackend, Addr: (0x100 + 2*i) << 12})
	}
	w.Record(faulttrace.Record{Pid: 5, Kind: faulttrace.KindWP, Source: faulttrace.SourceWP, Addr: 0x104000})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := simRun(t, "--trace", path, "--prefetcher", "stride", "--prefetch-max", "4", "--cache-pages", "64")
	if err != nil {
		t.Fatal(err)
	}
	// stride: transient at the second fault, steady at the third (4 pages ahead). In cache
	// mode every later fault is a hit and tops up one page: 3 misses, 37 hits, 4 + 37
	// prefetched, 4 left over. In map mode a hit is unseen and tops up nothing: the walk
	// uses the 4 pages and misses on the fifth, whose fault infers the 4 and installs 4 more:
	// misses at faults 1, 2, 3, 8, 13, ..., 38 (10), 8 windows of 4, the last one's 2 unused.
	if !strings.Contains(out, "(binary): 40 faults from 1 process (2 first-touch and write-protect faults skipped)") ||
		!regexp.MustCompile(`(?m)^stride +map +4 +40 +30 +10 +32 +2 `).MatchString(out) ||
		!regexp.MustCompile(`(?m)^stride +cache +4 +40 +37 +3 +41 +4 `).MatchString(out) {
		t.Errorf("unexpected:\n%s", out)
	}
}

func TestSimBadInput(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty.txt")
	os.WriteFile(empty, []byte("# nothing here\n"), 0o644)
	bad := filepath.Join(dir, "bad.txt")
	os.WriteFile(bad, []byte("0x10\n0x11\nsomewhere\n"), 0o644)
	trunc := filepath.Join(dir, "trunc.fmtrace")
	os.WriteFile(trunc, []byte(faulttrace.Magic+"0123456789"), 0o644)
	zeros := filepath.Join(dir, "zeros.fmtrace")
	w, _ := faulttrace.Create(zeros)
	w.Record(faulttrace.Record{Pid: 1, Kind: faulttrace.KindRead, Source: faulttrace.SourceZero, Addr: 0x1000})
	w.Close()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"no trace", nil, "--trace FILE is required"},
		{"argument", []string{"--trace", paperTrace, "extra"}, `takes no arguments (got "extra")`},
		{"missing file", []string{"--trace", filepath.Join(dir, "nope")}, "cannot read the trace: open " + filepath.Join(dir, "nope") + ": no such file or directory"},
		{"directory", []string{"--trace", dir}, "is a directory"},
		{"unparsable line", []string{"--trace", bad}, bad + `:3: cannot parse "somewhere" as a page number`},
		{"truncated record", []string{"--trace", trunc}, trunc + ": record 1 is truncated: 10 of 24 bytes"},
		{"empty trace", []string{"--trace", empty}, "has no faults to replay (0 records"},
		{"only first touches", []string{"--trace", zeros}, "has no faults to replay (1 records"},
		{"unknown mode", []string{"--trace", paperTrace, "--mode", "sideways"}, `--mode "sideways": give map (farmem run's default), cache (Leap's) or both`},
		{"empty mode", []string{"--trace", paperTrace, "--mode", ""}, `--mode "": give map`},
		{"unknown prefetcher", []string{"--trace", paperTrace, "--prefetcher", "oracle"}, `unknown prefetcher "oracle": choose all or among leap, streams, readahead, stride, nextn, none`},
		{"empty in list", []string{"--trace", paperTrace, "--prefetcher", "leap,"}, "an empty name"},
		{"not a number", []string{"--trace", paperTrace, "--cache-pages", "lots"}, `invalid value "lots" for flag -cache-pages`},
		{"zero cache", []string{"--trace", paperTrace, "--cache-pages", "0"}, "--cache-pages 0: give a positive number"},
		{"huge cache", []string{"--trace", paperTrace, "--cache-pages", "99999999"}, "prefetch cache of 99999999 pages: give 1 to 16777216"},
		{"negative max", []string{"--trace", paperTrace, "--prefetch-max", "-2"}, "--prefetch-max -2: give a positive number"},
		{"zero max", []string{"--trace", paperTrace, "--prefetch-max", "0"}, "--prefetch-max 0: give a positive number"},
		{"max too large", []string{"--trace", paperTrace, "--prefetch-max", "5000"}, "prefetch max 5000: give 1 to 1024"},
		{"short history", []string{"--trace", paperTrace, "--prefetch-history", "1"}, "prefetch history 1: give 2 to 4096"},
		{"odd split", []string{"--trace", paperTrace, "--prefetch-split", "3"}, "prefetch split 3: give a power of two that divides the history (32)"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := simRun(t, c.args...)
			var ue usageError
			if err == nil || !strings.Contains(err.Error(), c.want) || !errors.As(err, &ue) || strings.Contains(err.Error(), "\n") {
				t.Errorf("farmem sim %s: %v (usage error %v), want a one-line usage error with %q", strings.Join(c.args, " "), err, errors.As(err, &ue), c.want)
			}
			if out != "" {
				t.Errorf("printed on bad input:\n%s", out)
			}
		})
	}
}
