package fabric

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// epollTargets lists the descriptors registered with any epoll instance of this process (the
// Go runtime's poller among them), from /proc/self/fdinfo.
func epollTargets(t *testing.T) map[int]bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]bool{}
	for _, e := range fds {
		if l, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name())); l != "anon_inode:[eventpoll]" {
			continue
		}
		info, err := os.ReadFile(filepath.Join("/proc/self/fdinfo", e.Name()))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(info), "\n") {
			var fd int
			if _, err := fmt.Sscanf(line, "tfd: %d", &fd); err == nil {
				out[fd] = true
			}
		}
	}
	return out
}

// The data path's sockets are out of the runtime's poller, on both ends: a registered socket
// wakes the poller thread for every segment that arrives (a second wakeup per request).
func TestSocketsOutOfThePoller(t *testing.T) {
	srv, ep := startEndpoints(t, 100)
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
	tr.pool <- c
	var fds []int
	srv.connMu.Lock()
	for sc := range srv.conns {
		fds = append(fds, sc.fd)
	}
	srv.connMu.Unlock()
	fds = append(fds, c.fd)
	reg := epollTargets(t)
	if len(reg) == 0 {
		t.Fatal("found no epoll registrations at all: the probe is broken")
	}
	for _, fd := range fds {
		if reg[fd] {
			t.Errorf("socket descriptor %d is registered with the runtime poller", fd)
		}
	}
}

// Polling (Spin) on both ends serves the same data as sleeping, whether the peer answers
// within the spin or long after it, and a server closing under a polling client ends its
// requests rather than hanging them.
func TestPollingRoundTrip(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ServerConfig{Token: testToken, CapacityPages: 1000, Logf: t.Logf, Spin: 200 * time.Microsecond})
	go srv.Serve(ln)
	defer srv.Close()
	s := NewSessionID()
	tr, err := DialTCP(ln.Addr().String(), DialConfig{Token: testToken, Session: s, Spin: 200 * time.Microsecond})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Create(grant(srv, 1, s, 512)); err != nil {
		t.Fatal(err)
	}
	data := fill(7, 512)
	addrs := make([]Addr, 512)
	for i := range addrs {
		addrs[i] = Addr{Slab: 1, Page: uint32(i)}
	}
	if err := tr.Write(addrs, data); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			pg := make([]byte, PageSize)
			for i := g; i < 512; i += 4 {
				if i%64 == 0 {
					time.Sleep(time.Millisecond) // past the spin: the server sleeps meanwhile
				}
				if err := tr.Read(addrs[i:i+1], pg); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(pg, data[i*PageSize:(i+1)*PageSize]) {
					errs <- fmt.Errorf("page %d differs", i)
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
	got := make([]byte, len(data))
	if err := tr.Read(addrs, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("batched read while polling: %v", err)
	}
	srv.Close()
	if err := tr.Read(addrs[:1], got[:PageSize]); err == nil {
		t.Fatal("a read succeeded after the server closed")
	}
}

// A one-page read (a fault's) does not wait for the pooled connections: with the pool's only
// connection taken, as by an eviction batch's write in flight, it goes on the lane and reads
// what was written. Close closes the lane's connection too.
func TestOnePageReadTakesTheLane(t *testing.T) {
	srv, addr := startServer(t, 100)
	s := NewSessionID()
	tr, err := DialTCP(addr, DialConfig{Token: testToken, Session: s, Conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := tr.Create(grant(srv, 1, s, 8)); err != nil {
		t.Fatal(err)
	}
	data := fill(7, 2)
	if err := tr.Write([]Addr{{Slab: 1, Page: 0}, {Slab: 1, Page: 1}}, data); err != nil {
		t.Fatal(err)
	}
	busy := <-tr.pool
	done := make(chan error, 1)
	go func() {
		got := make([]byte, PageSize)
		err := tr.Read([]Addr{{Slab: 1, Page: 1}}, got)
		if err == nil && !bytes.Equal(got, data[PageSize:]) {
			err = fmt.Errorf("page 1 came back with other bytes")
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a one-page read waited for the pool's only connection, which was busy")
	}
	tr.pool <- busy
	tr.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		srv.connMu.Lock()
		n := len(srv.conns)
		srv.connMu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the client's connections are still open at the server after Close", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
