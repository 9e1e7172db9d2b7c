package main

import (
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// A line as floorpager prints it at exit.
const floorLine = "floorpager: cap_pages=4096 first_touch=16384 refaults=31632 evicted=44032 batches=172 discarded=0 wakes=0 pages_per_batch=256.0 runs_per_batch=161.1 secs=0.510 pages_per_sec=86190 bound_pages_per_sec=207940 wake_ns=5731 fault_ns=2363 fault_p50_ns=2163 install_ns=2322 first_fault_ns=1789 first_install_ns=1753 evict_ns_page=2446 move_ns_page=929 move_ns_batch=237728 move_agent_ns_page=865 readv_ns_page=777 readv_ns_batch=198805 store_ns_page=453 store_ns_batch=116003 drop_ns_page=283 drop_ns_batch=72512 drop_agent_ns_batch=57628 flush_est_ns=0 peak_anon_kib=18432"

func TestParseFloor(t *testing.T) {
	out := "micro: pass1 pages=16384 secs=0.183 pages_per_sec=89413\nmicro: OK bad=0\n" + floorLine + "\n"
	m := parseFloor(out)
	if m == nil {
		t.Fatal("no line found")
	}
	for k, want := range map[string]float64{"cap_pages": 4096, "refaults": 31632, "evicted": 44032, "pages_per_batch": 256, "secs": 0.51,
		"fault_p50_ns": 2163, "wake_ns": 5731, "move_ns_page": 929, "drop_agent_ns_batch": 57628, "flush_est_ns": 0, "peak_anon_kib": 18432} {
		if got, ok := m[k]; !ok || got != want {
			t.Errorf("%s = %v (present %v), want %v", k, got, ok, want)
		}
	}
	for _, k := range floorKeys {
		if _, ok := m[k]; !ok {
			t.Errorf("the CSV's key %s is not on floorpager's line", k)
		}
	}
	if parseFloor("micro: OK bad=0\nfloorpager: the program forked: not supported\n") != nil {
		t.Error("an error line parsed as a summary")
	}
}

// A farmem --summary-json, the parts the harness reads (launcher.Summary writes it).
const summaryJSON = `{"exit_status": 0,
  "faults": {"zero": {"count": 16384, "sum_ns": 100000000, "p50_ns": 3200, "p99_ns": 10000},
             "backend": {"count": 31000, "sum_ns": 300000000, "p50_ns": 12500, "p99_ns": 40000}},
  "held": {"room": {"count": 40, "sum_ns": 60000000}, "busy": {"count": 3, "sum_ns": 2000000},
           "event": {"count": 0, "sum_ns": 0}},
  "evicted": {"written": 20000, "dropped_clean": 2000, "zero": 16},
  "batches": {"count": 172, "stage_ns": {"move": 44032000, "write-protect": 0, "copy out": 220160000,
             "store": 11008000, "drop": 5504000, "wake": 0}},
  "bytes_in": 126976000, "bytes_out": 81920000, "peak_anon_bytes": 17825792, "cgroup_peak_bytes": 18350080}`

func testSummary(t *testing.T) farmemSummary {
	t.Helper()
	path := filepath.Join(t.TempDir(), "summary.json")
	if err := os.WriteFile(path, []byte(summaryJSON), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := readSummary(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A run's result takes farmem's summary's raw numbers: backend faults and their service
// latency, bytes moved, the cgroup's peak, and the stages per batch and per page.
func TestSummaryJSONApplies(t *testing.T) {
	var r result
	testSummary(t).apply(&r)
	if r.faults != 31000 || r.fsP50 != 12.5 || r.fsP99 != 40 || r.inB != 126976000 || r.outB != 81920000 || r.peakB != 18350080 || !r.peakCgroup {
		t.Errorf("result %+v", r)
	}
	if r.held != [3]float64{40, 3, 0} || r.heldNs != 62e6 || r.faultNs != 400e6 {
		t.Errorf("held %v, %v ns of %v ns, want [40 3 0], 62e6 of 400e6", r.held, r.heldNs, r.faultNs)
	}
	s := r.stages
	if s.batches != 172 || s.pages != 128 {
		t.Errorf("batches %v pages %v, want 172 and 128 (22016 evicted)", s.batches, s.pages)
	}
	want := [len(stageNames)]float64{256e3, 0, 1280e3, 64e3, 32e3, 0}
	if s.stage != want {
		t.Errorf("stages %v, want %v", s.stage, want)
	}
	if got := s.perPage(2); got != 10e3 {
		t.Errorf("copy out per page %v ns, want 10000", got)
	}
	// Without a cgroup of its own, farmem's peak is its sampled anonymous RSS.
	sum := testSummary(t)
	sum.CgroupPeakBytes = nil
	sum.apply(&r)
	if r.peakB != 17825792 || r.peakCgroup {
		t.Errorf("peak %d (cgroup %v), want the sampled 17825792", r.peakB, r.peakCgroup)
	}
	// A run with no batch has no stages.
	sum.Batches.Count = 0
	if st := sum.stages(); st.batches != 0 || st.pages != 0 {
		t.Errorf("no batches: %+v", st)
	}
}

// The floor section's arithmetic: multiples of the floor, per-page stages, per-page costs.
func TestFloorSection(t *testing.T) {
	w := workload{name: "micro-random", title: "micro random", metric: "pages/s (2 passes)",
		args: []string{"bin/micro", "--mib", "64", "--passes", "2", "--pattern", "random"}}
	if got := microWork(w); got != 64*256*2 {
		t.Fatalf("microWork %v", got)
	}
	fl, fm, zr := config{kind: "floor", pct: 25}, config{kind: "farmem", pct: 25}, config{kind: "swap", swap: "zram", pct: 25}
	nat := result{wl: w.name, cfg: config{kind: "native"}, round: 1, tput: 1e6, wall: 1}
	floor := result{wl: w.name, cfg: fl, round: 1, capMiB: 16, tput: 80000, wall: 1, inB: 32768 * 4096, outB: 40000 * 4096, sysS: 0.5, userS: 0.1,
		floor: map[string]float64{"pages_per_sec": 86000, "fault_p50_ns": 2000, "wake_ns": 6000, "install_ns": 2300, "move_ns_page": 1000,
			"readv_ns_page": 800, "store_ns_page": 400, "drop_ns_page": 300, "evict_ns_page": 2500, "peak_anon_kib": 18432}}
	farmem := result{wl: w.name, cfg: fm, round: 1, capMiB: 16, tput: 20000, wall: 3, inB: 32768 * 4096, outB: 40000 * 4096, fsP50: 24, sysS: 1.5, userS: 1,
		stages: farmemStages{batches: 100, pages: 200, stage: [len(stageNames)]float64{400e3, 0, 320e3, 160e3, 120e3, 0}},
		held:   [3]float64{40, 3, 0}, heldNs: 62e6, faultNs: 400e6}
	zram := result{wl: w.name, cfg: zr, round: 1, capMiB: 16, limitB: 17 << 20, tput: 40000, wall: 2, inB: 30000 * 4096, outB: 35000 * 4096, faults: 29000, sysS: 1.3, userS: 0.2}
	rs := []result{nat, floor, farmem, zram}
	natStat := map[string]stat{}
	natStat[w.name], _ = summarize(rs, w.name, config{kind: "native"})
	h := &harness{refs: map[string]*ref{w.name: {peakMiB: 64}}}
	var b strings.Builder
	h.floorSection(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, []workload{w}, []int{25}, rs, natStat)
	out := b.String()
	for _, want := range []string{
		// 80000 / 1e6 native; 18432 KiB = 18.0 MiB held against a 16 MiB cap
		"| micro random | 25 % | 80000 | 0.08 | 18.0 (16) | 20000 | 0.25 | 86000 | - |",
		// 24 µs against 2 + 6 µs
		"| micro random | 25 % | fault round trip, p50: read to the install's return, the wake included | 8.00 | 24.0 | 3.0x |",
		// farmem's stage per page: 400 µs a batch of 200 pages = 2 µs, against 1 µs
		"| micro random | 25 % | move (the agent's UFFDIO_MOVE, request to reply) | 1.00 | 2.00 | 2.0x |",
		"| micro random | 25 % | copy out (process_vm_readv) | 0.80 | 1.60 | 2.0x |",
		"| micro random | 25 % | store | 0.40 | 0.80 | 2.0x |",
		"| micro random | 25 % | drop (the agent's madvise of the staging area) | 0.30 | 0.60 | 2.0x |",
		"| micro random | 25 % | eviction, the whole batch | 2.50 | 5.00 | 2.0x |",
		"| micro random | 25 % | install (UFFDIO_COPY of a page read back) | 2.30 | - | - |",
		// (32768/80000 - 32768/1e6) s / 32768 pages = 11.5 µs; 0.5 s / 72768 pages = 6.87 µs
		"| micro random | 25 % | floor | 32768 | 40000 | - | 11.5 | 6.87 | 8.25 |",
		"| micro random | 25 % | farmem | 32768 | 40000 | - | 49.0 | 20.6 | 34.4 |",
		// zram: (32768/40000 - 32768/1e6)/30000 = 26.2 µs; 1.3 s / 65000 = 20 µs
		"| micro random | 25 % | swap-zram | 30000 | 35000 | 29000 | 26.2 | 20.0 | 23.1 |",
		// 62 of 400 ms of fault service
		"| micro random | 25 % | farmem | 40 | 3 | 0 | 15.5 % |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
	// No floor run: no section.
	b.Reset()
	h.floorSection(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) }, []workload{w}, []int{25}, []result{nat, farmem}, natStat)
	if b.Len() != 0 {
		t.Errorf("a section without floor runs:\n%s", b.String())
	}
	if !math.IsNaN(slowdownPerPageIn(100, 200, 10, 0)) {
		t.Error("slowdown with no page in")
	}
}

// The CSV keeps the floor's line, farmem's stages and the CPU times, and -render reads them back.
func TestFloorCSVRoundTrip(t *testing.T) {
	rs := []result{
		{wl: "micro-random", cfg: config{kind: "floor", pct: 25}, round: 1, capMiB: 16, wall: 1.5, tput: 8e4, faults: 31632, inB: 31632 * 4096, outB: 44032 * 4096,
			userS: 0.125, sysS: 0.75, vmMajflt: 3, floor: parseFloor(floorLine)},
		{wl: "micro-random", cfg: config{kind: "farmem", pct: 25}, round: 1, capMiB: 16, wall: 3, tput: 2e4, userS: 1, sysS: 2},
	}
	rs[1].stages = testSummary(t).stages()
	for k := range rs[0].floor { // the CSV keeps floorKeys only
		if !strings.Contains(strings.Join(floorKeys, " "), k) {
			delete(rs[0].floor, k)
		}
	}
	path := filepath.Join(t.TempDir(), "swap.csv")
	if err := writeCSV(path, rs); err != nil {
		t.Fatal(err)
	}
	got, _, err := readResults(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rs) {
		t.Errorf("read back:\n%+v\nwant\n%+v", got, rs)
	}
}

// floorpager pages micro (64 MiB at a 16 MiB cap), from its own process and with --inproc
// from within the program: every page verifies, the summary shows paging, and the program's
// anonymous memory stayed within the cap (with --inproc the pager's own store and FIFO live in
// the program, in shared memory that must not count).
func TestFloorPagerMicro(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (userfaultfd)")
	}
	root, _ := filepath.Abs("../../..")
	pager, micro := filepath.Join(root, "bin/floorpager"), filepath.Join(root, "bin/micro")
	for _, b := range []string{pager, micro, filepath.Join(root, "bin/floorshim.so")} {
		if _, err := os.Stat(b); err != nil {
			t.Skipf("%s not built (make build)", b)
		}
	}
	for _, mode := range [][]string{nil, {"--inproc"}} {
		args := append(append([]string{"--local-mem", "16MiB"}, mode...), "--", micro, "--mib", "64", "--pattern", "random", "--passes", "2")
		out, err := exec.Command(pager, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v %v:\n%s", mode, err, out)
		}
		if !strings.Contains(string(out), "micro: OK bad=0\n") {
			t.Fatalf("%v: micro did not verify:\n%s", mode, out)
		}
		m := parseFloor(string(out))
		if m == nil || m["refaults"] == 0 || m["evicted"] == 0 || m["cap_pages"] != 4096 {
			t.Fatalf("%v: no paging in the summary: %v\n%s", mode, m, out)
		}
		// micro's one mapping is all the pager holds to the cap; its stack, libc's heap and
		// (with --inproc) the pager's state arrays are outside it: a little room for those.
		if peak := m["peak_anon_kib"]; peak == 0 || peak > 16*1024+2048 {
			t.Fatalf("%v: the program's anonymous peak was %.0f KiB at a 16 MiB cap", mode, peak)
		}
	}
}

// floor-inproc is a configuration of its own: parsed, named back the same (a CSV's rows are
// read back by name), and not the floor that the report's floor columns compare farmem with.
func TestFloorInprocConfig(t *testing.T) {
	cs, _, err := configs([]string{"floor", "floor-inproc"}, []string{"25"})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 2 || cs[0].name() != "floor" || cs[1].name() != "floor-inproc" {
		t.Fatalf("configs floor,floor-inproc gave %+v", cs)
	}
	if cs[0] == cs[1] || !cs[1].inproc || cs[1].kind != "floor" {
		t.Fatalf("floor-inproc is %+v, want the floor kind with inproc set", cs[1])
	}
}
