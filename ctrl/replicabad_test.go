package ctrl

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/farmem/farmem/fabric"
)

// A copy reported bad on a live server is dropped and replaced on another server (never the
// reporting one again), the server is told to free it, and the report is idempotent; the last
// ready copy is kept.
func TestCtrlReplicaBadReplaces(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(3, 1000)
	for _, s := range srv {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	sl := alloc(t, c, t0, sid, 2)
	bad, good := sl.Replicas[0], sl.Replicas[1]
	gen, _ := c.SessionHeartbeat(t0, sid)
	c.TakeEvents()

	if err := reportBad(c, t0, sid, sl.ID, bad.Server); err != nil {
		t.Fatal(err)
	}
	gen2, got := slabOf(t, c, t0, sid, sl.ID)
	if gen2 == gen || len(got.Replicas) != 2 || got.Replicas[0].Server != good.Server || got.Replicas[0].State != Ready ||
		got.Replicas[1].Server == bad.Server || got.Replicas[1].State != Rebuilding {
		t.Fatalf("after the report: gen %d (was %d), replicas %+v; want the good copy ready and a rebuilding one on the third server", gen2, gen, got.Replicas)
	}
	checkGrants(t, sid, got)
	third := got.Replicas[1]
	if log := eventLog(c); !strings.Contains(log, "reported bad") || !strings.Contains(log, "replacement replica placed on "+third.Addr) {
		t.Errorf("events do not tell of the report and the replacement:\n%s", log)
	}
	// The bad copy's server is told to free it.
	for _, s := range srv {
		s.slabs = []uint64{sl.ID}
		free := s.heartbeat(t, c, t0).Free
		if want := s.id == bad.Server; want != slices.Contains(free, sl.ID) {
			t.Errorf("server %s told to free %v; the bad copy was on %s", s.id, free, bad.Server)
		}
	}
	// Again: nothing changes.
	if err := reportBad(c, t0, sid, sl.ID, bad.Server); err != nil {
		t.Errorf("a repeated report: %v", err)
	}
	if gen3, again := slabOf(t, c, t0, sid, sl.ID); gen3 != gen2 || !slices.Equal(again.Replicas, got.Replicas) {
		t.Errorf("a repeated report changed the slab: %+v gen %d", again.Replicas, gen3)
	}
	// The replacement is bad too before it is filled: another one, yet never on the first
	// bad server, so with three servers there is no room for it.
	if err := reportBad(c, t0, sid, sl.ID, third.Server); err != nil {
		t.Fatal(err)
	}
	_, got = slabOf(t, c, t0, sid, sl.ID)
	if len(got.Replicas) != 1 || got.Replicas[0].Server != good.Server {
		t.Errorf("after the replacement was reported bad: %+v; want only the good copy (no other server to use)", got.Replicas)
	}
	if st := c.Status(t0); st.Totals.Degraded != 1 {
		t.Errorf("status totals %+v: want the slab degraded", st.Totals)
	}
	// The last ready copy is kept.
	if err := reportBad(c, t0, sid, sl.ID, good.Server); !errors.Is(err, ErrConflict) {
		t.Errorf("reporting the last ready copy: %v, want ErrConflict", err)
	}
	// A new server joins: the replacement goes there; once filled, the slab is whole.
	late := &testServer{id: "srv-z", addr: "10.0.0.9:7070", capacity: 1000}
	late.heartbeat(t, c, t0)
	_, got = slabOf(t, c, t0, sid, sl.ID)
	if len(got.Replicas) != 2 || got.Replicas[1].Server != late.id {
		t.Fatalf("after a server joined: %+v; want a replacement on it", got.Replicas)
	}
	if err := c.ReplicaReady(t0, sid, sl.ID, late.id); err != nil {
		t.Fatal(err)
	}
	if st := c.Status(t0); st.Totals.Degraded != 0 || st.Totals.Rebuilding != 0 {
		t.Errorf("status totals %+v: want whole", st.Totals)
	}
	// Bad input.
	if err := reportBad(c, t0, sid, 999, good.Server); err != nil {
		t.Errorf("a report for a slab the session does not have (freed meanwhile): %v, want nil", err)
	}
	if err := reportBad(c, t0, fabric.NewSessionID(), sl.ID, good.Server); !errors.Is(err, ErrNotFound) {
		t.Errorf("a report for a session that is not open: %v, want ErrNotFound", err)
	}
	if err := reportBad(c, t0, sid, sl.ID, "no-such-server"); err != nil {
		t.Errorf("a report naming a server that holds no copy: %v, want nil (nothing to drop)", err)
	}
}

// The servers to avoid are kept across a restart: a restored ctrl does not place a
// replacement on the server whose copy was reported bad.
func TestCtrlReplicaBadSurvivesRestore(t *testing.T) {
	c := newTestCluster(1, 16)
	srv := servers(3, 1000)
	for _, s := range srv {
		s.heartbeat(t, c, t0)
	}
	sid := openSession(t, c, t0)
	sl := alloc(t, c, t0, sid, 2)
	bad := sl.Replicas[0].Server
	if err := reportBad(c, t0, sid, sl.ID, bad); err != nil {
		t.Fatal(err)
	}
	_, got := slabOf(t, c, t0, sid, sl.ID)
	c2 := newTestCluster(2, 16)
	if err := c2.Restore(t0, c.State()); err != nil {
		t.Fatal(err)
	}
	if avoid := c2.State().Sessions[0].Slabs[0].Avoid; !slices.Equal(avoid, []string{bad}) {
		t.Fatalf("restored avoid list %v, want [%s]", avoid, bad)
	}
	if err := reportBad(c2, t0, sid, sl.ID, got.Replicas[1].Server); err != nil {
		t.Fatal(err)
	}
	if _, again := slabOf(t, c2, t0, sid, sl.ID); len(again.Replicas) != 1 {
		t.Errorf("the restored ctrl placed a replacement %+v; the only other server's copy was reported bad", again.Replicas)
	}
}

// reportBad reports one copy bad; a copy the ctrl keeps is ErrConflict.
func reportBad(c *Cluster, now time.Time, id fabric.SessionID, slab uint64, server string) error {
	kept, err := c.ReplicasBad(now, id, []BadReplica{{Slab: slab, Server: server}})
	if err == nil && len(kept) > 0 {
		return ErrConflict
	}
	return err
}

func eventLog(c *Cluster) string {
	var msgs []string
	for _, e := range c.TakeEvents() {
		msgs = append(msgs, e.Msg)
	}
	return strings.Join(msgs, "\n")
}
