package ctrl_test

// Several ctrls on one real etcd: one leads, the others name it, a leader whose lease ends
// stops deciding, and the next one carries on with the same state.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/ctrl/etcdtest"
)

type electedCtrl struct {
	addr  string
	store *ctrl.EtcdStore
	log   *syncBuf
	stop  func() // SIGTERM: save, resign, stop
}

func startElected(t *testing.T, endpoints []string, clk *clock) *electedCtrl {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	store := openEtcd(t, ctrl.EtcdConfig{Endpoints: endpoints})
	log := &syncBuf{}
	svc, err := ctrl.NewService(ctrl.ServiceConfig{Config: ctrl.Config{Token: token, SlabPages: 256}, Store: store, Now: clk.now,
		Logf:     func(f string, a ...any) { log.printf(f+"\n", a...) },
		Election: &ctrl.ElectionConfig{Advertise: ln.Addr().String(), LeaseTTL: 2 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, ln) }()
	ec := &electedCtrl{addr: ln.Addr().String(), store: store, log: log}
	var stopped bool
	ec.stop = func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("ctrl %s stopping: %v", ec.addr, err)
			}
		}
	}
	t.Cleanup(ec.stop)
	return ec
}

var leadingLine = regexp.MustCompile(`(?m)^leading the ctrls`)

// leader waits for one of cs to say it leads; a hang guard, not a timing assertion.
func leader(t *testing.T, cs ...*electedCtrl) *electedCtrl {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		for _, c := range cs {
			if l := c.log.String(); len(leadingLine.FindAllString(l, -1)) > strings.Count(l, "no longer leading") {
				return c
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("no ctrl leads after 30s")
	return nil
}

func TestCtrlElection(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t, 1, "")
	clk := &clock{t: time.Now()}
	cs := []*electedCtrl{startElected(t, etcd.Endpoints(), clk), startElected(t, etcd.Endpoints(), clk), startElected(t, etcd.Endpoints(), clk)}
	list := cs[0].addr + ", " + cs[1].addr + "," + cs[2].addr + "," // as a person might type it
	cl := ctrl.NewClient(list, token, nil)
	for i, id := range []string{"a", "b", "c"} {
		if _, err := cl.ServerHeartbeat(ctx, report(id, 7070+i)); err != nil {
			t.Fatal(err)
		}
	}
	sess, err := cl.OpenSession(ctx, "host 42 redis-server")
	if err != nil {
		t.Fatal(err)
	}
	first, err := cl.AllocSlab(ctx, sess.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	lead := leader(t, cs...)
	if cl.Addr() != lead.addr {
		t.Errorf("the client talks to %s; the leader is %s", cl.Addr(), lead.addr)
	}
	var followers []*electedCtrl
	for _, c := range cs {
		if c != lead {
			followers = append(followers, c)
		}
	}

	// A follower refuses by name (once it has seen the election's result: until then it says
	// no leader is elected yet, and clients try the next ctrl), and a client of the follower
	// alone goes to the leader.
	var eb struct{ Error, Leader string }
	for deadline := time.Now().Add(30 * time.Second); ; {
		req, _ := http.NewRequest("POST", "http://"+followers[0].addr+"/v1/sessions", strings.NewReader(`{"name":"x"}`))
		req.Header.Set("Authorization", "Bearer "+string(token))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if resp.StatusCode != 421 || (eb.Leader == "" && !strings.Contains(eb.Error, "no leader is elected yet")) {
			t.Fatalf("a write to a follower: %d %+v", resp.StatusCode, eb)
		}
		if eb.Leader != "" || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if eb.Leader != lead.addr || !strings.Contains(eb.Error, "is not the leader; the leader is "+lead.addr) {
		t.Errorf("a write to a follower: %+v", eb)
	}
	for _, f := range followers {
		one := ctrl.NewClient(f.addr, token, nil)
		st, err := one.Status(ctx)
		if err != nil || st.Totals.Servers != 3 || st.Totals.Slabs != 1 || one.Addr() != lead.addr || st.Leader != lead.addr {
			t.Errorf("status through follower %s: %+v %v (answered by %s)", f.addr, st.Totals, err, one.Addr())
		}
	}

	// The leader's lease ends under it (revoked, as etcd does when it stops hearing from it):
	// it stops deciding, and the oldest follower leads with the same state.
	revokeLeader(t, lead)
	next := leader(t, followers...)
	awaitLog(t, lead, "no longer leading the ctrls: its etcd lease ended")
	second, err := cl.AllocSlab(ctx, sess.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	if second.ID <= first.ID || cl.Addr() != next.addr {
		t.Errorf("after the handover slab %d (before: %d), from %s (the leader is %s)", second.ID, first.ID, cl.Addr(), next.addr)
	}
	_, slabs, err := cl.Slabs(ctx, sess.ID)
	if err != nil || len(slabs) != 2 || slabs[0].ID != first.ID || len(slabs[0].Replicas) != 2 {
		t.Errorf("the slab map after the handover: %+v %v", slabs, err)
	}
	// The old leader now names the new one.
	if one := ctrl.NewClient(lead.addr, token, nil); func() error { _, err := one.Status(ctx); return err }() != nil || one.Addr() != next.addr {
		t.Errorf("status through the old leader was not answered by the new one (%s)", one.Addr())
	}

	// The new leader stops (SIGTERM): it saves, resigns, and the last one leads at once.
	awaitLog(t, lead, "the leading ctrl is "+next.addr)
	next.stop()
	awaitLog(t, next, "resigned the lead: another ctrl takes over now")
	var last *electedCtrl
	for _, c := range cs {
		if c != next && c != lead {
			last = c
		}
	}
	// The one that has campaigned longest leads: the old leader campaigned again only after
	// its lease ended.
	if l := leader(t, lead, last); l != last {
		t.Errorf("%s leads after %s stopped; %s has waited longer\n%s:\n%s\n%s:\n%s", l.addr, next.addr, last.addr, l.addr, l.log.String(), last.addr, last.log.String())
	}
	third, err := cl.AllocSlab(ctx, sess.ID, 1)
	if err != nil || third.ID <= second.ID {
		t.Fatalf("after the second handover: slab %d %v", third.ID, err)
	}
	st, err := cl.Status(ctx)
	if err != nil || st.Totals.Slabs != 3 || st.Totals.Sessions != 1 || st.Totals.HealthyServers != 3 {
		t.Errorf("status after two handovers: %+v %v", st.Totals, err)
	}
}

// awaitLog waits for c to log want; a hang guard, not a timing assertion.
func awaitLog(t *testing.T, c *electedCtrl, want string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(c.log.String(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("ctrl %s never logged %q:\n%s", c.addr, want, c.log.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// revokeLeader ends the leading ctrl's lease from outside.
func revokeLeader(t *testing.T, c *electedCtrl) {
	t.Helper()
	cli := c.store.Client()
	resp, err := cli.Get(context.Background(), ctrl.DefaultEtcdPrefix+"leader/", clientv3.WithFirstCreate()...)
	if err != nil || len(resp.Kvs) == 0 || string(resp.Kvs[0].Value) != c.addr {
		t.Fatalf("the leader key: %+v %v", resp, err)
	}
	if _, err := cli.Revoke(context.Background(), clientv3.LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
}

// A leader cut off from etcd stops deciding once its lease can no longer be renewed: it
// refuses every request rather than place a slab no other ctrl would know of.
func TestCtrlLeaderCutOffStepsDown(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t, 1, "")
	c := startElected(t, etcd.Endpoints(), &clock{t: time.Now()})
	cl := ctrl.NewClient(c.addr, token, nil)
	if _, err := cl.ServerHeartbeat(ctx, report("a", 7070)); err != nil {
		t.Fatal(err)
	}
	sess, err := cl.OpenSession(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	etcd.Members[0].Kill()
	awaitLog(t, c, "no longer leading the ctrls: its etcd lease ended")
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = cl.AllocSlab(short, sess.ID, 1)
	if !errors.Is(err, ctrl.ErrNotLeader) || !strings.Contains(err.Error(), "is not the leader, and no leader is elected yet") {
		t.Errorf("an allocation from a ctrl cut off from etcd: %v", err)
	}
}

// cutProxy forwards TCP to an address until cut: then it closes every connection and
// refuses new ones, as a partition would.
type cutProxy struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn // guarded by mu
	cut   bool       // guarded by mu
}

func startCutProxy(t *testing.T, to string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln}
	t.Cleanup(p.partition)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			p.mu.Lock()
			if err != nil || p.cut {
				p.mu.Unlock()
				c.Close()
				if s != nil {
					s.Close()
				}
				continue
			}
			p.conns = append(p.conns, c, s)
			p.mu.Unlock()
			go func() { io.Copy(s, c); s.Close() }()
			go func() { io.Copy(c, s); c.Close() }()
		}
	}()
	return p
}

func (p *cutProxy) addr() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) partition() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.ln.Close()
	for _, c := range p.conns {
		c.Close()
	}
}

// The leader is cut off from etcd while clients still reach it: it places nothing from then
// on (its saves cannot land), the other ctrl leads once the lease runs out, and every slab a
// client was given is in etcd once, with no id handed out twice.
func TestCtrlLeaderPartitionedFromEtcd(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t, 1, "")
	proxy := startCutProxy(t, strings.TrimPrefix(etcd.Endpoints()[0], "http://"))
	clk := &clock{t: time.Now()}
	a := startElected(t, []string{proxy.addr()}, clk)
	leader(t, a) // a leads: it campaigned alone
	b := startElected(t, etcd.Endpoints(), clk)
	cl := ctrl.NewClient(a.addr+","+b.addr, token, nil)
	for i, id := range []string{"a", "b", "c"} {
		if _, err := cl.ServerHeartbeat(ctx, report(id, 7070+i)); err != nil {
			t.Fatal(err)
		}
	}
	sess, err := cl.OpenSession(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	first, err := cl.AllocSlab(ctx, sess.ID, 2)
	if err != nil {
		t.Fatal(err)
	}

	proxy.partition()
	short, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = ctrl.NewClient(a.addr, token, nil).AllocSlab(short, sess.ID, 2)
	cancel()
	if err == nil {
		t.Fatalf("the ctrl cut off from etcd placed a slab")
	}
	t.Logf("an allocation from the cut-off leader: %v", err)
	leader(t, b)
	awaitLog(t, a, "no longer leading the ctrls: its etcd lease ended")

	second, err := cl.AllocSlab(ctx, sess.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	if second.ID <= first.ID || cl.Addr() != b.addr {
		t.Errorf("after the partition: slab %d (before %d) from %s, want a new id from %s", second.ID, first.ID, cl.Addr(), b.addr)
	}
	st, _, _, err := b.store.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, s := range st.Sessions[0].Slabs {
		ids = append(ids, s.ID)
	}
	if !slices.Equal(ids, []uint64{first.ID, second.ID}) {
		t.Errorf("etcd holds slabs %v; the clients were given %d and %d", ids, first.ID, second.ID)
	}
}
