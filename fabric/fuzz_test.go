package fabric

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func frame(h Header, payload ...[]byte) []byte {
	p := bytes.Join(payload, nil)
	h.Len = uint32(len(p))
	b := make([]byte, HeaderSize)
	h.Put(b)
	return append(b, p...)
}

func addrBytes(addrs ...Addr) []byte {
	b := make([]byte, len(addrs)*AddrSize)
	PutAddrs(b, addrs)
	return b
}

// FuzzServe feeds arbitrary bytes to an authenticated server connection holding one slab: the
// server must answer or close, never crash, hang or touch memory outside the slab. The corpus
// found by fuzzing is kept in testdata/fuzz/FuzzServe.
func FuzzServe(f *testing.F) {
	srv := NewServer(ServerConfig{Token: testToken, CapacityPages: 1 << 12})
	sess := NewSessionID()
	if st, msg := srv.create(grant(srv, 5, sess, 8), sess); st != StatusOK {
		f.Fatal(msg)
	}
	page := bytes.Repeat([]byte{7}, PageSize)
	f.Add(frame(Header{Op: OpRead, Count: 1}, addrBytes(Addr{5, 1})))
	f.Add(frame(Header{Op: OpWrite, Count: 1}, addrBytes(Addr{5, 2}), page))
	f.Add(frame(Header{Op: OpWrite, Count: 2}, addrBytes(Addr{5, 2}, Addr{6, 0}), page, page))
	f.Add(frame(Header{Op: OpCreate}, encodeGrant(nil, grant(srv, 9, sess, 8))))
	f.Add(frame(Header{Op: OpFree}, []byte{9, 0, 0, 0, 0, 0, 0, 0}))
	f.Add(frame(Header{Op: OpRead, Count: 2}, addrBytes(Addr{5, 7}, Addr{5, 8})))
	f.Add(append(frame(Header{Op: OpRead, Count: 1}, addrBytes(Addr{5, 0})), frame(Header{Op: 99})...))
	f.Add(frame(Header{Op: OpMap}, []byte{5, 0, 0, 0, 0, 0, 0, 0}))
	f.Add(frame(Header{Op: OpMap}, []byte{6, 0, 0, 0, 0, 0, 0, 0}))
	f.Add(frame(Header{Op: OpMap, Count: 1}, []byte{5, 0, 0, 0}))
	tc := make([]byte, TraceContextSize) // traced requests (version 2)
	(&TraceContext{TraceID: [16]byte{1}, SpanID: [8]byte{2}, Flags: 1}).put(tc)
	f.Add(frame(Header{Op: OpRead, Count: 1, Flags: FlagTraced}, tc, addrBytes(Addr{5, 1})))
	f.Add(frame(Header{Op: OpWrite, Count: 1, Flags: FlagTraced}, tc, addrBytes(Addr{5, 2}), page))
	f.Add(frame(Header{Op: OpRead, Count: 1, Flags: FlagTraced}, make([]byte, TraceContextSize), addrBytes(Addr{5, 1})))
	f.Add(frame(Header{Op: OpFree, Flags: FlagTraced}, tc, []byte{9, 0, 0, 0, 0, 0, 0, 0}))
	f.Fuzz(func(t *testing.T, in []byte) {
		fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fds[1])
		c := &serverConn{srv: srv, session: sess, unix: true} // a unix socket: Map is served too
		c.fd = fds[0]
		done := make(chan struct{})
		go func() { // drain the answers so the server never blocks on a full socket
			var b [1 << 16]byte
			for {
				if n, err := unix.Read(fds[1], b[:]); n <= 0 || err != nil {
					close(done)
					return
				}
			}
		}()
		wrote := feed(fds[1], in)
		watchdog := time.AfterFunc(5*time.Second, func() { panic(fmt.Sprintf("server hung on %x", in)) })
		c.loop()
		unix.Close(fds[0])
		<-done
		<-wrote // before fds[1] closes: a number reused while it writes would get its bytes
		watchdog.Stop()
		// Whatever the input did, the slab is intact and still served.
		if srv.UsedPages() < 8 {
			t.Fatalf("server uses %d pages, slab 5 is gone", srv.UsedPages())
		}
		for _, id := range srv.Slabs() {
			if id != 5 {
				srv.FreeSlab(id)
			}
		}
	})
}

func FuzzParseHeader(f *testing.F) {
	f.Add(frame(Header{Op: OpRead, Count: 3, ID: 9}, make([]byte, 36)))
	f.Add(frame(Header{Op: OpWrite, Count: MaxPages}))
	f.Add(frame(Header{Op: OpRead, Count: 2, Flags: FlagTraced}, make([]byte, TraceContextSize+2*AddrSize)))
	f.Add(frame(Header{Op: OpCreate, Flags: FlagTraced | 2}))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			return
		}
		if h.Count > MaxPages || h.Len > TraceContextSize+MaxPages*(AddrSize+PageSize) || h.Flags&^FlagTraced != 0 {
			t.Fatalf("ParseHeader let through %+v", h)
		}
		var back [HeaderSize]byte
		h.Put(back[:])
		if !bytes.Equal(back[:], b[:HeaderSize]) {
			t.Fatalf("header %x re-encodes as %x", b[:HeaderSize], back)
		}
	})
}

// feed writes in to fd and then shuts down fd's sending side, on its own goroutine; the channel
// is closed once it is done (or the peer stopped reading).
func feed(fd int, in []byte) <-chan struct{} {
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		for b := in; len(b) > 0; {
			n, err := unix.Write(fd, b)
			if err != nil {
				break
			}
			b = b[n:]
		}
		unix.Shutdown(fd, unix.SHUT_WR)
	}()
	return wrote
}
