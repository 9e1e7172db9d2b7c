package remote

import (
	"bytes"
	"context"
	"math/rand"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
)

var token = fabric.Token("remote-test-token-0123456789")

// stopping counts the ctrls still stopping after their test: their state directories are
// removed once they have, and the tests end only then.
var stopping sync.WaitGroup

func TestMain(m *testing.M) {
	code := m.Run()
	stopping.Wait()
	os.Exit(code)
}

// cluster is a real ctrl and real memory servers on loopback, in this process.
type cluster struct {
	t       *testing.T
	ctrl    string
	servers []*memserver
	// trace, if set when a server is added, is that server's ServerConfig.Trace (given its address).
	trace func(addr string, r *fabric.TracedRequest)
}

type memserver struct {
	srv  *fabric.Server
	addr string
	stop context.CancelFunc
}

func newCluster(t *testing.T, servers int) *cluster {
	t.Helper()
	// Not t.TempDir: the ctrl saves its state as it stops, which may outlast the test by the
	// HTTP server's shutdown (up to 5 s for a connection that sent nothing yet).
	dir, err := os.MkdirTemp("", "farmem-remote-test-ctrl-")
	if err != nil {
		t.Fatal(err)
	}
	st, err := ctrl.OpenFileStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	// Servers are dead after 2 s without a heartbeat (4 missed), as by default: on a loaded
	// machine a live server's heartbeat can be late by a second.
	svc, err := ctrl.NewService(ctrl.ServiceConfig{Config: ctrl.Config{Token: token, SlabPages: 256, DeadAfter: 2 * time.Second}, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { svc.Serve(ctx, ln); close(served) }()
	stopping.Add(1)
	t.Cleanup(func() {
		cancel()
		go func() { <-served; os.RemoveAll(dir); stopping.Done() }()
	})
	c := &cluster{t: t, ctrl: ln.Addr().String()}
	for range servers {
		c.addServer()
	}
	return c
}

func (c *cluster) addServer() *memserver { return c.addServerVia(nil) }

// addServerVia adds a memory server that the ctrl and clients reach at front(its own address),
// or at its own address if front is nil.
func (c *cluster) addServerVia(front func(addr string) string) *memserver {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		c.t.Fatal(err)
	}
	addr := ln.Addr().String()
	if front != nil {
		addr = front(addr)
	}
	cfg := fabric.ServerConfig{Token: token, CapacityPages: 1 << 16, Logf: c.t.Logf}
	if trace := c.trace; trace != nil {
		cfg.Trace = func(r *fabric.TracedRequest) { trace(addr, r) }
	}
	srv := fabric.NewServer(cfg)
	go srv.Serve(ln)
	ctx, cancel := context.WithCancel(context.Background())
	m := &memserver{srv: srv, addr: addr, stop: cancel}
	go ctrl.ServeHeartbeats(ctx, ctrl.NewClient(c.ctrl, token, nil), m.addr, srv, c.t.Logf)
	c.t.Cleanup(m.kill)
	c.servers = append(c.servers, m)
	// Wait until the ctrl lists it, so placement can use it.
	c.waitStatus(func(st ctrl.Status) bool {
		for _, s := range st.Servers {
			if s.Addr == m.addr && s.Healthy {
				return true
			}
		}
		return false
	})
	return m
}

// kill stops the server as a crash would: connections drop, heartbeats stop, memory goes.
func (m *memserver) kill() {
	m.stop()
	m.srv.Close()
}

func (c *cluster) waitStatus(ok func(ctrl.Status) bool) ctrl.Status {
	c.t.Helper()
	cl := ctrl.NewClient(c.ctrl, token, nil)
	deadline := time.Now().Add(20 * time.Second)
	for {
		st, err := cl.Status(context.Background())
		if err == nil && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster never reached the state waited for: %+v %v", st, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (c *cluster) open(replicas int) *Store {
	c.t.Helper()
	s, err := Open(Config{Ctrl: c.ctrl, Token: token, Replicas: replicas, Name: c.t.Name(), Logf: c.t.Logf})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { s.Close() })
	return s
}

// pages stores n random pages in batches like the evictor's and returns them by slot.
func storePages(t *testing.T, s *Store, seed int64, n int) map[backend.Slot][]byte {
	t.Helper()
	rng := rand.New(rand.NewSource(seed))
	out := map[backend.Slot][]byte{}
	for n > 0 {
		b := min(n, 1+rng.Intn(200))
		data := make([]byte, b*backend.PageSize)
		rng.Read(data)
		slots := make([]backend.Slot, b)
		if err := s.Store(data, slots); err != nil {
			t.Fatal(err)
		}
		for i, sl := range slots {
			out[sl] = data[i*backend.PageSize : (i+1)*backend.PageSize]
		}
		n -= b
	}
	return out
}

func verify(t *testing.T, s *Store, pages map[backend.Slot][]byte) {
	t.Helper()
	buf := make([]byte, backend.PageSize)
	for sl, want := range pages {
		if err := s.Load(sl, buf); err != nil {
			t.Fatalf("slot %#x: %v", sl, err)
		}
		if !bytes.Equal(buf, want) {
			t.Fatalf("slot %#x came back with other bytes", sl)
		}
	}
}

func TestStoreLoadFreeAcrossSlabs(t *testing.T) {
	c := newCluster(t, 3)
	s := c.open(2)
	pages := storePages(t, s, 1, 3000) // ~12 slabs of 256 pages
	verify(t, s, pages)
	// Free a third, store more (reusing those slots), and everything still reads back.
	i := 0
	for sl := range pages {
		if i%3 == 0 {
			s.Free(sl)
			delete(pages, sl)
		}
		i++
	}
	for sl, p := range storePages(t, s, 2, 1500) {
		pages[sl] = p
	}
	if s.Stored() != len(pages) {
		t.Fatalf("Stored() = %d, want %d", s.Stored(), len(pages))
	}
	verify(t, s, pages)
	st := c.waitStatus(func(ctrl.Status) bool { return true })
	for _, sess := range st.Sessions {
		if sess.Name == t.Name() && sess.Slabs*256 < 3000 {
			t.Fatalf("session holds %d slabs for %d pages", sess.Slabs, len(pages))
		}
	}
}

func TestServerLossRebuildsReplica(t *testing.T) {
	c := newCluster(t, 3)
	s := c.open(2)
	pages := storePages(t, s, 3, 2000)
	dead := c.servers[0]
	dead.kill()
	// Reads go on at once from the surviving copy, before the ctrl notices.
	verify(t, s, pages)
	// The ctrl declares it dead and places replacements; the client fills them.
	c.waitStatus(func(st ctrl.Status) bool {
		for _, sv := range st.Servers {
			if sv.Addr == dead.addr && sv.Healthy {
				return false
			}
		}
		for _, sess := range st.Sessions {
			if sess.Name == t.Name() {
				return sess.Degraded == 0 && sess.Rebuilding == 0 && sess.Lost == 0
			}
		}
		return false
	})
	c.addServer()
	// With the replacements whole, losing a second original server loses nothing either.
	c.servers[1].kill()
	verify(t, s, pages)
	more := storePages(t, s, 4, 500)
	verify(t, s, more)
	select {
	case err := <-s.Lost():
		t.Fatalf("store reported a loss: %v", err)
	default:
	}
}

func TestSingleCopyLossStopsWithServerName(t *testing.T) {
	c := newCluster(t, 1)
	s := c.open(1)
	pages := storePages(t, s, 5, 300)
	victim := c.servers[0]
	victim.kill()
	select {
	case err := <-s.Lost():
		if !strings.Contains(err.Error(), victim.addr) {
			t.Fatalf("loss message does not name the server %s: %v", victim.addr, err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("no loss reported after the only server died")
	}
	buf := make([]byte, backend.PageSize)
	for sl := range pages {
		if err := s.Load(sl, buf); err == nil {
			t.Fatalf("slot %#x read back after its only copy died", sl)
		}
		break
	}
}

func TestCorruptCopyIsDetectedAndAnotherUsed(t *testing.T) {
	c := newCluster(t, 2)
	s := c.open(2)
	pages := storePages(t, s, 6, 100)
	// Overwrite every page on one server behind the store's back (same session, so the server
	// lets us): the store must notice by checksum and read the other copy.
	evil, err := fabric.DialTCP(c.servers[0].addr, fabric.DialConfig{Token: token, Session: s.Session()})
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	junk := bytes.Repeat([]byte{0xAB}, backend.PageSize)
	for sl := range pages {
		sb, pg, err := s.slot(sl)
		if err != nil {
			t.Fatal(err)
		}
		if err := evil.Write([]fabric.Addr{{Slab: sb.id, Page: pg}}, junk); err != nil {
			t.Fatal(err)
		}
	}
	verify(t, s, pages)
	var corrupt int64
	for _, sv := range s.servers.byID {
		corrupt += sv.corrupt.Load()
	}
	if corrupt == 0 {
		t.Fatal("no corrupt page was detected, yet every page on one server was overwritten")
	}
}

// A traced load carries its context to the memory server that answers it, and says which one
// did; an untraced load carries none.
func TestLoadTracedReachesTheServer(t *testing.T) {
	c := newCluster(t, 0)
	type seen struct {
		addr string
		tc   fabric.TraceContext
		op   fabric.Op
	}
	got := make(chan seen, 16)
	c.trace = func(addr string, r *fabric.TracedRequest) { got <- seen{addr, r.Context, r.Op} }
	c.addServer()
	c.addServer()
	s := c.open(2)
	pages := storePages(t, s, 7, 10)
	verify(t, s, pages) // untraced: nothing reported
	tc := backend.TraceContext{TraceID: [16]byte{1, 2, 3}, SpanID: [8]byte{4, 5, 6}, Flags: 1}
	buf := make([]byte, backend.PageSize)
	for sl, want := range pages {
		from, err := s.LoadTraced(sl, buf, tc)
		if err != nil || !bytes.Equal(buf, want) {
			t.Fatalf("LoadTraced of slot %#x: %v (right bytes: %v)", sl, err, bytes.Equal(buf, want))
		}
		if from.Transport != "tcp" || from.Replica < 0 || from.Replica > 1 ||
			(from.Server != c.servers[0].addr && from.Server != c.servers[1].addr) {
			t.Fatalf("LoadTraced says it read from %+v; servers %s and %s", from, c.servers[0].addr, c.servers[1].addr)
		}
		select {
		case r := <-got:
			if r.addr != from.Server || r.tc != fabric.TraceContext(tc) || r.op != fabric.OpRead {
				t.Fatalf("server %s saw %v with context %+v; want %s, a read, %+v", r.addr, r.op, r.tc, from.Server, tc)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the memory server was not told of the traced read")
		}
		break
	}
	select {
	case r := <-got:
		t.Fatalf("an untraced request was reported as traced: %+v", r)
	case <-time.After(100 * time.Millisecond):
	}
}
