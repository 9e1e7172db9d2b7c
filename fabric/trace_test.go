package fabric

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// traceLog collects what a server's Trace hook is told.
type traceLog struct {
	mu   sync.Mutex
	reqs []TracedRequest
}

func (l *traceLog) hook(r *TracedRequest) {
	l.mu.Lock()
	l.reqs = append(l.reqs, *r)
	l.mu.Unlock()
}

// wait returns the first n records: the hook runs after the answer is sent, so the client may
// have its answer a moment before the hook is told.
func (l *traceLog) wait(t *testing.T, n int) []TracedRequest {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		l.mu.Lock()
		got := append([]TracedRequest(nil), l.reqs...)
		l.mu.Unlock()
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("the trace hook was told of %d requests, want %d: %+v", len(got), n, got)
		}
	}
}

func testContext(b byte) TraceContext {
	tc := TraceContext{Flags: 1}
	for i := range tc.TraceID {
		tc.TraceID[i] = b + byte(i)
	}
	for i := range tc.SpanID {
		tc.SpanID[i] = 0x80 + b + byte(i)
	}
	return tc
}

// A traced Write and Read carry their context to the server's hook, with what the server did;
// untraced requests are not reported; a refused traced read is reported with its refusal.
func TestTracedRoundTrip(t *testing.T) {
	log := &traceLog{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ServerConfig{Token: testToken, CapacityPages: 1 << 12, Logf: t.Logf, Trace: log.hook})
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	s := NewSessionID()
	tr, err := DialTCP(ln.Addr().String(), DialConfig{Token: testToken, Session: s, Conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tr.Create(grant(srv, 1, s, 2048)); err != nil {
		t.Fatal(err)
	}
	if err := tr.Create(grant(srv, 2, s, 8)); err != nil {
		t.Fatal(err)
	}
	addrs := []Addr{{1, 3}, {1, 4}, {2, 7}}
	data := fill(5, len(addrs))
	if err := tr.Write(addrs, data); err != nil { // untraced: not reported
		t.Fatal(err)
	}
	wc, rc := testContext(0x10), testContext(0x40)
	if err := tr.WriteTraced(addrs, data, wc); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(data))
	if err := tr.ReadTraced(addrs, got, rc); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("traced read: %v (same bytes: %v)", err, bytes.Equal(got, data))
	}
	if err := tr.Read(addrs[:1], got[:PageSize]); err != nil {
		t.Fatal(err)
	}
	refused := testContext(0x70)
	wantRefused(t, tr.ReadTraced([]Addr{{9, 0}}, got[:PageSize], refused), StatusNoSlab)
	// A batch over MaxPages is two requests, each traced with the same context.
	big := make([]Addr, MaxPages+5)
	for i := range big {
		big[i] = Addr{1, uint32(i)}
	}
	batch := testContext(0xa0)
	if err := tr.ReadTraced(big, make([]byte, len(big)*PageSize), batch); err != nil {
		t.Fatal(err)
	}

	reqs := log.wait(t, 5)
	if len(reqs) != 5 {
		t.Fatalf("%d traced requests reported, want 5 (untraced ones are not): %+v", len(reqs), reqs)
	}
	// A one-page read goes on a connection of its own (the lane), so its report may come before
	// that of the request before it; each began after the one before had been answered.
	slices.SortStableFunc(reqs, func(a, b TracedRequest) int { return a.Start.Compare(b.Start) })
	for i, want := range []struct {
		tc     TraceContext
		op     Op
		pages  int
		slabs  int
		status Status
	}{{wc, OpWrite, 3, 2, StatusOK}, {rc, OpRead, 3, 2, StatusOK}, {refused, OpRead, 1, 0, StatusNoSlab},
		{batch, OpRead, MaxPages, 1, StatusOK}, {batch, OpRead, 5, 1, StatusOK}} {
		r := reqs[i]
		if r.Context != want.tc || r.Op != want.op || r.Pages != want.pages || r.Slabs != want.slabs || r.Status != want.status {
			t.Errorf("request %d: context %x/%x op %v pages %d slabs %d status %d; want %x/%x %v %d %d %d",
				i, r.Context.TraceID, r.Context.SpanID, r.Op, r.Pages, r.Slabs, r.Status,
				want.tc.TraceID, want.tc.SpanID, want.op, want.pages, want.slabs, want.status)
		}
		if r.Session != s || r.Err != nil || r.Start.IsZero() || r.End.Before(r.Start) {
			t.Errorf("request %d: session %v (want %v), err %v, from %v to %v", i, r.Session, s, r.Err, r.Start, r.End)
		}
	}
	if reqs[0].Slab != 1 || reqs[2].Slab != 9 || !strings.Contains(reqs[2].Message, "no slab 9") {
		t.Errorf("slab and refusal: %d, %d %q", reqs[0].Slab, reqs[2].Slab, reqs[2].Message)
	}
	// A zero context is the caller's bug, refused before anything is sent.
	if err := tr.ReadTraced(addrs, got, TraceContext{}); err == nil {
		t.Fatal("a read with a zero trace context was sent")
	}
}

// serveRaw feeds in to an authenticated server connection of session sess and returns the
// answers and what ended the connection (nil: the input ran out).
func serveRaw(t *testing.T, srv *Server, sess SessionID, in []byte) ([]byte, error) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[1])
	c := &serverConn{srv: srv, session: sess}
	c.fd = fds[0]
	var out bytes.Buffer
	done := make(chan struct{})
	go func() {
		defer close(done)
		var b [1 << 16]byte
		for {
			n, err := unix.Read(fds[1], b[:])
			if n <= 0 || err != nil {
				return
			}
			out.Write(b[:n])
		}
	}()
	wrote := feed(fds[1], in)
	err = c.loop()
	unix.Close(fds[0])
	<-done
	<-wrote // before fds[1] closes: a number reused while it writes would get its shutdown
	return out.Bytes(), err
}

// The trace flag is allowed on Read and Write requests only, unknown flag bits nowhere, and a
// context must name a span: anything else is malformed and ends the connection.
func TestTraceFlagMalformed(t *testing.T) {
	log := &traceLog{}
	srv := NewServer(ServerConfig{Token: testToken, CapacityPages: 1 << 12, Trace: log.hook})
	sess := NewSessionID()
	if st, msg := srv.create(grant(srv, 5, sess, 8), sess); st != StatusOK {
		t.Fatal(msg)
	}
	tcb := make([]byte, TraceContextSize)
	tc := testContext(1)
	tc.put(tcb)
	traced := func(h Header, payload ...[]byte) []byte {
		h.Flags |= FlagTraced
		return frame(h, append([][]byte{tcb}, payload...)...)
	}
	page := bytes.Repeat([]byte{9}, PageSize)

	// Well-formed: a traced read and write are answered, and the connection stays.
	in := append(traced(Header{Op: OpWrite, Count: 1, ID: 1}, addrBytes(Addr{5, 2}), page),
		traced(Header{Op: OpRead, Count: 1, ID: 2}, addrBytes(Addr{5, 2}))...)
	out, err := serveRaw(t, srv, sess, in)
	if err != nil {
		t.Fatalf("traced write and read ended the connection: %v", err)
	}
	if len(out) != 2*HeaderSize+PageSize || !bytes.Equal(out[2*HeaderSize:], page) {
		t.Fatalf("answers of %d bytes to a traced write and read", len(out))
	}
	for i := 0; i < 2; i++ {
		if h, err := ParseHeader(out[i*HeaderSize:]); err != nil || h.Flags != 0 || h.Status != StatusOK {
			t.Fatalf("answer %d: %+v %v (answers carry no flags)", i, h, err)
		}
	}
	if r := log.wait(t, 2); r[0].Context != tc || r[0].Op != OpWrite || r[1].Op != OpRead {
		t.Fatalf("hook told %+v", r)
	}

	zero := make([]byte, TraceContextSize)
	for _, c := range []struct {
		name string
		in   []byte
	}{
		{"unknown flag bit", frame(Header{Op: OpRead, Count: 1, Flags: 2}, addrBytes(Addr{5, 0}))},
		{"unknown flag bit beside the trace flag", frame(Header{Op: OpRead, Count: 1, Flags: FlagTraced | 1<<31}, tcb, addrBytes(Addr{5, 0}))},
		{"traced create", traced(Header{Op: OpCreate}, encodeGrant(nil, grant(srv, 6, sess, 8)))},
		{"traced free", traced(Header{Op: OpFree}, []byte{5, 0, 0, 0, 0, 0, 0, 0})},
		{"traced map", traced(Header{Op: OpMap}, []byte{5, 0, 0, 0, 0, 0, 0, 0})},
		{"traced hello", traced(Header{Op: OpHello})},
		{"traced error status", traced(Header{Op: OpRead, Status: StatusRange, Count: 1}, addrBytes(Addr{5, 0}))},
		{"traced read without its context", frame(Header{Op: OpRead, Count: 1, Flags: FlagTraced}, addrBytes(Addr{5, 0}))},
		{"traced write without its context", frame(Header{Op: OpWrite, Count: 1, Flags: FlagTraced}, addrBytes(Addr{5, 0}), page)},
		{"zero trace context", frame(Header{Op: OpRead, Count: 1, Flags: FlagTraced}, zero, addrBytes(Addr{5, 0}))},
	} {
		out, err := serveRaw(t, srv, sess, c.in)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: the connection ended with %v, want a malformed frame", c.name, err)
		}
		if len(out) != 0 {
			t.Errorf("%s: answered with %x", c.name, out)
		}
	}
	if n := len(log.wait(t, 2)); n != 2 {
		t.Errorf("malformed requests reached the trace hook: %d records", n)
	}
	if srv.UsedPages() != 8 {
		t.Errorf("server uses %d pages after malformed creates, want 8", srv.UsedPages())
	}
}

// The header's bounds: a traced request may carry its context on top of its pages, answers and
// other ops may not carry the flag at all.
func TestParseHeaderFlags(t *testing.T) {
	parse := func(h Header) error {
		var b [HeaderSize]byte
		h.Put(b[:])
		_, err := ParseHeader(b[:])
		return err
	}
	for _, ok := range []Header{
		{Op: OpRead, Count: MaxPages, Flags: FlagTraced, Len: TraceContextSize + MaxPages*AddrSize},
		{Op: OpWrite, Count: MaxPages, Flags: FlagTraced, Len: TraceContextSize + MaxPages*(AddrSize+PageSize)},
		{Op: OpRead, Count: 1, Len: PageSize}, // an answer
	} {
		if err := parse(ok); err != nil {
			t.Errorf("%+v: %v", ok, err)
		}
	}
	for _, bad := range []Header{
		{Op: OpRead, Count: 1, Flags: FlagTraced, Len: TraceContextSize + AddrSize + 1},
		{Op: OpRead, Count: 1, Flags: FlagTraced, Len: PageSize}, // an answer cannot be traced
		{Op: OpWrite, Count: 1, Flags: FlagTraced, Len: TraceContextSize + AddrSize + PageSize + 1},
		{Op: OpWrite, Count: 1, Flags: 4, Len: AddrSize + PageSize},
		{Op: OpChallenge, Flags: FlagTraced},
		{Op: OpRDMARegister, Flags: FlagTraced, Len: 8},
		{Op: OpRead, Status: StatusNoSlab, Flags: FlagTraced, Len: 10},
	} {
		if err := parse(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("%+v parsed (%v), want malformed", bad, err)
		}
	}
}

// An answer with flags set is malformed to the client too: the connection is dropped.
func TestClientRefusesFlaggedAnswer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// A server that skips checking the hello and answers a read with a flag set, on every
	// connection (a one-page read goes on a connection of its own: TCPClient's lane).
	serve := func(c net.Conn) {
		defer c.Close()
		ch := challenge{Version: Version, Instance: "x"}
		c.Write(frame(Header{Op: OpChallenge}, ch.encode()))
		hdr := make([]byte, HeaderSize)
		for _, answer := range []func(Header) []byte{
			func(h Header) []byte { return frame(Header{Op: OpHello, ID: h.ID}) },
			func(h Header) []byte {
				b := frame(Header{Op: OpRead, Count: 1, ID: h.ID}, make([]byte, PageSize))
				binary.LittleEndian.PutUint32(b[20:], FlagTraced)
				return b
			},
		} {
			if _, err := readFull(c, hdr); err != nil {
				return
			}
			h, _ := ParseHeader(hdr)
			readFull(c, make([]byte, h.Len))
			c.Write(answer(h))
		}
		readFull(c, hdr)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	tr, err := DialTCP(ln.Addr().String(), DialConfig{Token: testToken, Session: NewSessionID(), Conns: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	err = tr.ReadTraced([]Addr{{1, 0}}, make([]byte, PageSize), testContext(3))
	if err == nil || !strings.Contains(err.Error(), "malformed") {
		t.Fatalf("a flagged answer: %v, want a malformed frame", err)
	}
}
