package ctrl

// The state machine, without a network: time is whatever the test says it is.

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/farmem/farmem/fabric"
)

var (
	testToken = fabric.Token("0123456789abcdef0123456789abcdef")
	t0        = time.Unix(1_700_000_000, 0)
)

func at(d time.Duration) time.Time { return t0.Add(d) }

func newTestCluster(seed uint64, slabPages uint32) *Cluster {
	return NewCluster(Config{Token: testToken, SlabPages: slabPages, Rand: rand.New(rand.NewPCG(seed, 42))})
}

type testServer struct {
	id, addr       string
	capacity, used uint64
	slabs          []uint64 // what it reports holding
}

func (ts *testServer) heartbeat(t *testing.T, c *Cluster, now time.Time) HeartbeatReply {
	t.Helper()
	r, err := c.ServerHeartbeat(now, ServerReport{ID: ts.id, Addr: ts.addr, CapacityPages: ts.capacity, UsedPages: ts.used, Slabs: ts.slabs})
	if err != nil {
		t.Fatalf("heartbeat of %s at %v: %v", ts.id, now.Sub(t0), err)
	}
	return r
}

func servers(n int, capacity uint64) []*testServer {
	var out []*testServer
	for i := range n {
		out = append(out, &testServer{id: "srv-" + string(rune('a'+i)), addr: "10.0.0." + string(rune('1'+i)) + ":7070", capacity: capacity})
	}
	return out
}

func openSession(t *testing.T, c *Cluster, now time.Time) fabric.SessionID {
	t.Helper()
	return c.OpenSession(now, "host 1234 redis-server").ID
}

func alloc(t *testing.T, c *Cluster, now time.Time, id fabric.SessionID, r int) Slab {
	t.Helper()
	sl, err := c.AllocSlab(now, id, r)
	if err != nil {
		t.Fatalf("AllocSlab(%d) at %v: %v", r, now.Sub(t0), err)
	}
	return sl
}

func slabOf(t *testing.T, c *Cluster, now time.Time, id fabric.SessionID, slab uint64) (uint64, Slab) {
	t.Helper()
	gen, slabs, err := c.Slabs(now, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range slabs {
		if s.ID == slab {
			return gen, s
		}
	}
	t.Fatalf("slab %d not listed: %+v", slab, slabs)
	return 0, Slab{}
}

func checkGrants(t *testing.T, sid fabric.SessionID, s Slab) {
	t.Helper()
	for _, r := range s.Replicas {
		g := r.Grant
		if !testToken.Valid(&g) || g.Slab != s.ID || g.Session != sid || g.Server != r.Server || g.Pages != s.Pages {
			t.Errorf("replica %+v of slab %d: grant does not name it or is not signed with the token", r, s.ID)
		}
	}
}

func TestCtrlReplicasOnDistinctServers(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(4, 1<<20)
	for _, s := range srv {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	seen := map[uint64]bool{}
	for range 50 {
		sl := alloc(t, c, t0, sid, 3)
		if seen[sl.ID] {
			t.Fatalf("slab id %d handed out twice", sl.ID)
		}
		seen[sl.ID] = true
		if len(sl.Replicas) != 3 || sl.Pages != 16 || sl.Lost {
			t.Fatalf("slab %+v: want 3 replicas of 16 pages", sl)
		}
		on := map[string]bool{}
		for _, r := range sl.Replicas {
			if on[r.Server] {
				t.Fatalf("slab %d has two replicas on %s", sl.ID, r.Server)
			}
			on[r.Server] = true
			if r.State != Ready || !strings.HasSuffix(r.Addr, ":7070") {
				t.Errorf("new replica %+v: want ready with its server's addr", r)
			}
		}
		checkGrants(t, sid, sl)
	}
	if _, err := c.AllocSlab(t0, sid, 0); !errors.Is(err, ErrBadRequest) {
		t.Errorf("0 replicas: %v, want ErrBadRequest", err)
	}
}

// Power of two choices: of three servers, the emptiest is in two thirds of the pairs and wins
// each of them, so it gets about four times what each of the others gets.
func TestCtrlPowerOfTwoPrefersEmptierServer(t *testing.T) {
	c := newTestCluster(7, 16)
	srv := servers(3, 1_000_000)
	srv[1].used, srv[2].used = 500_000, 500_000
	for _, s := range srv {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	got := map[string]int{}
	for range 600 {
		got[alloc(t, c, t0, sid, 1).Replicas[0].Server]++
	}
	t.Logf("placements: %v", got)
	if got["srv-a"] < 2*got["srv-b"] || got["srv-a"] < 2*got["srv-c"] {
		t.Errorf("the emptier server srv-a did not get clearly more: %v", got)
	}
	if got["srv-b"] == 0 || got["srv-c"] == 0 {
		t.Errorf("power of two never chose the fuller servers (it is not 'always the emptiest'): %v", got)
	}
}

// A burst of allocations between two heartbeats sees its own grants: without counting them,
// all six would land on the server that looked emptiest at the last heartbeat.
func TestCtrlGrantsCountAgainstFreeMemory(t *testing.T) {
	c := newTestCluster(3, 100)
	srv := servers(2, 1000)
	srv[1].used = 200
	for _, s := range srv {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	got := map[string]int{}
	var ids []uint64
	for range 6 {
		sl := alloc(t, c, t0, sid, 1)
		got[sl.Replicas[0].Server]++
		ids = append(ids, sl.ID)
	}
	// Free 1000 and 800 less 100 a slab, always to the emptier: 4 and 2.
	if got["srv-a"] != 4 || got["srv-b"] != 2 {
		t.Errorf("placements %v, want srv-a 4 and srv-b 2", got)
	}
	// Once the servers report the slabs (and their used pages), they are not counted twice.
	for _, s := range srv {
		s.slabs = nil
	}
	_, slabs, _ := c.Slabs(t0, sid)
	for _, sl := range slabs {
		for _, s := range srv {
			if s.id == sl.Replicas[0].Server {
				s.slabs = append(s.slabs, sl.ID)
				s.used += 100
			}
		}
	}
	for _, s := range srv {
		if free := s.heartbeat(t, c, at(time.Second)).Free; len(free) != 0 {
			t.Errorf("%s told to free %v, slabs the ctrl placed there", s.id, free)
		}
	}
	st := c.Status(at(time.Second))
	for _, s := range st.Servers {
		if s.FreePages != 600 {
			t.Errorf("%s: %d pages free after the report, want 600", s.ID, s.FreePages)
		}
	}
	// Room runs out: 18 slabs fit in all.
	for range 12 {
		alloc(t, c, at(time.Second), sid, 1)
	}
	if _, err := c.AllocSlab(at(time.Second), sid, 1); !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "2 memory servers are live but only 0 have room") {
		t.Errorf("a full cluster: %v, want ErrNoRoom saying 2 live, 0 with room", err)
	}
}

func TestCtrlNotEnoughServers(t *testing.T) {
	c := newTestCluster(1, 16)
	sid := openSession(t, c, t0)
	_, err := c.AllocSlab(t0, sid, 1)
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "no memory server is live") {
		t.Errorf("no servers: %v", err)
	}
	srv := servers(3, 1000)
	srv[2].used = 990
	for _, s := range srv[:2] {
		s.heartbeat(t, c, t0)
	}
	_, err = c.AllocSlab(t0, sid, 3)
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "only 2 memory servers are live") ||
		!strings.Contains(err.Error(), "10.0.0.1:7070 3.9MiB free") || !strings.Contains(err.Error(), "10.0.0.2:7070") {
		t.Errorf("3 replicas on 2 servers: %v", err)
	}
	srv[2].heartbeat(t, c, t0)
	_, err = c.AllocSlab(t0, sid, 3)
	if !errors.Is(err, ErrNoRoom) || !strings.Contains(err.Error(), "3 memory servers are live but only 2 have room") {
		t.Errorf("3 replicas, one server full: %v", err)
	}
	// Nothing was placed by the failed attempts.
	if st := c.Status(t0); st.Totals.Slabs != 0 || st.Servers[0].FreePages != 1000 {
		t.Errorf("a refused allocation left something behind: %+v", st)
	}
	alloc(t, c, t0, sid, 2)
}

// killOne keeps every server but victim heartbeating (and the session) until victim is dead.
func killOne(t *testing.T, c *Cluster, srv []*testServer, victim string, sid fabric.SessionID, from time.Duration) time.Duration {
	t.Helper()
	for d := from + 500*time.Millisecond; d <= from+3*time.Second; d += 500 * time.Millisecond {
		for _, s := range srv {
			if s.id != victim {
				s.heartbeat(t, c, at(d))
			}
		}
		if _, err := c.SessionHeartbeat(at(d), sid); err != nil {
			t.Fatal(err)
		}
	}
	return from + 3*time.Second
}

func TestCtrlServerDeathRebuildsReplica(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(3, 1000)
	for _, s := range srv {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	sl := alloc(t, c, t0, sid, 2)
	gen0, _ := c.SessionHeartbeat(t0, sid)
	victim, survivor := sl.Replicas[0], sl.Replicas[1]
	c.TakeEvents()

	now := killOne(t, c, srv, victim.Server, sid, 0)
	gen, got := slabOf(t, c, at(now), sid, sl.ID)
	if gen <= gen0 {
		t.Errorf("generation %d after a replica was lost, was %d: the client would not refetch", gen, gen0)
	}
	if len(got.Replicas) != 2 || got.Lost {
		t.Fatalf("after %s died: %+v, want 2 replicas", victim.Server, got)
	}
	if got.Replicas[0].Server != survivor.Server || got.Replicas[0].State != Ready {
		t.Errorf("the surviving replica is %+v, want %s ready", got.Replicas[0], survivor.Server)
	}
	third := got.Replicas[1]
	if third.Server == victim.Server || third.Server == survivor.Server || third.State != Rebuilding {
		t.Errorf("replacement %+v: want a rebuilding replica on the third server", third)
	}
	checkGrants(t, sid, got)
	if st := c.Status(at(now)); st.Totals.Degraded != 1 || st.Totals.Rebuilding != 1 || st.Totals.HealthyServers != 2 {
		t.Errorf("status totals %+v: want 1 degraded, 1 rebuilding, 2 healthy", st.Totals)
	}
	var msgs []string
	for _, e := range c.TakeEvents() {
		msgs = append(msgs, e.Msg)
	}
	log := strings.Join(msgs, "\n")
	if !strings.Contains(log, "is dead") || !strings.Contains(log, "replacement replica placed on "+third.Addr) {
		t.Errorf("events do not tell of the death and the replacement:\n%s", log)
	}

	// The client filled it.
	if err := c.ReplicaReady(at(now), sid, sl.ID, third.Server); err != nil {
		t.Fatal(err)
	}
	gen2, got := slabOf(t, c, at(now), sid, sl.ID)
	if got.Replicas[1].State != Ready || gen2 != gen {
		t.Errorf("after ReplicaReady: %+v gen %d (was %d): want ready, generation unchanged (the client made the change)", got.Replicas[1], gen2, gen)
	}
	if st := c.Status(at(now)); st.Totals.Degraded != 0 || st.Totals.Rebuilding != 0 {
		t.Errorf("status totals %+v: want whole again", st.Totals)
	}
	if err := c.ReplicaReady(at(now), sid, sl.ID, victim.Server); !errors.Is(err, ErrConflict) {
		t.Errorf("ReplicaReady on the dead server: %v, want ErrConflict", err)
	}

	// The dead incarnation comes back: gone.
	for _, s := range srv {
		if s.id == victim.Server {
			_, err := c.ServerHeartbeat(at(now), ServerReport{ID: s.id, Addr: s.addr, CapacityPages: s.capacity, Slabs: []uint64{sl.ID}})
			if !errors.Is(err, ErrGone) || !strings.Contains(err.Error(), "declared dead") {
				t.Errorf("heartbeat from a dead server: %v, want ErrGone", err)
			}
		}
	}
}

func TestCtrlSingleReplicaLost(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(2, 1000)
	for _, s := range srv {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	sl := alloc(t, c, t0, sid, 1)
	gen0, _ := c.SessionHeartbeat(t0, sid)
	victim := sl.Replicas[0]
	now := killOne(t, c, srv, victim.Server, sid, 0)
	gen, got := slabOf(t, c, at(now), sid, sl.ID)
	if !got.Lost || len(got.Replicas) != 0 || !slices.Equal(got.LostServers, []string{victim.Addr}) {
		t.Errorf("R=1 slab after its server died: %+v, want lost naming %s", got, victim.Addr)
	}
	if gen <= gen0 {
		t.Errorf("generation did not move on a lost slab")
	}
	if st := c.Status(at(now)); st.Totals.Lost != 1 || st.Sessions[0].Lost != 1 {
		t.Errorf("status %+v: want 1 lost", st.Totals)
	}
	// Lost stays lost, even with room elsewhere: zeros are never served as its data.
	for _, s := range srv {
		if s.id != victim.Server {
			s.heartbeat(t, c, at(now))
		}
	}
	if _, got := slabOf(t, c, at(now), sid, sl.ID); !got.Lost || len(got.Replicas) != 0 {
		t.Errorf("a lost slab came back: %+v", got)
	}
}

// Both copies of an R=2 slab die one after the other, the second before the rebuild finished:
// lost, naming both; the unfilled replacement is given up too.
func TestCtrlRebuildInterruptedLosesSlab(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(3, 1000)
	for _, s := range srv {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	sl := alloc(t, c, t0, sid, 2)
	now := killOne(t, c, srv, sl.Replicas[0].Server, sid, 0)
	var alive []*testServer
	for _, s := range srv {
		if s.id != sl.Replicas[0].Server {
			alive = append(alive, s)
		}
	}
	now = killOne(t, c, alive, sl.Replicas[1].Server, sid, now)
	_, got := slabOf(t, c, at(now), sid, sl.ID)
	if !got.Lost || len(got.Replicas) != 0 || len(got.LostServers) != 2 {
		t.Errorf("%+v: want lost naming both servers that held it", got)
	}
	for _, s := range alive {
		if s.id != sl.Replicas[1].Server {
			s.slabs = []uint64{sl.ID} // it had started filling the replacement
			if free := s.heartbeat(t, c, at(now)).Free; !slices.Equal(free, []uint64{sl.ID}) {
				t.Errorf("the unfinished replacement on %s is not freed: %v", s.id, free)
			}
		}
	}
}

func TestCtrlDegradedUntilAServerHasRoom(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(3, 1000)
	for _, s := range srv[:2] {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	sl := alloc(t, c, t0, sid, 2)
	now := killOne(t, c, srv[:2], sl.Replicas[0].Server, sid, 0)
	gen1, got := slabOf(t, c, at(now), sid, sl.ID)
	if len(got.Replicas) != 1 || got.Lost {
		t.Fatalf("%+v: want one ready replica and no room for another", got)
	}
	now += time.Second
	for _, s := range srv[:2] {
		if s.id != sl.Replicas[0].Server {
			s.heartbeat(t, c, at(now))
		}
	}
	c.SessionHeartbeat(at(now), sid)
	if st := c.Status(at(now)); st.Totals.Degraded != 1 || st.Sessions[0].Degraded != 1 {
		t.Errorf("status %+v: want the slab reported degraded", st.Totals)
	}
	srv[2].heartbeat(t, c, at(now))
	gen2, got := slabOf(t, c, at(now), sid, sl.ID)
	if len(got.Replicas) != 2 || got.Replicas[1].Server != srv[2].id || got.Replicas[1].State != Rebuilding || gen2 <= gen1 {
		t.Errorf("after %s joined: %+v gen %d (was %d): want a rebuilding replica there and a new generation", srv[2].id, got, gen2, gen1)
	}
}

func TestCtrlSessionExpiryFreesSlabs(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(2, 1000)
	for _, s := range srv {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	kept := openSession(t, c, t0)
	var ids []uint64
	for range 3 {
		sl := alloc(t, c, t0, sid, 2)
		ids = append(ids, sl.ID)
	}
	keep := alloc(t, c, t0, kept, 2)
	for _, s := range srv {
		s.slabs = append(slices.Clone(ids), keep.ID)
	}
	// Servers heartbeat on; one session does, the other goes quiet for 16s.
	var free map[string][]uint64
	for d := 500 * time.Millisecond; d <= 16*time.Second; d += 500 * time.Millisecond {
		free = map[string][]uint64{}
		for _, s := range srv {
			free[s.id] = s.heartbeat(t, c, at(d)).Free
		}
		if _, err := c.SessionHeartbeat(at(d), kept); err != nil {
			t.Fatal(err)
		}
		if d < 15*time.Second {
			for id, f := range free {
				if len(f) != 0 {
					t.Fatalf("at %v %s is told to free %v before the session expired", d, id, f)
				}
			}
		}
	}
	for _, s := range srv {
		if !slices.Equal(free[s.id], ids) {
			t.Errorf("%s told to free %v, want the expired session's %v", s.id, free[s.id], ids)
		}
	}
	if _, err := c.SessionHeartbeat(at(16*time.Second), sid); !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "expired after 15s") {
		t.Errorf("heartbeat of an expired session: %v, want ErrNotFound saying it expired", err)
	}
	if st := c.Status(at(16 * time.Second)); st.Totals.Sessions != 1 || st.Totals.Slabs != 1 {
		t.Errorf("status totals %+v: want the kept session and its slab", st.Totals)
	}
}

func TestCtrlFreeAndCloseReleaseSlabs(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(1, 1000)
	srv[0].heartbeat(t, c, t0)
	sid := openSession(t, c, t0)
	a, b := alloc(t, c, t0, sid, 1), alloc(t, c, t0, sid, 1)
	srv[0].slabs = []uint64{a.ID, b.ID, 999} // 999: a slab the ctrl never placed
	if free := srv[0].heartbeat(t, c, t0).Free; !slices.Equal(free, []uint64{999}) {
		t.Errorf("free %v, want only the unknown slab 999", free)
	}
	if err := c.FreeSlab(t0, sid, a.ID); err != nil {
		t.Fatal(err)
	}
	if free := srv[0].heartbeat(t, c, t0).Free; !slices.Equal(free, []uint64{a.ID, 999}) {
		t.Errorf("after FreeSlab: free %v, want [%d 999]", free, a.ID)
	}
	if err := c.FreeSlab(t0, sid, a.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("freeing twice: %v, want ErrNotFound", err)
	}
	if err := c.CloseSession(t0, sid); err != nil {
		t.Fatal(err)
	}
	if free := srv[0].heartbeat(t, c, t0).Free; !slices.Equal(free, []uint64{a.ID, b.ID, 999}) {
		t.Errorf("after CloseSession: free %v", free)
	}
	if _, _, err := c.Slabs(t0, sid); !errors.Is(err, ErrNotFound) {
		t.Errorf("a closed session: %v, want ErrNotFound", err)
	}
}

// Same inputs, same decisions: two clusters with the same seed end in the same state.
func TestCtrlDeterministic(t *testing.T) {
	run := func() string {
		c := newTestCluster(99, 16)
		srv := servers(5, 10_000)
		for i, s := range srv {
			s.used = uint64(i * 1000)
			s.heartbeat(t, c, t0)
		}
		sid := openSession(t, c, t0)
		for range 40 {
			alloc(t, c, t0, sid, 2)
		}
		killOne(t, c, srv, "srv-c", sid, 0)
		b, _ := json.Marshal(c.State())
		return string(b)
	}
	if a, b := run(), run(); a != b {
		t.Errorf("two runs with the same seed and inputs differ:\n%s\n%s", a, b)
	}
}

// State round trip and the grace period after a restore.
func TestCtrlRestoreGivesGracePeriod(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(3, 1000)
	for _, s := range srv {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	for range 4 {
		alloc(t, c, t0, sid, 2)
	}
	killOne(t, c, srv, "srv-a", sid, 0)
	before := c.State()

	restart := at(time.Hour) // long after every heartbeat: only the grace period keeps them alive
	r := newTestCluster(2, 16)
	if err := r.Restore(restart, before); err != nil {
		t.Fatal(err)
	}
	after := r.State()
	bj, _ := json.Marshal(before)
	aj, _ := json.Marshal(after)
	if string(bj) != string(aj) {
		t.Errorf("state changed across Restore:\n%s\n%s", bj, aj)
	}
	if _, err := r.SessionHeartbeat(restart, sid); err != nil {
		t.Errorf("session not restored: %v", err)
	}
	r.Tick(restart.Add(DefaultDeadAfter))
	if st := r.Status(restart.Add(DefaultDeadAfter)); st.Totals.HealthyServers != 2 {
		t.Errorf("%d healthy servers at the end of the grace period, want 2 (srv-a was dead before)", st.Totals.HealthyServers)
	}
	r.SessionHeartbeat(restart.Add(time.Second), sid)
	if _, err := r.ServerHeartbeat(restart.Add(time.Second), ServerReport{ID: srv[1].id, Addr: srv[1].addr, CapacityPages: 1000}); err != nil {
		t.Fatal(err)
	}
	r.Tick(restart.Add(DefaultDeadAfter + time.Millisecond))
	st := r.Status(restart.Add(DefaultDeadAfter + time.Millisecond))
	for _, s := range st.Servers {
		if s.Healthy != (s.ID == "srv-b") {
			t.Errorf("%s healthy=%v after the grace period; only srv-b heartbeated", s.ID, s.Healthy)
		}
	}
	// Slab ids are never reused after a restore.
	if sl := alloc(t, r, restart.Add(DefaultDeadAfter+time.Millisecond), sid, 1); sl.ID <= 4 {
		t.Errorf("slab id %d reused after restore", sl.ID)
	}
}

// A cluster that reloads a state another writer saved keeps the heartbeat times it saw of the
// servers and sessions it knew: it has been hearing them all along. Those it did not know get
// the grace period.
func TestCtrlRestoreKeepsKnownHeartbeats(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(2, 1000)
	srv[0].heartbeat(t, c, t0)
	sid := openSession(t, c, t0)
	other := newTestCluster(2, 16)
	if err := other.Restore(t0, c.State()); err != nil {
		t.Fatal(err)
	}
	srv[1].heartbeat(t, other, at(time.Second)) // joins through the other writer
	reload := at(1500 * time.Millisecond)
	if err := c.Restore(reload, other.State()); err != nil {
		t.Fatal(err)
	}
	st := c.Status(reload)
	for _, s := range st.Servers {
		want := map[string]int64{"srv-a": 1500, "srv-b": 0}[s.ID]
		if s.MsSinceHeartbeat != want || !s.Healthy {
			t.Errorf("%s: %d ms since its heartbeat after the reload, want %d", s.ID, s.MsSinceHeartbeat, want)
		}
	}
	if st.Sessions[0].ID != sid || st.Sessions[0].MsSinceHeartbeat != 1500 {
		t.Errorf("the session's heartbeat after the reload: %+v", st.Sessions[0])
	}
	// srv-a, silent since t0, dies dead-after past t0 — not past the reload.
	c.Tick(at(DefaultDeadAfter + time.Millisecond))
	if st := c.Status(at(DefaultDeadAfter + time.Millisecond)); st.Totals.HealthyServers != 1 {
		t.Errorf("%d healthy servers dead-after past srv-a's last heartbeat, want 1", st.Totals.HealthyServers)
	}
}

func TestCtrlFormatBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0B", 4096: "4KiB", 64 << 20: "64MiB", 3 << 29: "1.5GiB",
		8<<30 - 8<<20: "7.99GiB", 4<<30 - 4<<20: "3.996GiB", 1 << 40: "1TiB"} {
		if got := FormatBytes(n); got != want {
			t.Errorf("FormatBytes(%d) = %s, want %s", n, got, want)
		}
	}
}
