package ctrl_test

// One conformance suite for every Store: the file store, and the etcd store against real etcd
// servers (one member, and three with the two writers on different members).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/ctrl/etcdtest"
	"github.com/farmem/farmem/fabric"
)

// storeKind opens two handles on one fresh backing store: two writers, as two ctrls would be.
type storeKind struct {
	name string
	open func(t *testing.T) (a, b ctrl.Store)
}

func storeKinds(t *testing.T) []storeKind {
	one := etcdtest.Start(t, 1, "")
	three := etcdtest.Start(t, 3, "")
	n := 0
	etcdOpen := func(a, b []string) func(t *testing.T) (ctrl.Store, ctrl.Store) {
		return func(t *testing.T) (ctrl.Store, ctrl.Store) {
			n++
			prefix := fmt.Sprintf("/farmem-test/%d/", n)
			sa := openEtcd(t, ctrl.EtcdConfig{Endpoints: a, Prefix: prefix})
			sb := openEtcd(t, ctrl.EtcdConfig{Endpoints: b, Prefix: prefix})
			return sa, sb
		}
	}
	return []storeKind{
		{"file", func(t *testing.T) (ctrl.Store, ctrl.Store) {
			fs, err := ctrl.OpenFileStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { fs.Close() })
			return fs, fs
		}},
		{"etcd", etcdOpen(one.Endpoints(), one.Endpoints())},
		{"etcd-3-members", etcdOpen(three.Endpoints()[:1], three.Endpoints()[1:2])},
	}
}

func openEtcd(t *testing.T, cfg ctrl.EtcdConfig) *ctrl.EtcdStore {
	t.Helper()
	s, err := ctrl.OpenEtcdStore(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// richState has what a State can hold: live and dead servers, sessions with slabs of several
// replicas in both states, a lost slab, dead servers a slab was on.
func richState() ctrl.State {
	s1, s2 := fabric.NewSessionID(), fabric.NewSessionID()
	g := func(slab uint64, sess fabric.SessionID, srv string) fabric.Grant {
		gr := fabric.Grant{Slab: slab, Session: sess, Server: srv, Pages: 256}
		token.Sign(&gr)
		return gr
	}
	st := ctrl.State{Version: ctrl.StateVersion, NextSlab: 9,
		Servers: []ctrl.ServerState{
			{ID: "aa01", Addr: "10.0.0.1:7070", CapacityPages: 100000, UsedPages: 512, Reported: []uint64{3, 4}},
			{ID: "bb02", Addr: "10.0.0.2:7070", CapacityPages: 100000, UsedPages: 256, Reported: []uint64{3}},
			{ID: "cc03", Addr: "10.0.0.3:7070", CapacityPages: 50000, Reported: []uint64{}, Dead: true, DeadAt: time.Unix(1_700_000_000, 5).UTC()},
			{ID: "dd/04", Addr: "[::1]:7070", CapacityPages: 1, Reported: []uint64{}},
		},
		Sessions: []ctrl.SessionState{
			{ID: s1, Name: "host 1 redis-server", Generation: 4, Slabs: []ctrl.SlabState{
				{Slab: ctrl.Slab{ID: 3, Pages: 256, LostServers: []string{}, Replicas: []ctrl.Replica{
					{Server: "aa01", Addr: "10.0.0.1:7070", State: ctrl.Ready, Grant: g(3, s1, "aa01")},
					{Server: "bb02", Addr: "10.0.0.2:7070", State: ctrl.Rebuilding, Grant: g(3, s1, "bb02")},
				}}, Want: 2, DownFrom: []string{"10.0.0.3:7070"}},
				{Slab: ctrl.Slab{ID: 5, Pages: 256, Lost: true, LostServers: []string{"10.0.0.3:7070"}, Replicas: []ctrl.Replica{}}, Want: 1, DownFrom: []string{}},
			}},
			{ID: s2, Name: "", Generation: 1, Slabs: []ctrl.SlabState{}},
		},
	}
	slices.SortFunc(st.Sessions, func(a, b ctrl.SessionState) int { return strings.Compare(string(a.ID[:]), string(b.ID[:])) })
	return st
}

func jsonOf(v any) string { b, _ := json.Marshal(v); return string(b) }

func TestStoreConformance(t *testing.T) {
	ctx := context.Background()
	for _, k := range storeKinds(t) {
		t.Run(k.name, func(t *testing.T) {
			a, b := k.open(t)
			if _, rev, ok, err := a.Load(ctx); err != nil || ok || rev != 0 {
				t.Fatalf("an empty store: ok %v rev %d %v", ok, rev, err)
			}
			st := richState()
			r1, err := a.Save(ctx, st, 0)
			if err != nil || r1 <= 0 {
				t.Fatalf("first save: rev %d %v", r1, err)
			}
			got, rev, ok, err := b.Load(ctx)
			if err != nil || !ok || rev != r1 || jsonOf(got) != jsonOf(st) {
				t.Fatalf("loaded by the other writer: ok %v rev %d (saved %d) %v\n%s\nsaved\n%s", ok, rev, r1, err, jsonOf(got), jsonOf(st))
			}
			// A first save over a store that has a state: stale, and nothing written.
			if _, err := b.Save(ctx, ctrl.State{Version: ctrl.StateVersion}, 0); !errors.Is(err, ctrl.ErrStale) {
				t.Errorf("saving as if the store were empty: %v, want ErrStale", err)
			}
			// a moves on: a server and a session go, a slab is added, next_slab moves.
			st2 := richState()
			st2.Sessions = st.Sessions[:1]
			st2.Sessions[0].Slabs = append(slices.Clone(st.Sessions[0].Slabs), ctrl.SlabState{Slab: ctrl.Slab{ID: 9, Pages: 256, Replicas: []ctrl.Replica{}, LostServers: []string{}}, Want: 1, DownFrom: []string{}})
			st2.Sessions[0].Generation = 5
			st2.Servers = st.Servers[:2]
			st2.NextSlab = 10
			r2, err := a.Save(ctx, st2, r1)
			if err != nil || r2 <= r1 {
				t.Fatalf("second save: rev %d (after %d) %v", r2, r1, err)
			}
			// b decided on r1: its save is refused and changes nothing.
			st3 := richState()
			st3.NextSlab = 99
			if _, err := b.Save(ctx, st3, r1); !errors.Is(err, ctrl.ErrStale) {
				t.Errorf("a save over a stale revision: %v, want ErrStale", err)
			}
			got, rev, _, err = b.Load(ctx)
			if err != nil || rev != r2 || jsonOf(got) != jsonOf(st2) {
				t.Fatalf("after the refused save: rev %d (want %d) %v\n%s\nwant\n%s", rev, r2, err, jsonOf(got), jsonOf(st2))
			}
			// Decided again on the fresh state, b's save goes through, and a's old revision is stale.
			r3, err := b.Save(ctx, st3, r2)
			if err != nil || r3 <= r2 {
				t.Fatalf("a save on the fresh revision: %d %v", r3, err)
			}
			if _, err := a.Save(ctx, st2, r2); !errors.Is(err, ctrl.ErrStale) {
				t.Errorf("a's save over the revision b replaced: %v", err)
			}
			if got, rev, _, _ := a.Load(ctx); rev != r3 || jsonOf(got) != jsonOf(st3) {
				t.Errorf("a loads rev %d, want %d with b's state", rev, r3)
			}
			// Saving the same state again still moves the revision: every save is a change.
			if r4, err := a.Save(ctx, st3, r3); err != nil || r4 <= r3 {
				t.Errorf("saving an unchanged state: %d %v", r4, err)
			}
		})
	}
}

// Two ctrls' state machines on one store: each decision one of them saves was made on the
// state the other saved last, or is decided again on it. Slab ids are never handed out twice
// and no slab a client was told of goes missing.
func TestStoreConcurrentWriters(t *testing.T) {
	ctx := context.Background()
	for _, k := range storeKinds(t) {
		t.Run(k.name, func(t *testing.T) {
			sa, sb := k.open(t)
			clk := &clock{t: time.Now()}
			a := serviceOn(t, sa, clk)
			for i, id := range []string{"a", "b", "c", "d"} {
				if _, err := a.cl.ServerHeartbeat(ctx, report(id, 7070+i)); err != nil {
					t.Fatal(err)
				}
			}
			sess, err := a.cl.OpenSession(ctx, "host 42 redis-server")
			if err != nil {
				t.Fatal(err)
			}
			b := serviceOn(t, sb, clk)

			// In turn: b decided nothing since it loaded, a saves, b's allocation loses the race,
			// reloads and is placed on fresh state.
			first, err := a.cl.AllocSlab(ctx, sess.ID, 2)
			if err != nil {
				t.Fatal(err)
			}
			second, err := b.cl.AllocSlab(ctx, sess.ID, 2)
			if err != nil {
				t.Fatal(err)
			}
			if second.ID != first.ID+1 {
				t.Errorf("b placed slab %d after a placed %d: it did not decide on a's state", second.ID, first.ID)
			}
			if !strings.Contains(b.log.String(), "changed by another writer: reloaded it") {
				t.Errorf("b's conflict is not logged: %q", b.log.String())
			}

			// At once, from both.
			var mu sync.Mutex
			ids := []uint64{first.ID, second.ID}
			var wg sync.WaitGroup
			for _, w := range []*svcClient{a, b} {
				wg.Go(func() {
					for range 10 {
						sl, err := w.cl.AllocSlab(ctx, sess.ID, 2)
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						ids = append(ids, sl.ID)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			slices.Sort(ids)
			if len(slices.Compact(slices.Clone(ids))) != len(ids) {
				t.Fatalf("a slab id was handed out twice: %v", ids)
			}
			st, _, _, err := sa.Load(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var stored []uint64
			for _, s := range st.Sessions[0].Slabs {
				stored = append(stored, s.ID)
				if len(s.Replicas) != 2 || s.Replicas[0].Server == s.Replicas[1].Server {
					t.Errorf("slab %d is stored with replicas %+v", s.ID, s.Replicas)
				}
			}
			if !slices.Equal(stored, ids) {
				t.Errorf("the store holds slabs %v; the clients were given %v", stored, ids)
			}
		})
	}
}

type svcClient struct {
	svc *ctrl.Service
	cl  *ctrl.Client
	log *syncBuf
}

func serviceOn(t *testing.T, store ctrl.Store, clk *clock) *svcClient {
	t.Helper()
	log := &syncBuf{}
	svc, err := ctrl.NewService(ctrl.ServiceConfig{Config: ctrl.Config{Token: token, SlabPages: 256}, Store: store, Now: clk.now,
		Logf: func(f string, a ...any) { log.printf(f+"\n", a...) }})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(svc.Handler())
	t.Cleanup(hs.Close)
	return &svcClient{svc: svc, cl: ctrl.NewClient(strings.TrimPrefix(hs.URL, "http://"), token, nil), log: log}
}

func TestEtcdStoreErrors(t *testing.T) {
	ctx := context.Background()
	cl := etcdtest.Start(t, 1, "", "--max-txn-ops", "8")
	for _, c := range []struct {
		endpoints []string
		want      string
	}{
		{nil, "no etcd endpoints given: pass --etcd URL[,URL...]"},
		{[]string{cl.Endpoints()[0], ""}, "has an empty endpoint"},
		{[]string{"ftp://127.0.0.1:2379"}, `etcd endpoint "ftp://127.0.0.1:2379" is not an http(s)://HOST:PORT URL`},
	} {
		if _, err := ctrl.OpenEtcdStore(ctx, ctrl.EtcdConfig{Endpoints: c.endpoints}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.endpoints, err, c.want)
		}
	}
	// Nothing listens there: said at open, not at the first save.
	ln := freeAddr(t)
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := ctrl.OpenEtcdStore(sctx, ctrl.EtcdConfig{Endpoints: []string{"http://" + ln}}); err == nil || !strings.Contains(err.Error(), "cannot reach etcd at http://"+ln) {
		t.Errorf("etcd not running: %v", err)
	}

	// A change touching more keys than etcd takes in one transaction: the error names the flags.
	s := openEtcd(t, ctrl.EtcdConfig{Endpoints: cl.Endpoints(), MaxTxnOps: 8})
	st := ctrl.State{Version: ctrl.StateVersion, NextSlab: 1}
	for range 10 {
		st.Sessions = append(st.Sessions, ctrl.SessionState{ID: fabric.NewSessionID(), Generation: 1, Slabs: []ctrl.SlabState{}})
	}
	if _, err := s.Save(ctx, st, 0); err == nil || !strings.Contains(err.Error(), "writes 11 etcd keys in one transaction, over etcd's limit of 8: start etcd with --max-txn-ops 22 or more, and give the ctrl the same --etcd-max-txn-ops") {
		t.Errorf("11 keys at --max-txn-ops 8: %v", err)
	}
	// What etcd itself refuses is reported too, not taken for a conflict.
	big := openEtcd(t, ctrl.EtcdConfig{Endpoints: cl.Endpoints(), MaxTxnOps: 100})
	if _, err := big.Save(ctx, st, 0); err == nil || errors.Is(err, ctrl.ErrStale) || !strings.Contains(err.Error(), "too many operations in txn request") {
		t.Errorf("11 keys on an etcd that takes 8: %v", err)
	}

	// A change larger than etcd takes in one request: the error names the flag.
	small := etcdtest.Start(t, 1, "", "--max-request-bytes", "4096")
	st = ctrl.State{Version: ctrl.StateVersion, NextSlab: 1, Sessions: []ctrl.SessionState{{ID: fabric.NewSessionID(), Generation: 1}}}
	for i := range 100 {
		st.Sessions[0].Slabs = append(st.Sessions[0].Slabs, ctrl.SlabState{Slab: ctrl.Slab{ID: uint64(i + 1), Pages: 256, Replicas: []ctrl.Replica{}}, Want: 1})
	}
	if _, err := openEtcd(t, ctrl.EtcdConfig{Endpoints: small.Endpoints()}).Save(ctx, st, 0); err == nil || !strings.Contains(err.Error(), "start etcd with a larger --max-request-bytes") {
		t.Errorf("a session over etcd's request size: %v", err)
	}

	// A key the ctrl does not know under its prefix, and a prefix without meta.
	raw := openEtcd(t, ctrl.EtcdConfig{Endpoints: cl.Endpoints()}).Client()
	raw.Put(ctx, "/other/x", "1")
	raw.Put(ctx, "/other/meta", `{"version":1,"next_slab":1}`)
	if _, _, _, err := openEtcd(t, ctrl.EtcdConfig{Endpoints: cl.Endpoints(), Prefix: "/other"}).Load(ctx); err == nil || !strings.Contains(err.Error(), "a key this ctrl does not know: /other/x") {
		t.Errorf("a foreign key: %v", err)
	}
	raw.Put(ctx, "/nometa/servers/a", "{}")
	if _, _, _, err := openEtcd(t, ctrl.EtcdConfig{Endpoints: cl.Endpoints(), Prefix: "/nometa/"}).Load(ctx); err == nil || !strings.Contains(err.Error(), "has keys but no meta key") {
		t.Errorf("no meta key: %v", err)
	}
	raw.Put(ctx, "/v9/meta", `{"version":9}`)
	if _, _, _, err := openEtcd(t, ctrl.EtcdConfig{Endpoints: cl.Endpoints(), Prefix: "/v9/"}).Load(ctx); err == nil || !strings.Contains(err.Error(), "has version 9; this ctrl reads version 1") {
		t.Errorf("a newer layout: %v", err)
	}
	raw.Put(ctx, "/bad/meta", `{"version":1}`)
	raw.Put(ctx, "/bad/sessions/x", `{garbage`)
	if _, _, _, err := openEtcd(t, ctrl.EtcdConfig{Endpoints: cl.Endpoints(), Prefix: "/bad/"}).Load(ctx); err == nil || !strings.Contains(err.Error(), "in etcd (key /bad/sessions/x) is corrupt") {
		t.Errorf("a corrupt value: %v", err)
	}
}

// A ctrl cut off from etcd places nothing: the allocation fails and no grant leaves the ctrl.
func TestCtrlOnEtcdCutOff(t *testing.T) {
	ctx := context.Background()
	cl := etcdtest.Start(t, 1, "")
	store := openEtcd(t, ctrl.EtcdConfig{Endpoints: cl.Endpoints()})
	c := serviceOn(t, store, &clock{t: time.Now()})
	c.cl.ServerHeartbeat(ctx, report("a", 7070))
	sess, err := c.cl.OpenSession(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	cl.Members[0].Kill()
	_, err = c.cl.AllocSlab(ctx, sess.ID, 1)
	if !errors.Is(err, ctrl.ErrInternal) || !strings.Contains(err.Error(), "slab not allocated") || !strings.Contains(err.Error(), "writing the ctrl state to etcd at "+cl.Endpoints()[0]) {
		t.Errorf("alloc with etcd down: %v", err)
	}
	if st, _ := c.cl.Status(ctx); st.Totals.Slabs != 0 {
		t.Errorf("a slab is placed that etcd never heard of: %+v", st.Totals)
	}
}

func freeAddr(t *testing.T) string {
	t.Helper()
	hs := httptest.NewServer(nil)
	addr := strings.TrimPrefix(hs.URL, "http://")
	hs.Close()
	return addr
}

// The etcd the tests run is the one the client is pinned to: go.mod's client, workloads/etcd's
// server and scripts/test-deps.sh's build all name etcdtest.Version.
func TestEtcdVersionsAgree(t *testing.T) {
	for file, want := range map[string]string{
		"../go.mod":                "go.etcd.io/etcd/client/v3 " + etcdtest.Version + "\n",
		"../workloads/etcd/go.mod": "go.etcd.io/etcd/server/v3 " + etcdtest.Version + "\n",
		"../scripts/test-deps.sh":  "etcd_version=" + etcdtest.Version + " ",
	} {
		b, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), want) {
			t.Errorf("%s does not say %q", file, strings.TrimSpace(want))
		}
	}
}

// etcd over TLS with client certificates, as production etcd runs: the store works with the
// CA and a client certificate, and says what is missing otherwise.
func TestEtcdStoreTLS(t *testing.T) {
	ctx := context.Background()
	pki := t.TempDir()
	ca, key, _, err := ctrl.EnsureCA(pki)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"etcd", "ctrl"} {
		if _, err := ctrl.IssueCert(pki, name, []string{"127.0.0.1"}, ca, key); err != nil {
			t.Fatal(err)
		}
	}
	etcdCert, etcdKey := ctrl.CertFiles(pki, "etcd")
	cl := etcdtest.StartTLS(t, 1, "", etcdtest.TLSFiles{Cert: etcdCert, Key: etcdKey, CA: pki + "/ca.pem"})
	cert, certKey := ctrl.CertFiles(pki, "ctrl")
	tlsCfg, err := ctrl.EtcdTLS(pki+"/ca.pem", cert, certKey)
	if err != nil {
		t.Fatal(err)
	}
	s := openEtcd(t, ctrl.EtcdConfig{Endpoints: cl.Endpoints(), TLS: tlsCfg})
	st := richState()
	rev, err := s.Save(ctx, st, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got, r, _, err := s.Load(ctx); err != nil || r != rev || jsonOf(got) != jsonOf(st) {
		t.Errorf("over TLS: rev %d (saved %d) %v", r, rev, err)
	}

	noCert, _ := ctrl.EtcdTLS(pki+"/ca.pem", "", "")
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := ctrl.OpenEtcdStore(sctx, ctrl.EtcdConfig{Endpoints: cl.Endpoints(), TLS: noCert}); err == nil || !strings.Contains(err.Error(), "cannot reach etcd at "+cl.Endpoints()[0]) {
		t.Errorf("without a client certificate: %v", err)
	}
	if _, err := ctrl.OpenEtcdStore(ctx, ctrl.EtcdConfig{Endpoints: cl.Endpoints()}); err == nil || !strings.Contains(err.Error(), "is https: give --etcd-ca") {
		t.Errorf("https without TLS: %v", err)
	}
	if _, err := ctrl.OpenEtcdStore(ctx, ctrl.EtcdConfig{Endpoints: []string{"http://127.0.0.1:1"}, TLS: tlsCfg}); err == nil || !strings.Contains(err.Error(), "is not https, but TLS for etcd is configured") {
		t.Errorf("http with TLS: %v", err)
	}
	if _, err := ctrl.EtcdTLS(pki+"/ca.pem", cert, ""); err == nil || !strings.Contains(err.Error(), "loading the ctrl's etcd client certificate") {
		t.Errorf("a certificate without its key: %v", err)
	}
}
