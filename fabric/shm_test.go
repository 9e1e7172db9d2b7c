package fabric

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The shm transport reads and writes the server's very memory: what one transport writes, the
// other reads, in both directions.
func TestSHMSharesTheServersPages(t *testing.T) {
	srv, ep := startEndpoints(t, 1000)
	s := NewSessionID()
	shm, err := dialSHM(t, ep, testToken, s)
	if err != nil {
		t.Fatal(err)
	}
	tcp, err := dialTCP(t, ep, testToken, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := tcp.Create(grant(srv, 1, s, 8)); err != nil {
		t.Fatal(err)
	}
	a, b := fill(1, 1), fill(2, 1)
	if err := tcp.Write([]Addr{{1, 3}}, a); err != nil {
		t.Fatal(err)
	}
	pg := make([]byte, PageSize)
	if err := shm.Read([]Addr{{1, 3}}, pg); err != nil || !bytes.Equal(pg, a) {
		t.Fatalf("shm read of a page written over tcp: %v", err)
	}
	if err := shm.Write([]Addr{{1, 4}}, b); err != nil {
		t.Fatal(err)
	}
	if err := tcp.Read([]Addr{{1, 4}}, pg); err != nil || !bytes.Equal(pg, b) {
		t.Fatalf("tcp read of a page written over shm: %v", err)
	}
	// A refused shm write writes nothing, like a refused tcp write.
	wantRefused(t, shm.Write([]Addr{{1, 5}, {1, 8}}, append(fill(3, 1), fill(4, 1)...)), StatusRange)
	if err := tcp.Read([]Addr{{1, 5}}, pg); err != nil || !bytes.Equal(pg, make([]byte, PageSize)) {
		t.Fatalf("page 5 after a refused write: %v", err)
	}
}

// A slab the server frees (the ctrl said so) stays readable through an existing mapping until
// the client unmaps it; a server that goes away fails every later call.
func TestSHMLifetime(t *testing.T) {
	srv, ep := startEndpoints(t, 1000)
	s := NewSessionID()
	tr, err := DialSHM(ep.unix, DialConfig{Token: testToken, Session: s})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Create(grant(srv, 1, s, 8)); err != nil {
		t.Fatal(err)
	}
	data := fill(5, 1)
	if err := tr.Write([]Addr{{1, 0}}, data); err != nil {
		t.Fatal(err)
	}
	srv.FreeSlab(1)
	if srv.UsedPages() != 0 {
		t.Fatalf("server uses %d pages after freeing its only slab", srv.UsedPages())
	}
	pg := make([]byte, PageSize)
	if err := tr.Read([]Addr{{1, 0}}, pg); err != nil || !bytes.Equal(pg, data) {
		t.Fatalf("read through the mapping of a slab the server freed: %v", err)
	}
	// Unmapped, it is gone: mapping it again is refused.
	wantRefused(t, tr.Free(1), StatusNoSlab)
	wantRefused(t, tr.Read([]Addr{{1, 0}}, pg), StatusNoSlab)

	if err := tr.Create(grant(srv, 2, s, 8)); err != nil {
		t.Fatal(err)
	}
	srv.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := tr.Read([]Addr{{2, 0}}, pg)
		if err != nil {
			if !strings.Contains(err.Error(), "is gone") {
				t.Fatalf("read after the server closed: %v", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("reads still succeed long after the server closed")
		}
		time.Sleep(time.Millisecond)
	}
	if err := tr.Write([]Addr{{2, 0}}, pg); err == nil {
		t.Fatal("write succeeded after the server closed")
	}
}

// Map is for unix sockets: over tcp it is a malformed frame and the connection closes.
func TestMapOverTCPClosesTheConnection(t *testing.T) {
	srv, ep := startEndpoints(t, 1000)
	s := NewSessionID()
	tr, err := DialTCP(ep.tcp, DialConfig{Token: testToken, Session: s, Conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Create(grant(srv, 1, s, 8)); err != nil {
		t.Fatal(err)
	}
	c := <-tr.pool
	defer func() { tr.pool <- c }()
	fd, _, err := c.mapSlab(1)
	var re *RemoteError
	if err == nil || errors.As(err, &re) {
		unix.Close(fd)
		t.Fatalf("map over tcp: %v, want the connection closed", err)
	}
}

// A slab's memfd is sealed at its size: a client holding it cannot shrink it under the server.
func TestSlabSealed(t *testing.T) {
	sl, err := newSlab(1, NewSessionID(), 4)
	if err != nil {
		t.Fatal(err)
	}
	defer sl.unref()
	if err := unix.Ftruncate(sl.fd, 0); err == nil {
		t.Fatal("a slab's memfd could be truncated")
	}
	if err := unix.Ftruncate(sl.fd, 8*PageSize); err == nil {
		t.Fatal("a slab's memfd could be grown")
	}
}
