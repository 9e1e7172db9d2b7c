//go:build rdma

package fabric

// The rdma transport's tests need an RDMA device: `make test-rdma` runs them in a qemu guest
// with rdma_rxe (workloads/rdma/test-rdma.sh). Where there is none they fail, they do not skip:
// building with -tags rdma is asking for them.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

func dialRDMA(t testing.TB, ep endpoint, tok Token, s SessionID) (Transport, error) {
	c, err := DialRDMA(ep.tcp, DialConfig{Token: tok, Session: s})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return c, nil
}

func TestConformanceRDMA(t *testing.T) { conformance(t, dialRDMA) }

// slabOf is the server's slab id, or nil.
func slabOf(srv *Server, id uint64) *slab {
	srv.mu.RLock()
	defer srv.mu.RUnlock()
	return srv.slabs[id]
}

func waitRefs(t *testing.T, sl *slab, want int32) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); sl.refs.Load() != want; {
		if time.Now().After(deadline) {
			t.Fatalf("slab %d has %d references, want %d", sl.id, sl.refs.Load(), want)
		}
		time.Sleep(time.Millisecond)
	}
}

// A session gets a key for its own slabs only, asked for on its own control connection.
func TestRDMARegisterOwnSlabsOnly(t *testing.T) {
	srv, ep := startEndpoints(t, 100)
	a, b := NewSessionID(), NewSessionID()
	ta, err := dialRDMA(t, ep, testToken, a)
	if err != nil {
		t.Fatal(err)
	}
	if err := ta.Create(grant(srv, 1, a, 8)); err != nil {
		t.Fatal(err)
	}
	raw, err := DialTCP(ep.tcp, DialConfig{Token: testToken, Session: b})
	if err != nil {
		t.Fatal(err)
	}
	register := func(id uint64) (rdmaRegion, error) {
		var p [8]byte
		var ans [rdmaRegionSize]byte
		binary.LittleEndian.PutUint64(p[:], id)
		err := raw.do(func(c *clientConn) error { return c.call(OpRDMARegister, 0, [][]byte{p[:]}, ans[:]) })
		return decodeRDMARegion(ans[:]), err
	}
	_, err = register(1)
	wantRefused(t, err, StatusNoSlab)
	_, err = register(77)
	wantRefused(t, err, StatusNoSlab)
	if err := raw.Create(grant(srv, 2, b, 4)); err != nil {
		t.Fatal(err)
	}
	r, err := register(2)
	if err != nil || r.Pages != 4 || r.RKey == 0 {
		t.Fatalf("register of the session's own slab: %+v, %v", r, err)
	}
	// The registration holds the slab; closing the connection lets it go.
	sl := slabOf(srv, 2)
	waitRefs(t, sl, 2)
	raw.Close()
	waitRefs(t, sl, 1)
}

// A slab freed on the server (as the ctrl frees it) is deregistered at once: the client's key
// stops working, its next access is refused like any read of a gone slab, and the slab's
// memory is gone (no reference left) although the client never said anything.
func TestRDMAFreedSlabIsRevoked(t *testing.T) {
	srv, ep := startEndpoints(t, 100)
	s := NewSessionID()
	tr, err := dialRDMA(t, ep, testToken, s)
	if err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 2; id++ {
		if err := tr.Create(grant(srv, id, s, 8)); err != nil {
			t.Fatal(err)
		}
	}
	addrs := []Addr{{Slab: 1, Page: 5}, {Slab: 2, Page: 1}}
	data := fill(5, 2)
	if err := tr.Write(addrs, data); err != nil {
		t.Fatal(err)
	}
	sl := slabOf(srv, 1)
	waitRefs(t, sl, 2) // the map's and the registration's
	srv.FreeSlab(1)
	if n := sl.refs.Load(); n != 0 {
		t.Fatalf("freed slab still has %d references", n)
	}
	got := make([]byte, 2*PageSize)
	wantRefused(t, tr.Read(addrs, got), StatusNoSlab)
	wantRefused(t, tr.Write(addrs[:1], data[:PageSize]), StatusNoSlab)
	// The client recovered (a new queue pair): slab 2 is intact and usable.
	if err := tr.Read(addrs[1:], got[:PageSize]); err != nil || !bytes.Equal(got[:PageSize], data[PageSize:]) {
		t.Fatalf("read of slab 2 after slab 1 was freed: %v", err)
	}
}

// A key opens a slab only through the queue pairs of the connection it was registered on: a
// session that learns another's address and key gets a remote access error from the device,
// then (asking for the key itself) a refusal.
func TestRDMAKeyIsUselessToAnotherSession(t *testing.T) {
	srv, ep := startEndpoints(t, 100)
	a, b := NewSessionID(), NewSessionID()
	ta, err := dialRDMA(t, ep, testToken, a)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := dialRDMA(t, ep, testToken, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := ta.Create(grant(srv, 1, a, 8)); err != nil {
		t.Fatal(err)
	}
	secret := fill(6, 1)
	if err := ta.Write([]Addr{{Slab: 1, Page: 0}}, secret); err != nil {
		t.Fatal(err)
	}
	ca, cb := ta.(*RDMAClient), tb.(*RDMAClient)
	ca.slabMu.RLock()
	stolen := ca.slabs[1]
	ca.slabMu.RUnlock()
	cb.slabMu.Lock()
	cb.slabs[1] = stolen
	cb.slabMu.Unlock()
	pg := make([]byte, PageSize)
	wantRefused(t, tb.Read([]Addr{{Slab: 1, Page: 0}}, pg), StatusNoSlab)
	if bytes.Equal(pg, secret) {
		t.Fatal("session B read session A's page with A's key")
	}
	overwrite := fill(7, 1)
	cb.slabMu.Lock()
	cb.slabs[1] = stolen
	cb.slabMu.Unlock()
	wantRefused(t, tb.Write([]Addr{{Slab: 1, Page: 0}}, overwrite), StatusNoSlab)
	if err := ta.Read([]Addr{{Slab: 1, Page: 0}}, pg); err != nil || !bytes.Equal(pg, secret) {
		t.Fatalf("A's page after B's attempts: %v", err)
	}
}

// Closing a client lets go of every registration; the slabs stay (they are the session's until
// freed).
func TestRDMACloseReleasesRegistrations(t *testing.T) {
	srv, ep := startEndpoints(t, 100)
	s := NewSessionID()
	tr, err := DialRDMA(ep.tcp, DialConfig{Token: testToken, Session: s, Conns: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Create(grant(srv, 1, s, 16)); err != nil {
		t.Fatal(err)
	}
	data := fill(8, 1)
	if err := tr.Write([]Addr{{Slab: 1, Page: 15}}, data); err != nil {
		t.Fatal(err)
	}
	sl := slabOf(srv, 1)
	waitRefs(t, sl, 2)
	tr.Close()
	waitRefs(t, sl, 1)
	if !bytes.Equal(sl.page(15), data) {
		t.Fatal("the slab lost its page when the client closed")
	}
	// A new client of the same session picks the slab up again.
	tr2, err := dialRDMA(t, ep, testToken, s)
	if err != nil {
		t.Fatal(err)
	}
	got := make([]byte, PageSize)
	if err := tr2.Read([]Addr{{Slab: 1, Page: 15}}, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read from a new client: %v", err)
	}
}

// The data path is one-sided: the server's connection goroutine sees the control requests
// only. Timings are logged (under qemu's TCG they say nothing about hardware).
func TestRDMAReadLatency(t *testing.T) {
	srv, ep := startEndpoints(t, 1<<12)
	s := NewSessionID()
	tr, err := dialRDMA(t, ep, testToken, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Create(grant(srv, 1, s, 1<<12)); err != nil {
		t.Fatal(err)
	}
	// Pages 0..MaxPages-1 hold distinct bytes, so that a read of the wrong page, or of nothing,
	// is caught: every read below is compared with what was written.
	batch := make([]Addr, MaxPages)
	for i := range batch {
		batch[i] = Addr{Slab: 1, Page: uint32(i)}
	}
	want := make([]byte, MaxPages*PageSize)
	for i := range want {
		want[i] = byte(i*7 + i/PageSize*13 + 1)
	}
	if err := tr.Write(batch, want); err != nil {
		t.Fatal(err)
	}
	pg := make([]byte, PageSize)
	addr := []Addr{{Slab: 1, Page: 3}}
	const n = 2000
	var el time.Duration
	for i := 0; i < n; i++ {
		clear(pg)
		start := time.Now()
		if err := tr.Read(addr, pg); err != nil {
			t.Fatal(err)
		}
		el += time.Since(start)
		if !bytes.Equal(pg, want[3*PageSize:4*PageSize]) {
			t.Fatalf("read %d of page 3: not what was written", i)
		}
	}
	one := el / n
	buf := make([]byte, MaxPages*PageSize)
	el = 0
	for i := 0; i < 10; i++ {
		clear(buf)
		start := time.Now()
		if err := tr.Read(batch, buf); err != nil {
			t.Fatal(err)
		}
		el += time.Since(start)
		if !bytes.Equal(buf, want) {
			for j := range batch {
				if !bytes.Equal(buf[j*PageSize:(j+1)*PageSize], want[j*PageSize:(j+1)*PageSize]) {
					t.Fatalf("batch read %d: page %d is not what was written", i, j)
				}
			}
		}
	}
	t.Logf("rdma on %s: 4 KiB read %v each; batches of %d: %.0f pages/s (%.1f MB/s)", tr.(*RDMAClient).Device(),
		one, MaxPages, float64(10*MaxPages)/el.Seconds(), float64(10*MaxPages*PageSize)/el.Seconds()/1e6)
}

// A server that goes away fails the requests in bounded time (the caller then uses another
// replica), and never with a refusal.
func TestRDMAServerGone(t *testing.T) {
	srv, ep := startEndpoints(t, 100)
	s := NewSessionID()
	tr, err := DialRDMA(ep.tcp, DialConfig{Token: testToken, Session: s, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Create(grant(srv, 1, s, 8)); err != nil {
		t.Fatal(err)
	}
	pg := make([]byte, PageSize)
	if err := tr.Write([]Addr{{Slab: 1, Page: 0}}, pg); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	for i := 0; i < 3; i++ {
		start := time.Now()
		err := tr.Read([]Addr{{Slab: 1, Page: 0}}, pg)
		var re *RemoteError
		if err == nil || errors.As(err, &re) {
			t.Fatalf("read %d from a closed server: %v", i, err)
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Fatalf("read %d took %v to fail", i, el)
		}
		t.Logf("read %d: %v after %v", i, err, time.Since(start).Round(time.Millisecond))
	}
}

// Reads and writes allocate nothing once the queue pairs and the slab's region are there.
func TestRDMANoAllocations(t *testing.T) {
	srv, ep := startEndpoints(t, 100)
	s := NewSessionID()
	tr, err := dialRDMA(t, ep, testToken, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Create(grant(srv, 1, s, 64)); err != nil {
		t.Fatal(err)
	}
	addrs := []Addr{{Slab: 1, Page: 1}, {Slab: 1, Page: 9}, {Slab: 1, Page: 63}}
	buf := fill(9, len(addrs))
	if err := tr.Write(addrs, buf); err != nil {
		t.Fatal(err)
	}
	var failed error
	if n := testing.AllocsPerRun(200, func() {
		if err := tr.Write(addrs, buf); err != nil {
			failed = err
		}
		if err := tr.Read(addrs, buf); err != nil {
			failed = err
		}
	}); n != 0 || failed != nil {
		t.Fatalf("%v allocations per write+read (%v)", n, failed)
	}
}
