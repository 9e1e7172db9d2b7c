package main

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/farmem/farmem/ctrl"
)

// small is a scenario of seconds of CPU: 24 servers in racks of 6, 60 sessions, churn, two
// rack losses, the last well before the end so that every loss is restored by then.
func small(seed uint64) Params {
	p := DefaultParams()
	p.Servers, p.RackSize, p.Sessions, p.SlabsPerSession, p.Seed = 24, 6, 60, 3, seed
	p.CapacityPages = 2 << 30 / ctrl.PageSize // 32 slabs of 64 MiB
	p.Duration, p.WarmUp = 50*time.Second, 5*time.Second
	p.ChurnFrom, p.ChurnEvery, p.ChurnUntil = 8*time.Second, 5*time.Second, 36*time.Second
	p.RackLosses, p.RackReturn = []time.Duration{15 * time.Second, 28 * time.Second}, 8*time.Second
	p.SlabTurnover, p.SessionLife = 10*time.Second, 60*time.Second
	return p
}

func runSmall(t *testing.T, seed uint64) *Sim {
	t.Helper()
	s, err := NewSim(small(seed), nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Run(); err != nil { // over-capacity servers and refused calls are violations
		t.Fatal(err)
	}
	return s
}

func TestSimRestoresEveryReplica(t *testing.T) {
	s := runSmall(t, 1)
	p := s.p
	if len(s.Losses) < 5 {
		t.Fatalf("%d losses, want the churn's and two racks'", len(s.Losses))
	}
	racks := 0
	for _, l := range s.Losses {
		if l.RestoredAt < 0 {
			t.Errorf("loss %q at %v never restored", l.Kind, l.At)
		}
		if l.DetectedAt < l.At || l.RestoredAt < l.DetectedAt {
			t.Errorf("loss %q at %v: detected at %v, restored at %v", l.Kind, l.At, l.DetectedAt, l.RestoredAt)
		}
		if strings.HasPrefix(l.Kind, "rack") {
			racks++
			if l.Servers != p.RackSize {
				t.Errorf("%s took %d servers, want %d", l.Kind, l.Servers, p.RackSize)
			}
		}
	}
	if racks != 2 {
		t.Errorf("%d rack losses, want 2", racks)
	}
	// Every slab of every open session has its replicas, all ready, on distinct live servers
	// with room.
	now := s.wall()
	slabs := 0
	for _, ss := range s.sessions {
		_, list, err := s.c.Slabs(now, ss.id)
		if err != nil {
			t.Fatal(err)
		}
		for _, sl := range list {
			slabs++
			if sl.Lost {
				t.Errorf("session %s still holds lost slab %d", ss.id, sl.ID)
				continue
			}
			if len(sl.Replicas) != p.Replicas {
				t.Errorf("slab %d has %d replicas, want %d", sl.ID, len(sl.Replicas), p.Replicas)
			}
			seen := map[string]bool{}
			for _, r := range sl.Replicas {
				srv := s.byID[r.Server]
				if r.State != ctrl.Ready || srv == nil || !srv.alive || seen[r.Server] {
					t.Errorf("slab %d: replica %+v (ready, live, distinct?)", sl.ID, r)
				}
				seen[r.Server] = true
				if _, ok := srv.held[sl.ID]; !ok {
					t.Errorf("slab %d: server %s does not hold it", sl.ID, r.Server)
				}
			}
		}
	}
	if slabs == 0 {
		t.Fatal("no slabs at the end")
	}
	st := s.c.Status(now)
	if st.Totals.Degraded != 0 || st.Totals.Rebuilding != 0 || st.Totals.Lost != 0 {
		t.Errorf("totals at the end: %+v", st.Totals)
	}
	for _, srv := range s.servers {
		if srv.used > srv.capacity {
			t.Errorf("server %s holds %d pages, capacity %d", srv.id, srv.used, srv.capacity)
		}
	}
	// What the counter holds is what a store would: saving the final state again writes meta
	// and at most the servers' keys (their used pages move with heartbeats, which change no
	// decision and so are saved with the next change), no session.
	s.tick()
	_, ops, err := ctrl.EtcdSaveTxn(p.Prefix, s.etcd.known, s.c.State())
	if err != nil || len(ops) < 1 || ops[0].Key != p.Prefix+"meta" {
		t.Fatalf("saving the saved state again: %+v, %v", ops, err)
	}
	for _, op := range ops[1:] {
		if !strings.HasPrefix(op.Key, p.Prefix+"servers/") || op.Delete {
			t.Errorf("saving the saved state again writes %s (delete %v)", op.Key, op.Delete)
		}
	}
}

func TestSimDeterministic(t *testing.T) {
	a, b := runSmall(t, 7), runSmall(t, 7)
	if !reflect.DeepEqual(a.Rows, b.Rows) {
		t.Error("two runs of one seed made different rows")
	}
	if len(a.Losses) != len(b.Losses) {
		t.Fatalf("%d and %d losses", len(a.Losses), len(b.Losses))
	}
	for i := range a.Losses {
		x, y := *a.Losses[i], *b.Losses[i]
		x.dead, y.dead = nil, nil
		if !reflect.DeepEqual(x, y) {
			t.Errorf("loss %d: %+v and %+v", i, x, y)
		}
	}
	if c := runSmall(t, 8); reflect.DeepEqual(a.Rows, c.Rows) {
		t.Error("seeds 7 and 8 made the same rows: the seed is not used")
	}
}

func TestSimBadParams(t *testing.T) {
	for _, tc := range []struct {
		change func(*Params)
		want   string
	}{
		{func(p *Params) { p.Servers = 0 }, "at least 1"},
		{func(p *Params) { p.Replicas = 9 }, "replicas must be between 1 and 8"},
		{func(p *Params) { p.CapacityPages = 1 }, "at least one slab"},
		{func(p *Params) { p.SaveEvery = 0 }, "must be positive"},
		{func(p *Params) { p.ServerBW = 0 }, "bandwidths"},
	} {
		p := small(1)
		tc.change(&p)
		if _, err := NewSim(p, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want %q", err, tc.want)
		}
	}
	for _, args := range [][]string{{"-rack-losses", "10s,soon"}, {"extra"}} {
		if err := run(args); err == nil {
			t.Errorf("run %q: no error", args)
		}
	}
}

// The report is made from the CSVs alone: what it says comes from the rows written.
func TestSimReportFromCSVs(t *testing.T) {
	s := runSmall(t, 3)
	dir := t.TempDir()
	info := runInfo{Command: "go run ./workloads/ctrlsim -test", Commit: "abc123", Date: "today", Go: "go", CPUs: 2, Params: s.p}
	if err := writeRun(dir, info, s, &cpuMeter{}); err != nil {
		t.Fatal(err)
	}
	if err := renderDir(dir); err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(dir, "ctrlsim.md"))
	if err != nil {
		t.Fatal(err)
	}
	series, err := readCSV(filepath.Join(dir, "series.csv"))
	if err != nil || len(series) != len(s.Rows) {
		t.Fatalf("series.csv: %d rows (%v), want %d", len(series), err, len(s.Rows))
	}
	doc := string(md)
	for _, want := range []string{"`go run ./workloads/ctrlsim -test`, at commit abc123", "## Placement balance", "## Restoring every replica",
		"## etcd writes", "## Where the design stops scaling", "| rack "} {
		if !strings.Contains(doc, want) {
			t.Errorf("the report has no %q", want)
		}
	}
	svg, err := os.ReadFile(filepath.Join(dir, "ctrlsim.svg"))
	if err != nil || !strings.Contains(string(svg), "<polyline") {
		t.Errorf("no plot: %v", err)
	}
	if err := renderDir(t.TempDir()); err == nil {
		t.Error("rendering an empty directory: no error")
	}
}

// Saving per change (the service's pace one request at a time) issues a transaction for every
// change a request made, and decides the same.
func TestSimSavePerChange(t *testing.T) {
	p := small(5)
	tick, err := NewSim(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	p.SavePerChange = true
	each, err := NewSim(p, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Sim{tick, each} {
		if err := s.Run(); err != nil {
			t.Fatal(err)
		}
	}
	sum := func(s *Sim) (txns, changes int) {
		for _, r := range s.Rows {
			txns += r.Txns
			changes += r.Changes
		}
		return
	}
	t1, c1 := sum(tick)
	t2, c2 := sum(each)
	t.Logf("per tick: %d txns for %d changes; per change: %d txns for %d changes", t1, c1, t2, c2)
	if c1 != c2 || t2 <= t1 || t2 < c2/2 {
		t.Errorf("per tick: %d txns for %d changes; per change: %d txns for %d changes", t1, c1, t2, c2)
	}
	for i := range tick.Rows {
		a, b := tick.Rows[i], each.Rows[i]
		if a.Slabs != b.Slabs || a.UsedMaxPages != b.UsedMaxPages || a.Degraded != b.Degraded {
			t.Fatalf("at %v the runs decided differently: %+v and %+v", a.T, a, b)
		}
	}
}
