package ctrl_test

// The HTTP edge, the client and the file store, over real loopback HTTP. Time is a clock the
// test moves by hand: nothing here waits for a timer.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
)

var token = fabric.Token("0123456789abcdef0123456789abcdef")

// clock is the service's time, moved by the test.
type clock struct {
	mu sync.Mutex
	t  time.Time // guarded by mu
}

func (c *clock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.t = t }
func (c *clock) add(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
	return c.t
}

type testCtrl struct {
	svc   *ctrl.Service
	store *ctrl.FileStore
	http  *httptest.Server
	cl    *ctrl.Client
	clock *clock
	log   *syncBuf
}

// syncBuf collects the service's log lines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

func (s *syncBuf) printf(f string, a ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(&s.b, f, a...)
}
func (s *syncBuf) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// startCtrl runs a ctrl service on loopback with its state in dir.
func startCtrl(t *testing.T, dir string, clk *clock) *testCtrl {
	t.Helper()
	store, err := ctrl.OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	logBuf := &syncBuf{}
	svc, err := ctrl.NewService(ctrl.ServiceConfig{
		Config: ctrl.Config{Token: token, SlabPages: 256},
		Store:  store,
		Now:    clk.now,
		Logf:   func(f string, a ...any) { logBuf.printf(f+"\n", a...) },
	})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(svc.Handler())
	tc := &testCtrl{svc: svc, store: store, http: hs, clock: clk, log: logBuf,
		cl: ctrl.NewClient(strings.TrimPrefix(hs.URL, "http://"), token, nil)}
	t.Cleanup(tc.stop)
	return tc
}

func (tc *testCtrl) stop() {
	if tc.http != nil {
		tc.http.Close()
		tc.store.Close()
		tc.http = nil
	}
}

func report(id string, port int, slabs ...uint64) ctrl.ServerReport {
	return ctrl.ServerReport{ID: id, Addr: "127.0.0.1:" + strconv.Itoa(port), CapacityPages: 100_000, Slabs: slabs}
}

func TestCtrlHTTPFlow(t *testing.T) {
	ctx := context.Background()
	tc := startCtrl(t, t.TempDir(), &clock{t: time.Now()})
	cl := tc.cl
	if _, err := cl.OpenSession(ctx, "h 1 prog"); err != nil {
		t.Fatal(err)
	}
	sess, _ := cl.OpenSession(ctx, "host 42 redis-server")
	if sess.SlabPages != 256 || sess.Interval() != time.Second {
		t.Errorf("session %+v: want 256-page slabs, 1s heartbeats", sess)
	}
	// No servers yet: 503 naming what there is.
	_, err := cl.AllocSlab(ctx, sess.ID, 2)
	if !errors.Is(err, ctrl.ErrNoRoom) || !strings.Contains(err.Error(), "no memory server is live") {
		t.Errorf("alloc with no servers: %v", err)
	}
	for i, id := range []string{"a", "b", "c"} {
		r, err := cl.ServerHeartbeat(ctx, report(id, 7070+i))
		if err != nil || r.Interval() != 500*time.Millisecond || r.Free == nil || len(r.Free) != 0 {
			t.Fatalf("heartbeat: %+v %v", r, err)
		}
	}
	sl, err := cl.AllocSlab(ctx, sess.ID, 2)
	if err != nil || len(sl.Replicas) != 2 || sl.Pages != 256 {
		t.Fatalf("alloc: %+v %v", sl, err)
	}
	for _, r := range sl.Replicas {
		if g := r.Grant; !token.Valid(&g) || g.Session != sess.ID || g.Server != r.Server {
			t.Errorf("grant %+v did not survive the wire", g)
		}
	}
	if _, err := cl.AllocSlab(ctx, sess.ID, 4); !errors.Is(err, ctrl.ErrNoRoom) || !strings.Contains(err.Error(), "only 3 memory servers are live") {
		t.Errorf("4 replicas on 3 servers: %v", err)
	}
	gen, slabs, err := cl.Slabs(ctx, sess.ID)
	if err != nil || gen == 0 || len(slabs) != 1 || slabs[0].ID != sl.ID || slabs[0].LostServers == nil {
		t.Errorf("slabs: gen %d %+v %v", gen, slabs, err)
	}
	if g, err := cl.SessionHeartbeat(ctx, sess.ID); err != nil || g != gen {
		t.Errorf("session heartbeat: %d %v, want %d", g, err, gen)
	}
	st, err := cl.Status(ctx)
	if err != nil || st.Totals.Servers != 3 || st.Totals.Sessions != 2 || st.Totals.Slabs != 1 {
		t.Errorf("status: %+v %v", st.Totals, err)
	}
	if err := cl.ReplicaReady(ctx, sess.ID, sl.ID, sl.Replicas[0].Server); err != nil {
		t.Errorf("ReplicaReady of a ready replica: %v", err)
	}
	// A bad copy: replaced on the third server, and the generation moves; said twice, the same.
	for _, bad := range [][]ctrl.BadReplica{nil, {{Slab: sl.ID}}, {{Server: "a"}}} {
		if _, err := cl.ReplicasBad(ctx, sess.ID, bad); !errors.Is(err, ctrl.ErrBadRequest) || !strings.Contains(err.Error(), "replica-bad report") {
			t.Errorf("a replica-bad report of %+v: %v, want a bad request", bad, err)
		}
	}
	for range 2 {
		if kept, err := cl.ReplicasBad(ctx, sess.ID, []ctrl.BadReplica{{Slab: sl.ID, Server: sl.Replicas[0].Server}}); err != nil || len(kept) != 0 {
			t.Fatalf("replica bad: kept %v, %v", kept, err)
		}
	}
	if g, slabs, err := cl.Slabs(ctx, sess.ID); err != nil || g == gen || len(slabs[0].Replicas) != 2 || slabs[0].Replicas[1].State != ctrl.Rebuilding ||
		slabs[0].Replicas[0].Server != sl.Replicas[1].Server || slabs[0].Replicas[1].Server == sl.Replicas[0].Server {
		t.Errorf("after a replica-bad report: gen %d (was %d) %+v %v", g, gen, slabs, err)
	}
	last := ctrl.BadReplica{Slab: sl.ID, Server: sl.Replicas[1].Server}
	if kept, err := cl.ReplicasBad(ctx, sess.ID, []ctrl.BadReplica{last}); err != nil || len(kept) != 1 || kept[0] != last {
		t.Errorf("reporting the last ready copy bad: kept %v, %v; want it kept", kept, err)
	}
	if err := cl.FreeSlab(ctx, sess.ID, sl.ID); err != nil {
		t.Fatal(err)
	}
	r, _ := cl.ServerHeartbeat(ctx, report(sl.Replicas[0].Server, 0, sl.ID))
	if !slices.Equal(r.Free, []uint64{sl.ID}) {
		t.Errorf("freed slab not in the server's free list: %v", r.Free)
	}
	if err := cl.CloseSession(ctx, sess.ID); err != nil {
		t.Fatal(err)
	}
	_, err = cl.SessionHeartbeat(ctx, sess.ID)
	if !errors.Is(err, ctrl.ErrNotFound) || !strings.Contains(err.Error(), "session "+sess.ID.String()+" is not open") {
		t.Errorf("heartbeat of a closed session: %v", err)
	}
	if err := cl.FreeSlab(ctx, fabric.NewSessionID(), 1); !errors.Is(err, ctrl.ErrNotFound) {
		t.Errorf("unknown session: %v", err)
	}

	// A server the ctrl declared dead: 410.
	tc.clock.add(3 * time.Second)
	tc.svc.Tick()
	_, err = cl.ServerHeartbeat(ctx, report("a", 7070))
	if !errors.Is(err, ctrl.ErrGone) || !strings.Contains(err.Error(), "declared dead") {
		t.Errorf("heartbeat of a dead server: %v, want ErrGone", err)
	}
	// Errors are JSON with a status code, even for paths the API does not have.
	resp := rawRequest(t, tc, "GET", "/v1/nothing", nil, token)
	if resp.code != 404 || !strings.Contains(resp.err, "no GET /v1/nothing") {
		t.Errorf("unknown path: %d %q", resp.code, resp.err)
	}
	if resp := rawRequest(t, tc, "POST", "/v1/servers/heartbeat", []byte("{not json"), token); resp.code != 400 || !strings.Contains(resp.err, "not the expected JSON") {
		t.Errorf("bad JSON: %d %q", resp.code, resp.err)
	}
	if resp := rawRequest(t, tc, "GET", "/v1/sessions/xyz/slabs", nil, token); resp.code != 400 || !strings.Contains(resp.err, "not a session id") {
		t.Errorf("bad session id: %d %q", resp.code, resp.err)
	}
}

type rawResp struct {
	code int
	err  string
	body []byte
}

// rawRequest sends a request as any HTTP client would, with the token as the documented bearer
// credential, not through the package's client.
func rawRequest(t *testing.T, tc *testCtrl, method, path string, body []byte, tok fabric.Token) rawResp {
	t.Helper()
	req, _ := http.NewRequest(method, tc.http.URL+path, bytes.NewReader(body))
	if tok != nil {
		req.Header.Set("Authorization", "Bearer "+string(tok))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var eb struct {
		Error string `json:"error"`
	}
	if resp.StatusCode != 200 {
		if err := json.Unmarshal(b, &eb); err != nil {
			t.Errorf("%s %s: %d with a body that is not JSON: %q", method, path, resp.StatusCode, b)
		}
	}
	return rawResp{code: resp.StatusCode, err: eb.Error, body: b}
}

func TestCtrlHTTPAuth(t *testing.T) {
	ctx := context.Background()
	tc := startCtrl(t, t.TempDir(), &clock{t: time.Now()})
	const msg = "wrong or missing cluster token: check --token-file matches the ctrl's"

	// The documented recipe works; the scheme's case does not matter (RFC 7235).
	if r := rawRequest(t, tc, "GET", "/v1/status", nil, token); r.code != 200 {
		t.Fatalf("a request bearing the token: %d %q", r.code, r.err)
	}
	// Missing header, wrong token: 401 with the message.
	for name, tok := range map[string]fabric.Token{"missing": nil, "wrong": fabric.Token("another-token-of-32-bytes-length")} {
		r := rawRequest(t, tc, "GET", "/v1/status", nil, tok)
		if r.code != 401 || !strings.Contains(r.err, msg) {
			t.Errorf("%s token: %d %q, want 401 saying %q", name, r.code, r.err, msg)
		}
	}
	for header, want := range map[string]string{
		"bearer " + string(token):                "",
		"Basic " + string(token):                 "the Authorization header is not",
		"Bearer":                                 "the Authorization header is not",
		"Bearer " + string(token) + "x":          msg,
		"Bearer " + string(token[:len(token)-1]): msg,
	} {
		req, _ := http.NewRequest("GET", tc.http.URL+"/v1/status", nil)
		req.Header.Set("Authorization", header)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if (want == "") != (resp.StatusCode == 200) || !strings.Contains(string(b), want) {
			t.Errorf("Authorization: %q: %d %s, want %q", header, resp.StatusCode, b, want)
		}
	}
	// An unauthenticated request is refused before its body is read: a large body from anyone
	// costs the ctrl nothing.
	req, _ := http.NewRequest("POST", tc.http.URL+"/v1/servers/heartbeat", bytes.NewReader(bytes.Repeat([]byte("x"), 20<<20)))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		if resp.StatusCode != 401 {
			t.Errorf("an unauthenticated 20 MB body: %d, want 401", resp.StatusCode)
		}
	}

	// The client's error says it, and is ErrUnauthorized.
	bad := ctrl.NewClient(strings.TrimPrefix(tc.http.URL, "http://"), fabric.Token("another-token-of-32-bytes-length"), nil)
	_, err := bad.Status(ctx)
	if !errors.Is(err, ctrl.ErrUnauthorized) || !strings.Contains(err.Error(), msg) {
		t.Errorf("client with the wrong token: %v", err)
	}
	if _, err := bad.ServerHeartbeat(ctx, report("z", 1)); !errors.Is(err, ctrl.ErrUnauthorized) {
		t.Errorf("a server with the wrong token: %v", err)
	}
	if st, _ := tc.cl.Status(ctx); len(st.Servers) != 0 {
		t.Errorf("an unauthenticated heartbeat registered a server: %+v", st.Servers)
	}
}

// The token crosses the wire, so the client sends it in clear only to a loopback address.
func TestCtrlClientRefusesCleartextOffLoopback(t *testing.T) {
	for _, addr := range []string{"10.0.0.1:7000", "http://10.0.0.1:7000", "ctrl.example:7000", "[2001:db8::1]:7000"} {
		_, err := ctrl.NewClient(addr, token, nil).Status(context.Background())
		if !errors.Is(err, ctrl.ErrBadRequest) || !strings.Contains(err.Error(), "refusing to send the cluster token in clear to the ctrl at "+addr) ||
			!strings.Contains(err.Error(), "--ca FILE") {
			t.Errorf("%s without a CA: %v", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:7000", "localhost:7000", "[::1]:7000", "127.0.0.2:1", "https://10.0.0.1:7000"} {
		if err := ctrl.CheckPlaintext(addr); err != nil {
			t.Errorf("%s: %v", addr, err)
		}
	}
	// A token that cannot travel in a header is refused at the start.
	if _, err := ctrl.NewService(ctrl.ServiceConfig{Config: ctrl.Config{Token: fabric.Token("0123456789abcdef 0123456789abcdef")}, Store: nil}); err == nil || !strings.Contains(err.Error(), "printable ASCII") {
		t.Errorf("a token with a space: %v", err)
	}
}

func TestCtrlClientUnreachable(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	_, err = ctrl.NewClient(addr, token, nil).OpenSession(context.Background(), "x")
	if err == nil || !strings.Contains(err.Error(), "cannot reach the farmem ctrl at "+addr+": ") {
		t.Errorf("unreachable ctrl: %v", err)
	}
}

// A ctrl that takes the connection and never answers is not "unreachable": the message says it
// did not answer, so the operator looks at the ctrl (its log says when a save was slow), not the
// network.
func TestCtrlClientNoAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	addr := ln.Addr().String()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err = ctrl.NewClient(addr, token, nil).OpenSession(ctx, "x")
	if err == nil || !strings.Contains(err.Error(), "the farmem ctrl at "+addr+" took ") ||
		!strings.Contains(err.Error(), "and did not answer POST /v1/sessions: ") || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a ctrl that never answers: %v", err)
	}
}

// A restarted ctrl on the same state directory lists the same slabs and grants, and declares a
// server dead only if it does not heartbeat within dead-after of the restart.
func TestCtrlPersistsAcrossRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	clk := &clock{t: time.Now()}
	tc := startCtrl(t, dir, clk)
	for i, id := range []string{"a", "b", "c"} {
		if _, err := tc.cl.ServerHeartbeat(ctx, report(id, 7070+i)); err != nil {
			t.Fatal(err)
		}
	}
	sess, _ := tc.cl.OpenSession(ctx, "host 42 redis-server")
	for range 5 {
		if _, err := tc.cl.AllocSlab(ctx, sess.ID, 2); err != nil {
			t.Fatal(err)
		}
	}
	gen, before, _ := tc.cl.Slabs(ctx, sess.ID)
	if _, err := ctrl.OpenFileStore(dir); err == nil || !strings.Contains(err.Error(), "another farmem ctrl is using") {
		t.Errorf("a second ctrl on the same state directory: %v", err)
	}
	tc.stop()

	// Down for ten minutes: longer than any timeout.
	restart := clk.add(10 * time.Minute)
	tc = startCtrl(t, dir, clk)
	if !strings.Contains(tc.log.String(), "restored 3 servers, 1 sessions, 5 slabs") {
		t.Errorf("restart log: %q", tc.log.String())
	}
	gen2, after, err := tc.cl.Slabs(ctx, sess.ID)
	if err != nil {
		t.Fatal(err)
	}
	bj, _ := json.Marshal(before)
	aj, _ := json.Marshal(after)
	if gen2 != gen || string(aj) != string(bj) {
		t.Errorf("after restart: gen %d (was %d), slabs\n%s\nwere\n%s", gen2, gen, aj, bj)
	}
	st, _ := tc.cl.Status(ctx)
	for _, s := range st.Servers {
		if !s.Healthy {
			t.Errorf("server %s declared dead at the restart, before its grace period", s.ID)
		}
	}
	// a heartbeats within the grace period; b and c do not.
	clk.add(time.Second)
	if _, err := tc.cl.ServerHeartbeat(ctx, report("a", 7070, 1, 2, 3, 4, 5)); err != nil {
		t.Fatal(err)
	}
	tc.cl.SessionHeartbeat(ctx, sess.ID)
	clk.set(restart.Add(ctrl.DefaultDeadAfter))
	tc.svc.Tick()
	st, _ = tc.cl.Status(ctx)
	if st.Totals.HealthyServers != 3 {
		t.Errorf("%d healthy servers exactly dead-after past the restart, want 3", st.Totals.HealthyServers)
	}
	clk.add(time.Millisecond)
	tc.svc.Tick()
	st, _ = tc.cl.Status(ctx)
	for _, s := range st.Servers {
		if s.Healthy != (s.ID == "a") {
			t.Errorf("server %s healthy=%v past the grace period; only a heartbeated", s.ID, s.Healthy)
		}
	}
	if !strings.Contains(tc.log.String(), "is dead") {
		t.Errorf("death not logged: %q", tc.log.String())
	}
	// And what the deaths decided is on disk too.
	tc.stop()
	tc = startCtrl(t, dir, clk)
	st, _ = tc.cl.Status(ctx)
	if st.Totals.HealthyServers != 1 || st.Totals.Lost+st.Totals.Degraded != 5 {
		t.Errorf("after a second restart: %+v", st.Totals)
	}
}

func TestCtrlFileStoreErrors(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	os.WriteFile(file, nil, 0o600)
	if _, err := ctrl.OpenFileStore(filepath.Join(file, "state")); err == nil || !strings.Contains(err.Error(), "cannot create the ctrl state directory") {
		t.Errorf("state dir under a file: %v", err)
	}
	os.WriteFile(filepath.Join(dir, "state.json"), []byte("{garbage"), 0o600)
	s, err := ctrl.OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, _, err := s.Load(context.Background()); err == nil || !strings.Contains(err.Error(), "is corrupt") {
		t.Errorf("corrupt state: %v", err)
	}
}

// A ctrl that cannot write its state says so and hands out no grant it might forget.
func TestCtrlStateWriteFailure(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "state")
	tc := startCtrl(t, dir, &clock{t: time.Now()})
	tc.cl.ServerHeartbeat(ctx, report("a", 7070))
	sess, err := tc.cl.OpenSession(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(dir)
	_, err = tc.cl.AllocSlab(ctx, sess.ID, 1)
	if !errors.Is(err, ctrl.ErrInternal) || !strings.Contains(err.Error(), "cannot write its state") || !strings.Contains(err.Error(), "slab not allocated") {
		t.Errorf("alloc while the state cannot be written: %v", err)
	}
	if st, _ := tc.cl.Status(ctx); st.Totals.Slabs != 0 {
		t.Errorf("the refused slab is still placed: %+v", st.Totals)
	}
	if !strings.Contains(tc.log.String(), "cannot save the ctrl state") {
		t.Errorf("the failure is not logged: %q", tc.log.String())
	}
	os.MkdirAll(dir, 0o700)
	if _, err := tc.cl.AllocSlab(ctx, sess.ID, 1); err != nil {
		t.Errorf("alloc once the state can be written again: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "state.json")); err != nil {
		t.Error(err)
	}
}

// slowStore is a FileStore whose saves take longer than the ctrl lets pass unremarked.
type slowStore struct{ *ctrl.FileStore }

func (s slowStore) Save(ctx context.Context, st ctrl.State, rev ctrl.Revision) (ctrl.Revision, error) {
	time.Sleep(1100 * time.Millisecond)
	return s.FileStore.Save(ctx, st, rev)
}

// A slow save is logged: it is what a client's "did not answer" leads the operator to.
func TestCtrlLogsSlowSave(t *testing.T) {
	fs, err := ctrl.OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	log := &syncBuf{}
	svc, err := ctrl.NewService(ctrl.ServiceConfig{Config: ctrl.Config{Token: token, SlabPages: 256}, Store: slowStore{fs},
		Logf: func(f string, a ...any) { log.printf(f+"\n", a...) }})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(svc.Handler())
	defer hs.Close()
	if _, err := ctrl.NewClient(strings.TrimPrefix(hs.URL, "http://"), token, nil).OpenSession(context.Background(), "x"); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`saving the ctrl state took [1-9][0-9.]*s; requests that change the state wait for it`).MatchString(log.String()) {
		t.Errorf("a 1.1 s save was not logged: %q", log.String())
	}
}

// Given several ctrls of which none is up, the client says so at once, naming them all.
func TestCtrlClientNoneOfSeveralReachable(t *testing.T) {
	a, b := freeAddr(t), freeAddr(t)
	_, err := ctrl.NewClient(a+","+b, token, nil).Status(context.Background())
	if err == nil || !strings.Contains(err.Error(), "cannot reach any of the farmem ctrls "+a+", "+b+": cannot reach the farmem ctrl at ") {
		t.Errorf("two ctrls down: %v", err)
	}
}

// gatedStore is a FileStore whose saves wait while the gate is shut: a store that stalls.
type gatedStore struct {
	*ctrl.FileStore
	mu   sync.Mutex
	gate chan struct{} // guarded by mu; nil: open
}

func (g *gatedStore) shut() { g.mu.Lock(); g.gate = make(chan struct{}); g.mu.Unlock() }
func (g *gatedStore) open() { g.mu.Lock(); close(g.gate); g.gate = nil; g.mu.Unlock() }

func (g *gatedStore) Save(ctx context.Context, st ctrl.State, rev ctrl.Revision) (ctrl.Revision, error) {
	g.mu.Lock()
	gate := g.gate
	g.mu.Unlock()
	if gate != nil {
		<-gate
	}
	return g.FileStore.Save(ctx, st, rev)
}

// A heartbeat that changes nothing itself does not wait on the store, even when the tick it
// runs first decided something (here, another server's death) that is still being saved: a
// stalled store must not make the ctrl miss live servers' heartbeats and declare them dead.
func TestCtrlHeartbeatDoesNotWaitOnStore(t *testing.T) {
	ctx := context.Background()
	fs, err := ctrl.OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer fs.Close()
	store := &gatedStore{FileStore: fs}
	clk := &clock{t: time.Now()}
	svc, err := ctrl.NewService(ctrl.ServiceConfig{Config: ctrl.Config{Token: token, SlabPages: 256}, Store: store, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(svc.Handler())
	defer hs.Close()
	cl := ctrl.NewClient(strings.TrimPrefix(hs.URL, "http://"), token, nil)
	for _, id := range []string{"a", "b"} {
		if _, err := cl.ServerHeartbeat(ctx, report(id, 7070)); err != nil {
			t.Fatal(err)
		}
	}
	clk.add(1500 * time.Millisecond)
	if _, err := cl.ServerHeartbeat(ctx, report("b", 7071)); err != nil {
		t.Fatal(err)
	}
	store.shut()
	clk.add(1500 * time.Millisecond) // a has not heartbeated for longer than dead-after; b has
	done := make(chan error, 1)
	go func() { _, err := cl.ServerHeartbeat(ctx, report("b", 7071)); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("b's heartbeat: %v", err)
		}
	case <-time.After(10 * time.Second): // a hang guard: the store is shut until the test opens it
		t.Errorf("b's heartbeat waited on the stalled store")
	}
	saved := make(chan struct{})
	go func() { svc.Tick(); close(saved) }() // saves a's death, once the store lets it
	store.open()
	<-saved
	st, _ := cl.Status(ctx)
	for _, s := range st.Servers {
		if s.Healthy != (s.ID == "b") {
			t.Errorf("%s healthy=%v, want only b", s.ID, s.Healthy)
		}
	}
	if got, _, _, _ := fs.Load(ctx); len(got.Servers) != 2 || !got.Servers[0].Dead {
		t.Errorf("a's death is not in the store: %+v", got.Servers)
	}
}
