package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/farmem/farmem/launcher"
)

// Every prefetcher installs pages behind the program's back: the torture (threads, fork,
// MADV_DONTNEED, munmap, mremap) must still verify every unit with each of them, and the cap
// holds as for demand faults (prefetch fills only the room below the evictor's high water).
// Cache mode serves faults from copies read ahead: the same torture catches a stale one.
func TestPrefetchersKeepDataIntact(t *testing.T) {
	for _, pf := range []string{"leap", "streams", "readahead", "stride", "nextn", "leap/cache"} {
		t.Run(pf, func(t *testing.T) {
			name, mode, _ := strings.Cut(pf, "/")
			if mode == "" {
				mode = "map"
			}
			s, peaks := runTorture(t, 16, []string{"--prefetch", name, "--prefetch-mode", mode}, "--mib", "128", "--rounds", "3")
			if p := s.Prefetch; p == nil || p.Name != name || p.Mode != mode || p.Placed == 0 {
				t.Fatalf("--prefetch %s placed no page: the test did not exercise it (%+v)", pf, p)
			}
			if mode == "cache" && s.Faults["cache"].Count == 0 {
				t.Fatalf("no fault was served from the prefetch cache")
			}
			checkCap(t, s, peaks, 16<<20)
		})
	}
}

// backendFaults is the summary's count of faults served from the backend.
func backendFaults(s *launcher.Summary) int { return int(s.Faults["backend"].Count) }

// On a strided walk Leap's predictions are installed before the program touches them: the
// same walk takes far fewer backend faults than with no prefetcher, and every page verifies.
// In cache mode the same holds for reads from the backend, but the walk still faults on every
// page Leap got right: those faults are served from the cache.
//
// How many predictions get installed depends on the room the evictor has made when they
// arrive (prefetch only fills the room below the high watermark), and so on scheduling: with
// both CPUs loaded by other work, leap/map once took 52 % of none's backend faults (17241 of
// 32838). The bound is 3/4: a prefetcher that did nothing, or whose pages were all dropped,
// takes as many as none. With no prefetch flag, farmem run prefetches with streams in map mode.
func TestLeapPrefetchSavesFaults(t *testing.T) {
	faults := map[string]int{}
	for _, pf := range []string{"none", "leap/map", "leap/cache", "default"} {
		args := []string{"run", "--local-mem", "16MiB"}
		name, mode, _ := strings.Cut(pf, "/")
		if pf != "default" {
			args = append(args, "--prefetch", name)
			if mode != "" {
				args = append(args, "--prefetch-mode", mode)
			}
		}
		out, s, _, err := runSampled(t, append(args, "--",
			filepath.Join(binDir, "micro"), "--mib", "64", "--pattern", "stride:3", "--passes", "2")...)
		if err != nil || !strings.Contains(out, "micro: OK bad=0") {
			t.Fatalf("micro under farmem --prefetch %s: %v", pf, err)
		}
		if p := s.Prefetch; pf == "default" && (p == nil || p.Name != "streams" || p.Mode != "map") {
			t.Fatalf("farmem run with no prefetch flag did not prefetch with streams in map mode: %+v", p)
		}
		faults[pf] = backendFaults(s)
		if hit := s.Faults["cache"].Count > 0; hit != (mode == "cache") {
			t.Fatalf("--prefetch %s: faults served from the prefetch cache: %v", pf, hit)
		}
	}
	if faults["none"] < 20000 {
		t.Fatalf("only %d backend faults without prefetching: the walk did not page", faults["none"])
	}
	for _, pf := range []string{"leap/map", "leap/cache", "default"} {
		if faults[pf]*4 > faults["none"]*3 {
			t.Fatalf("%s took %d backend faults, none %d: want fewer than 3/4", pf, faults[pf], faults["none"])
		}
	}
}

// A trace recorded by farmem run replays in farmem sim: the replay sees every backend fault of
// the run, and on a strided walk Leap would have covered most of them. --record-faults alone
// turns the default prefetcher off (a right guess never faults, so the trace would miss it).
func TestRecordFaultsReplaysInSim(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "stride.fmtrace")
	out, s, _, err := runSampled(t, "run", "--local-mem", "16MiB", "--record-faults", trace, "--",
		filepath.Join(binDir, "micro"), "--mib", "48", "--pattern", "stride:10", "--passes", "1")
	if err != nil || !strings.Contains(out, "micro: OK bad=0") {
		t.Fatalf("micro under farmem --record-faults: %v", err)
	}
	if !strings.Contains(out, "faults to "+trace) {
		t.Fatalf("farmem did not say where the trace went")
	}
	if s.Prefetch != nil {
		t.Fatalf("--record-faults without --prefetch prefetched: %+v", s.Prefetch)
	}
	run := backendFaults(s)
	sim, err := exec.Command(farmemBin(t), "sim", "--trace", trace, "--prefetcher", "leap,none", "--mode", "map", "--json").Output()
	if err != nil {
		t.Fatalf("farmem sim: %v", err)
	}
	var res struct {
		Results []struct {
			Prefetcher string
			Faults     uint64
			Coverage   float64
		}
	}
	if err := json.Unmarshal(sim, &res); err != nil {
		t.Fatalf("farmem sim --json: %v\n%s", err, sim)
	}
	rows := res.Results
	got := map[string]string{}
	for _, r := range rows {
		got[r.Prefetcher] = fmt.Sprintf("%d faults, coverage %.2f", r.Faults, r.Coverage)
		if r.Faults != uint64(run) {
			t.Errorf("sim replayed %d faults with %s; the run served %d from the backend", r.Faults, r.Prefetcher, run)
		}
		if r.Prefetcher == "leap" && r.Coverage < 0.5 {
			t.Errorf("leap covers %.2f of a stride-10 walk in replay, want most of it", r.Coverage)
		}
	}
	if len(rows) != 2 {
		t.Fatalf("sim gave %d rows, want 2: %v\n%s", len(rows), got, sim)
	}
	t.Logf("%v", got)
}
