package fabric

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var testToken = Token("fabric-test-token-0123456789")

// endpoint is where a test server listens: a loopback port and a unix socket.
type endpoint struct{ tcp, unix string }

// startServer runs a memory server on a loopback port.
func startServer(t testing.TB, capacity int64) (*Server, string) {
	t.Helper()
	s, ep := startEndpoints(t, capacity)
	return s, ep.tcp
}

// startEndpoints runs a memory server on a loopback port and a unix socket.
func startEndpoints(t testing.TB, capacity int64) (*Server, endpoint) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "memserver.sock")
	uln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(ServerConfig{Token: testToken, CapacityPages: capacity, Logf: t.Logf})
	go s.Serve(ln)
	go s.Serve(uln)
	t.Cleanup(func() { s.Close() })
	return s, endpoint{tcp: ln.Addr().String(), unix: path}
}

// dialer makes a transport to a server for a session with a token; each transport runs the
// same suite.
type dialer func(t testing.TB, ep endpoint, tok Token, s SessionID) (Transport, error)

func dialTCP(t testing.TB, ep endpoint, tok Token, s SessionID) (Transport, error) {
	c, err := DialTCP(ep.tcp, DialConfig{Token: tok, Session: s})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return c, nil
}

func dialSHM(t testing.TB, ep endpoint, tok Token, s SessionID) (Transport, error) {
	c, err := DialSHM(ep.unix, DialConfig{Token: tok, Session: s})
	if err != nil {
		return nil, err
	}
	t.Cleanup(func() { c.Close() })
	return c, nil
}

func grant(srv *Server, slab uint64, s SessionID, pages uint32) *Grant {
	g := &Grant{Slab: slab, Session: s, Server: srv.Instance(), Pages: pages}
	testToken.Sign(g)
	return g
}

func fill(seed int64, n int) []byte {
	b := make([]byte, n*PageSize)
	rand.New(rand.NewSource(seed)).Read(b)
	return b
}

func TestConformanceTCP(t *testing.T) { conformance(t, dialTCP) }
func TestConformanceSHM(t *testing.T) { conformance(t, dialSHM) }

func conformance(t *testing.T, dial dialer) {
	t.Run("RoundTrip", func(t *testing.T) {
		srv, addr := startEndpoints(t, 1<<16)
		s := NewSessionID()
		tr, err := dial(t, addr, testToken, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Create(grant(srv, 1, s, 4096)); err != nil {
			t.Fatal(err)
		}
		if err := tr.Create(grant(srv, 2, s, 16)); err != nil {
			t.Fatal(err)
		}
		// A scattered batch across two slabs, larger than one request can carry.
		n := MaxPages + 300
		addrs := make([]Addr, n)
		perm := rand.New(rand.NewSource(1)).Perm(4096)
		for i := range addrs {
			addrs[i] = Addr{Slab: 1, Page: uint32(perm[i])}
		}
		addrs[7] = Addr{Slab: 2, Page: 15}
		data := fill(2, n)
		if err := tr.Write(addrs, data); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(data))
		if err := tr.Read(addrs, got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatal("batched read returned other bytes than were written")
		}
		// Single pages, in another order, from several goroutines at once.
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for g := 0; g < 8; g++ {
			wg.Add(1)
			go func(g int) {
				defer wg.Done()
				pg := make([]byte, PageSize)
				for i := g; i < n; i += 8 {
					if err := tr.Read(addrs[i:i+1], pg); err != nil {
						errs <- err
						return
					}
					if !bytes.Equal(pg, data[i*PageSize:(i+1)*PageSize]) {
						errs <- fmt.Errorf("page %d (%v) differs", i, addrs[i])
						return
					}
				}
			}(g)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if srv.UsedPages() != 4096+16 {
			t.Fatalf("server uses %d pages, want %d", srv.UsedPages(), 4096+16)
		}
		if err := tr.Free(2); err != nil {
			t.Fatal(err)
		}
		if srv.UsedPages() != 4096 {
			t.Fatalf("after free the server uses %d pages, want 4096", srv.UsedPages())
		}
		wantRefused(t, tr.Read([]Addr{{Slab: 2, Page: 0}}, make([]byte, PageSize)), StatusNoSlab)
	})

	t.Run("Refusals", func(t *testing.T) {
		srv, addr := startEndpoints(t, 100)
		s := NewSessionID()
		tr, err := dial(t, addr, testToken, s)
		if err != nil {
			t.Fatal(err)
		}
		pg := make([]byte, PageSize)
		wantRefused(t, tr.Read([]Addr{{Slab: 9, Page: 0}}, pg), StatusNoSlab)
		if err := tr.Create(grant(srv, 9, s, 64)); err != nil {
			t.Fatal(err)
		}
		wantRefused(t, tr.Read([]Addr{{Slab: 9, Page: 64}}, pg), StatusRange)
		wantRefused(t, tr.Write([]Addr{{Slab: 9, Page: 1}, {Slab: 9, Page: 99}}, make([]byte, 2*PageSize)), StatusRange)
		wantRefused(t, tr.Create(grant(srv, 10, s, 64)), StatusCapacity)
		forged := grant(srv, 11, s, 8)
		forged.Pages = 16
		wantRefused(t, tr.Create(forged), StatusBadGrant)
		other := grant(srv, 12, NewSessionID(), 8)
		wantRefused(t, tr.Create(other), StatusBadGrant)
		elsewhere := &Grant{Slab: 13, Session: s, Server: "another-server", Pages: 8}
		testToken.Sign(elsewhere)
		wantRefused(t, tr.Create(elsewhere), StatusBadGrant)
		// The connection stays usable after every refusal.
		if err := tr.Write([]Addr{{Slab: 9, Page: 3}}, fill(3, 1)); err != nil {
			t.Fatal(err)
		}
		if err := tr.Read([]Addr{{Slab: 9, Page: 3}}, pg); err != nil || !bytes.Equal(pg, fill(3, 1)) {
			t.Fatalf("read after refusals: %v", err)
		}
	})

	t.Run("SessionsIsolated", func(t *testing.T) {
		srv, addr := startEndpoints(t, 1000)
		a, b := NewSessionID(), NewSessionID()
		ta, err := dial(t, addr, testToken, a)
		if err != nil {
			t.Fatal(err)
		}
		tb, err := dial(t, addr, testToken, b)
		if err != nil {
			t.Fatal(err)
		}
		if err := ta.Create(grant(srv, 1, a, 8)); err != nil {
			t.Fatal(err)
		}
		secret := fill(4, 1)
		if err := ta.Write([]Addr{{Slab: 1, Page: 0}}, secret); err != nil {
			t.Fatal(err)
		}
		pg := make([]byte, PageSize)
		wantRefused(t, tb.Read([]Addr{{Slab: 1, Page: 0}}, pg), StatusNoSlab)
		wantRefused(t, tb.Write([]Addr{{Slab: 1, Page: 0}}, pg), StatusNoSlab)
		wantRefused(t, tb.Free(1), StatusNoSlab)
		// B presenting A's grant does not make the slab B's.
		wantRefused(t, tb.Create(grant(srv, 1, a, 8)), StatusBadGrant)
		if bytes.Contains(pg, secret[:64]) {
			t.Fatal("session B saw session A's page")
		}
		if err := ta.Read([]Addr{{Slab: 1, Page: 0}}, pg); err != nil || !bytes.Equal(pg, secret) {
			t.Fatalf("A's page after B's attempts: %v", err)
		}
	})

	t.Run("WrongToken", func(t *testing.T) {
		_, addr := startEndpoints(t, 10)
		_, err := dial(t, addr, Token("not-the-cluster-token"), NewSessionID())
		if err == nil || !strings.Contains(err.Error(), "refused the cluster token") {
			t.Fatalf("dial with a wrong token: %v", err)
		}
	})
}

func wantRefused(t *testing.T, err error, st Status) {
	t.Helper()
	var re *RemoteError
	if !errors.As(err, &re) || re.Status != st {
		t.Fatalf("got %v, want a refusal with status %d", err, st)
	}
}
