// Command fabric benchmarks farmem's page transports against the raw floors measured in the
// same run, and writes a markdown report (results/fabric.md via `make bench-fabric`).
//
// The memory servers run in a child process (this binary re-executed with -serve) on loopback
// tcp ports and a unix socket, next to a raw echo server that answers each request with the
// bytes a read's answer carries, in the same blocking-syscall style as fabric's tcp code.
// Measured, one request in flight at a time (unless a row says otherwise), every path in
// interleaved rounds:
//
//   - 4 KiB single-page read latency (p50/p99): raw loopback ping-pong, fabric tcp (sleeping
//     and polling, each against the raw floor done the same way), fabric shm, memcpy of a
//     random page of a 64 MiB buffer;
//   - batched throughput (-batch pages per request, random pages): raw ping-pong of the same
//     shape, raw one-way stream, fabric tcp read/write, fabric shm read/write, memcpy;
//   - what TLS on the page path would cost (tls.go): the raw ping-pong through a Go net.Conn and
//     through crypto/tls, single pages and batches;
//   - fault service through userfaultfd, handler and faulting thread on one CPU as farmem's
//     fetcher places them: zero-fill (UFFDIO_ZEROPAGE, and UFFDIO_COPY of zeros), a local
//     page copied in (the embedded store), and a page fetched over shm and over tcp.
//
// Every page read is compared with what was written there (each path's check, run after the
// timed call so that it costs the figures nothing; the raw stream's last MiB of each call, and
// every MiB of an untimed pass before it is measured); a mismatch stops the benchmark.
package main

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/fabric"
	"github.com/farmem/farmem/latency"
	"github.com/farmem/farmem/uffd"
)

const (
	slabPages = 16384 // 64 MiB
	tokenEnv  = "FARMEM_BENCH_TOKEN"
)

var (
	out       = flag.String("out", "results/fabric.md", "where the report goes")
	singles   = flag.Int("n", 20000, "single-page requests per latency measurement")
	batch     = flag.Int("batch", 256, "pages per batched request")
	batches   = flag.Int("batches", 400, "batched requests per throughput measurement")
	faults    = flag.Int("faults", 8192, "faults per fault-service measurement (0: skip)")
	rounds    = flag.Int("rounds", 5, "interleaved rounds every measurement is split into")
	spin      = flag.Duration("spin", 50*time.Microsecond, "the polling variants' Spin")
	commit    = flag.String("commit", "", "the farmem commit measured, named in the report (make bench-fabric passes it)")
	serveMode = flag.String("serve", "", "internal: run the servers, with the unix socket at this path")
)

func main() {
	flag.Parse()
	if *serveMode != "" {
		serve(*serveMode, *spin)
		return
	}
	// A run takes seconds; one that hangs says where, rather than sitting there.
	time.AfterFunc(5*time.Minute, func() {
		fmt.Fprintf(os.Stderr, "bench-fabric: still running after 5 minutes; goroutines:\n")
		pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
		os.Exit(1)
	})
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench-fabric: %v\n", err)
		os.Exit(1)
	}
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

// serve is the child: a memory server (tcp and unix), another one that polls (tcp) and the
// raw echo server; it prints their tcp addresses and runs until its stdin closes (the parent is
// gone).
func serve(sock string, spin time.Duration) {
	tok := fabric.Token(os.Getenv(tokenEnv))
	srv := fabric.NewServer(fabric.ServerConfig{Token: tok, CapacityPages: 1 << 20})
	psrv := fabric.NewServer(fabric.ServerConfig{Token: tok, CapacityPages: 1 << 20, Spin: spin})
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	pl, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	go psrv.Serve(pl)
	ul, err := net.Listen("unix", sock)
	check(err)
	rl, err := net.Listen("tcp", "127.0.0.1:0")
	check(err)
	rawMem = rawBytes()
	go srv.Serve(tl)
	go srv.Serve(ul)
	go func() {
		for {
			c, err := rl.Accept()
			if err != nil {
				return
			}
			go rawServe(rawFD(c))
		}
	}()
	fmt.Printf("%s %s %s %s %s\n", tl.Addr(), pl.Addr(), rl.Addr(), listenConnEcho(false), listenConnEcho(true))
	io.Copy(io.Discard, os.Stdin)
	srv.Close()
}

// rawFD turns a tcp connection into a blocking descriptor with TCP_NODELAY, as fabric does: a
// dup of its own, out of the runtime's poller (a conn.File() dup stays registered with epoll and
// wakes the poller thread on every segment).
func rawFD(c net.Conn) int {
	rc, err := c.(*net.TCPConn).SyscallConn()
	check(err)
	fd := -1
	var derr error
	check(rc.Control(func(s uintptr) { fd, derr = unix.FcntlInt(s, unix.F_DUPFD_CLOEXEC, 0) }))
	check(derr)
	c.Close()
	check(unix.SetNonblock(fd, false))
	unix.SetsockoptInt(fd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
	return fd
}

// sink keeps the fault benchmark's loads from being optimised away.
var sink byte

// The raw protocol: a 24-byte fabric header whose Count says how many pages, followed by
// Count*12 bytes (a read request's shape) of which the first 4 are a page index P; the answer
// is 24+Count*4096 bytes in one write, from page P on of a 64 MiB buffer: the data comes from
// memory as uncached as a slab's random pages, so that the floor differs from fabric only in
// what the transport does. Op 0xEE instead asks for Count MiB streamed back in 1 MiB writes
// (from successive offsets of the buffer), with no header. A request's ID is the spin, in ns,
// the server waits for the next request with (see pollRecv).
const opStream = 0xEE

// rawMem is the raw server's "slab" (in the child), and what its answers must hold (in the parent).
var rawMem []byte

func rawBytes() []byte {
	b := make([]byte, slabPages*fabric.PageSize+fabric.HeaderSize)
	rand.New(rand.NewSource(1)).Read(b)
	return b
}

// mismatch stops the benchmark: a figure over wrong data is no figure.
func mismatch(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "bench-fabric: DATA MISMATCH: "+format+"\n", a...)
	os.Exit(1)
}

// rawCheck compares the raw server's last answer to a read of n pages from p with rawMem.
func (r *rawClient) check(p, n int) {
	a := max(p*fabric.PageSize-fabric.HeaderSize, 0)
	if !bytes.Equal(r.ans[fabric.HeaderSize:fabric.HeaderSize+n*fabric.PageSize], rawMem[a+fabric.HeaderSize:a+fabric.HeaderSize+n*fabric.PageSize]) {
		mismatch("raw loopback read of %d pages from page %d", n, p)
	}
}

func rawServe(fd int) {
	req := make([]byte, fabric.HeaderSize+fabric.MaxPages*fabric.AddrSize)
	off := 0
	var spin time.Duration
	for {
		if !readFull(fd, req[:fabric.HeaderSize], spin) {
			return
		}
		h, err := fabric.ParseHeader(req[:fabric.HeaderSize])
		spin = time.Duration(h.ID)
		if err != nil {
			return
		}
		n := int(h.Count)
		if req[2] == opStream {
			for i := 0; i < n; i++ {
				if !writeFull(fd, rawMem[off:off+1<<20]) {
					return
				}
				off = (off + 1<<20) % (slabPages * fabric.PageSize)
			}
			continue
		}
		if !readFull(fd, req[fabric.HeaderSize:fabric.HeaderSize+int(h.Len)], 0) {
			return
		}
		p := int(binary.LittleEndian.Uint32(req[fabric.HeaderSize:]))
		if p+n > slabPages || n == 0 {
			return
		}
		// The header goes in front of the pages, as one buffer: a single write, like fabric's
		// single writev.
		a := p*fabric.PageSize - fabric.HeaderSize
		if a < 0 {
			a = 0
		}
		if !writeFull(fd, rawMem[a:a+fabric.HeaderSize+n*fabric.PageSize]) {
			return
		}
	}
}

func readFull(fd int, b []byte, spin time.Duration) bool {
	for len(b) > 0 {
		n, err := pollRecv(fd, b, spin)
		if err != nil || n == 0 {
			return false
		}
		b = b[n:]
	}
	return true
}

func writeFull(fd int, b []byte) bool {
	for len(b) > 0 {
		n, err := unix.Write(fd, b)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return false
		}
		b = b[n:]
	}
	return true
}

// rawClient is one raw connection.
type rawClient struct {
	fd   int
	spin time.Duration
	req  []byte
	ans  []byte
	off  int // where the server's next streamed MiB starts in rawMem (it keeps the same count)
	last int // where the last streamed MiB, still in ans, started
}

func dialRaw(addr string, spin time.Duration) *rawClient {
	c, err := net.Dial("tcp", addr)
	check(err)
	return &rawClient{fd: rawFD(c), spin: spin, req: make([]byte, fabric.HeaderSize+fabric.MaxPages*fabric.AddrSize),
		ans: make([]byte, fabric.HeaderSize+fabric.MaxPages*fabric.PageSize)}
}

// read is one request for n pages from page p on, and its answer.
func (r *rawClient) read(p, n int) {
	(&fabric.Header{Op: fabric.OpRead, Count: uint32(n), ID: uint64(r.spin), Len: uint32(n * fabric.AddrSize)}).Put(r.req)
	binary.LittleEndian.PutUint32(r.req[fabric.HeaderSize:], uint32(p))
	if !writeFull(r.fd, r.req[:fabric.HeaderSize+n*fabric.AddrSize]) || !readFull(r.fd, r.ans[:fabric.HeaderSize+n*fabric.PageSize], r.spin) {
		panic("raw echo failed")
	}
}

// stream receives mib MiB streamed by the server; with verify it compares each MiB with rawMem
// (the measured calls leave that to checkLast: comparing 1 MiB costs a good part of receiving it).
func (r *rawClient) stream(mib int, verify bool) {
	(&fabric.Header{Op: fabric.OpRead, Count: uint32(mib)}).Put(r.req)
	r.req[2] = opStream
	if !writeFull(r.fd, r.req[:fabric.HeaderSize]) {
		panic("raw stream failed")
	}
	for i := 0; i < mib; i++ {
		if !readFull(r.fd, r.ans[:1<<20], 0) {
			panic("raw stream failed")
		}
		r.last, r.off = r.off, (r.off+1<<20)%(slabPages*fabric.PageSize)
		if verify {
			r.checkLast()
		}
	}
}

// checkLast compares the last MiB streamed with rawMem.
func (r *rawClient) checkLast() {
	if !bytes.Equal(r.ans[:1<<20], rawMem[r.last:r.last+1<<20]) {
		mismatch("raw loopback stream: the MiB from offset %d", r.last)
	}
}

// pollRecv reads what has arrived into b (at least one byte): with spin set it polls with
// non-blocking receives, yielding the CPU between tries, for up to spin, then blocks; what
// fabric's rawConn.poll does.
func pollRecv(fd int, b []byte, spin time.Duration) (int, error) {
	if spin > 0 {
		start := time.Now()
		for {
			n, _, err := unix.Recvfrom(fd, b, unix.MSG_DONTWAIT)
			if err == nil {
				return n, nil
			}
			if err != unix.EAGAIN && err != unix.EINTR {
				return 0, err
			}
			if time.Since(start) >= spin {
				break
			}
			unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		}
	}
	for {
		n, err := unix.Read(fd, b)
		if err != unix.EINTR {
			return n, err
		}
	}
}

// path is one measured way to move pages, accumulated over rounds.
type path struct {
	name, note string
	pages      int // per call
	f          func(i int)
	check      func(i int) // compares what call i read with what was written (untimed)
	h          latency.Histogram
	roundP50   []time.Duration // each round's p50: how much the rounds differ
	calls      int
	elapsed    time.Duration
	rounds     []round // each round's own figures: the CSV's raw rows
}

// round is one round of one path: its calls' histogram, and their time (the checks excluded).
type round struct {
	h       latency.Snapshot
	calls   int
	elapsed time.Duration
}

// endRound records a round of p: rh holds its calls' durations, elapsed their sum.
func (p *path) endRound(rh *latency.Histogram, calls int, elapsed time.Duration) {
	r := round{calls: calls, elapsed: elapsed}
	rh.Snapshot(&r.h)
	p.rounds = append(p.rounds, r)
	p.roundP50 = append(p.roundP50, rh.Quantile(0.5))
}

// measure runs every path calls times per round, for rounds rounds, the order rotated each
// round so that drift in the machine hits every path alike. Each path is warmed up first.
func measure(paths []*path, rounds, calls int) {
	for _, p := range paths {
		for i := 0; i < max(calls/10, 2); i++ {
			p.f(i)
			if p.check != nil {
				p.check(i)
			}
		}
	}
	for r := 0; r < rounds; r++ {
		for k := range paths {
			p := paths[(k+r)%len(paths)]
			var rh latency.Histogram
			var elapsed time.Duration
			for i := 0; i < calls; i++ {
				t0 := time.Now()
				p.f(p.calls)
				d := time.Since(t0)
				p.h.Record(d)
				rh.Record(d)
				elapsed += d // the calls' time only: the checks are not in it
				if p.check != nil {
					p.check(p.calls)
				}
				p.calls++
			}
			p.elapsed += elapsed
			p.endRound(&rh, calls, elapsed)
		}
	}
}

func (p *path) pagesPerSec() float64 { return float64(p.calls*p.pages) / p.elapsed.Seconds() }
func (p *path) gbPerSec() float64    { return p.pagesPerSec() * fabric.PageSize / 1e9 }

func us(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e3) }

func run() error {
	if *batch < 1 || *batch > fabric.MaxPages {
		return fmt.Errorf("-batch %d: give 1 to %d", *batch, fabric.MaxPages)
	}
	if *rounds < 1 {
		*rounds = 1
	}
	tok := fabric.Token(fmt.Sprintf("bench-token-%d-%d", os.Getpid(), time.Now().UnixNano()))
	dir, err := os.MkdirTemp("", "bench-fabric")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	sock := filepath.Join(dir, "memserver.sock")
	self, err := os.Executable()
	if err != nil {
		return err
	}
	child := exec.Command(self, "-serve", sock, "-spin", spin.String())
	child.Env = append(os.Environ(), tokenEnv+"="+string(tok))
	child.Stderr = os.Stderr
	stdin, err := child.StdinPipe()
	if err != nil {
		return err
	}
	stdout, err := child.StdoutPipe()
	if err != nil {
		return err
	}
	if err := child.Start(); err != nil {
		return err
	}
	defer func() { stdin.Close(); child.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return fmt.Errorf("the server process: %v", err)
	}
	var plainAddr, pollAddr, rawAddr, connAddr, tlsAddr string
	fmt.Sscan(line, &plainAddr, &pollAddr, &rawAddr, &connAddr, &tlsAddr)

	sess := fabric.NewSessionID()
	cfg := fabric.DialConfig{Token: tok, Session: sess, Conns: 1, Timeout: 10 * time.Second}
	tcp, err := fabric.DialTCP(plainAddr, cfg)
	if err != nil {
		return err
	}
	defer tcp.Close()
	shm, err := fabric.DialSHM(sock, cfg)
	if err != nil {
		return err
	}
	defer shm.Close()
	pcfg := cfg
	pcfg.Spin = *spin
	ptcp, err := fabric.DialTCP(pollAddr, pcfg)
	if err != nil {
		return err
	}
	defer ptcp.Close()
	grant := func(t fabric.Transport, slab uint64) *fabric.Grant {
		g := &fabric.Grant{Slab: slab, Session: sess, Server: t.Instance(), Pages: slabPages}
		tok.Sign(g)
		return g
	}
	// Slab 1 is reached over tcp, slab 2 over shm (on the same server), slab 3 over tcp with
	// polling (on the polling server); each written in full first (the memory touched, the
	// mapping populated), from the same random bytes.
	data := make([]byte, fabric.MaxPages*fabric.PageSize)
	rand.New(rand.NewSource(1)).Read(data)
	// want is what page p of every slab holds: written from data, MaxPages at a time; the
	// write paths below write the same bytes back, so it stays so.
	want := func(p uint32) []byte {
		o := int(p%fabric.MaxPages) * fabric.PageSize
		return data[o : o+fabric.PageSize]
	}
	rawMem = rawBytes()
	for _, p := range []struct {
		slab uint64
		t    fabric.Transport
	}{{1, tcp}, {2, shm}, {3, ptcp}} {
		if err := p.t.Create(grant(p.t, p.slab)); err != nil {
			return err
		}
		for first := 0; first < slabPages; first += fabric.MaxPages {
			addrs := make([]fabric.Addr, fabric.MaxPages)
			for i := range addrs {
				addrs[i] = fabric.Addr{Slab: p.slab, Page: uint32(first + i)}
			}
			if err := p.t.Write(addrs, data); err != nil {
				return err
			}
		}
	}
	rng := rand.New(rand.NewSource(2))
	n := max(*singles / *rounds, 1)
	singlePages := make([]uint32, *singles)
	for i := range singlePages {
		singlePages[i] = uint32(rng.Intn(slabPages))
	}
	one := func(slab uint64, i int) []fabric.Addr {
		return []fabric.Addr{{Slab: slab, Page: singlePages[i%len(singlePages)]}}
	}
	const nb = 64 // distinct random batches, reused round-robin
	var batchPages [nb][]uint32
	for i := range batchPages {
		for _, p := range rng.Perm(slabPages)[:*batch] {
			batchPages[i] = append(batchPages[i], uint32(p))
		}
	}
	batchOf := func(slab uint64) [nb][]fabric.Addr {
		var out [nb][]fabric.Addr
		for i, ps := range batchPages {
			for _, p := range ps {
				out[i] = append(out[i], fabric.Addr{Slab: slab, Page: p})
			}
		}
		return out
	}
	b1, b2, b3 := batchOf(1), batchOf(2), batchOf(3)
	local := make([]byte, slabPages*fabric.PageSize) // the memcpy floor's "slab"
	for i := 0; i < slabPages; i += fabric.MaxPages {
		copy(local[i*fabric.PageSize:], data)
	}
	page := make([]byte, fabric.PageSize)
	buf := make([]byte, *batch*fabric.PageSize)
	buf2 := make([]byte, *batch*fabric.PageSize)
	// What a batch's pages hold, in order: what the write paths write (the pages keep their
	// content), and what the reads must find.
	var wbuf [nb][]byte
	for i, ps := range batchPages {
		wbuf[i] = make([]byte, 0, len(ps)*fabric.PageSize)
		for _, p := range ps {
			wbuf[i] = append(wbuf[i], want(p)...)
		}
	}
	checkOne := func(what string) func(int) {
		return func(i int) {
			if p := singlePages[i%len(singlePages)]; !bytes.Equal(page, want(p)) {
				mismatch("%s: page %d", what, p)
			}
		}
	}
	checkBatch := func(what string, b []byte, k int) {
		if !bytes.Equal(b, wbuf[k%nb]) {
			for j, p := range batchPages[k%nb] {
				if !bytes.Equal(b[j*fabric.PageSize:(j+1)*fabric.PageSize], want(p)) {
					mismatch("%s: page %d (the %dth of batch %d)", what, p, j, k%nb)
				}
			}
			mismatch("%s: batch %d", what, k%nb)
		}
	}
	c2 := cfg
	c2.Conns = 2
	tcp2, err := fabric.DialTCP(plainAddr, c2)
	if err != nil {
		return err
	}
	defer tcp2.Close()
	raw, praw := dialRaw(rawAddr, 0), dialRaw(rawAddr, *spin)
	gconn, tconn := dialConn(connAddr, false), dialConn(tlsAddr, true)
	defer gconn.c.Close()
	defer tconn.c.Close()
	tlsNote := "the raw protocol through crypto/tls over a net.Conn (TLS 1.3, " + tlsCipher(tconn) + ")"
	must := check
	ps := spin.String()

	fmt.Fprintf(os.Stderr, "bench-fabric: single-page latency, %d rounds of %d requests per path\n", *rounds, n)
	// The round trips in three placements: as the scheduler likes (unpinned), this process and
	// the servers' on one CPU, and on two different CPUs.
	cpus := allowedCPUs()
	type placement struct {
		name         string
		self, server []int
	}
	places := []placement{{name: ""}}
	if len(cpus) > 1 {
		first, last := cpus[:1], cpus[len(cpus)-1:]
		places = append(places, placement{", same CPU", last, last}, placement{", across CPUs", first, last})
	}
	var lat []*path
	for _, pl := range places {
		rows := []*path{
			{name: "raw loopback tcp ping-pong" + pl.name, note: "36 B request, 4120 B answer (a random page of 64 MiB); one write each way, blocking reads",
				f: func(i int) { raw.read(int(singlePages[i%len(singlePages)]), 1) }, check: func(i int) { raw.check(int(singlePages[i%len(singlePages)]), 1) }},
			{name: "raw loopback tcp ping-pong, polling " + ps + pl.name, note: "the same, each side polling up to " + ps + " before it blocks",
				f: func(i int) { praw.read(int(singlePages[i%len(singlePages)]), 1) }, check: func(i int) { praw.check(int(singlePages[i%len(singlePages)]), 1) }},
			{name: "Go net.Conn ping-pong" + pl.name, note: "the raw protocol through a net.Conn: Go's netpoller parks the reader",
				f: func(i int) { gconn.read(int(singlePages[i%len(singlePages)]), 1) }, check: func(i int) { gconn.check(int(singlePages[i%len(singlePages)]), 1) }},
			{name: "TLS ping-pong" + pl.name, note: tlsNote,
				f: func(i int) { tconn.read(int(singlePages[i%len(singlePages)]), 1) }, check: func(i int) { tconn.check(int(singlePages[i%len(singlePages)]), 1) }},
			{name: "fabric tcp Read" + pl.name, note: "1 page, blocking (Spin 0)", f: func(i int) { must(tcp.Read(one(1, i), page)) }, check: checkOne("fabric tcp Read")},
			{name: "fabric tcp Read, polling " + ps + pl.name, note: "1 page; DialConfig.Spin and ServerConfig.Spin " + ps, f: func(i int) { must(ptcp.Read(one(3, i), page)) },
				check: checkOne("fabric tcp Read, polling")},
		}
		if pl.name == "" {
			rows = append(rows, &path{name: "memcpy 4 KiB", note: "a random page of a 64 MiB buffer", f: func(i int) {
				p := int(singlePages[i%len(singlePages)]) * fabric.PageSize
				copy(page, local[p:p+fabric.PageSize])
			}, check: checkOne("memcpy")}, &path{name: "fabric shm Read", note: "1 page", f: func(i int) { must(shm.Read(one(2, i), page)) }, check: checkOne("fabric shm Read")})
		}
		check(pinProcess(os.Getpid(), pl.self))
		check(pinProcess(child.Process.Pid, pl.server))
		measure(rows, *rounds, n)
		lat = append(lat, rows...)
	}
	check(pinProcess(os.Getpid(), nil))
	check(pinProcess(child.Process.Pid, nil))

	bn := max(*batches / *rounds, 1)
	mib := max(bn**batch/256, 1)
	fmt.Fprintf(os.Stderr, "bench-fabric: throughput, %d rounds of %d requests of %d pages per path\n", *rounds, bn, *batch)
	thr := []*path{
		{name: "raw loopback tcp ping-pong", pages: *batch, note: fmt.Sprintf("%d B request, %d B answer (a random 1 MiB of 64 MiB), blocking", fabric.HeaderSize+*batch*fabric.AddrSize, fabric.HeaderSize+*batch*fabric.PageSize),
			f: func(i int) { raw.read(int(batchPages[i%nb][0])%(slabPages-*batch), *batch) }, check: func(i int) { raw.check(int(batchPages[i%nb][0])%(slabPages-*batch), *batch) }},
		{name: "Go net.Conn ping-pong", pages: *batch, note: "the same through a net.Conn",
			f: func(i int) { gconn.read(int(batchPages[i%nb][0])%(slabPages-*batch), *batch) }, check: func(i int) { gconn.check(int(batchPages[i%nb][0])%(slabPages-*batch), *batch) }},
		{name: "TLS ping-pong", pages: *batch, note: "the same through crypto/tls (TLS 1.3, " + tlsCipher(tconn) + ")",
			f: func(i int) { tconn.read(int(batchPages[i%nb][0])%(slabPages-*batch), *batch) }, check: func(i int) { tconn.check(int(batchPages[i%nb][0])%(slabPages-*batch), *batch) }},
		{name: "raw loopback tcp stream", pages: mib * 256, note: fmt.Sprintf("one way, %d MiB per call in 1 MiB writes, no requests", mib), f: func(int) { raw.stream(mib, false) },
			check: func(int) { raw.checkLast() }},
		{name: "fabric tcp Read", pages: *batch, note: "random pages, blocking", f: func(i int) { must(tcp.Read(b1[i%nb], buf)) }, check: func(i int) { checkBatch("fabric tcp Read", buf, i) }},
		{name: "fabric tcp Read, 2 in flight", pages: 2 * *batch, note: "random pages, blocking; two goroutines on two connections, one request each per call",
			f: func(i int) {
				done := make(chan error, 1)
				go func() { done <- tcp2.Read(b1[(i+1)%nb], buf2) }()
				must(tcp2.Read(b1[i%nb], buf))
				must(<-done)
			}, check: func(i int) {
				checkBatch("fabric tcp Read, 2 in flight", buf, i)
				checkBatch("fabric tcp Read, 2 in flight", buf2, i+1)
			}},
		{name: "fabric tcp Write", pages: *batch, note: "random pages, blocking", f: func(i int) { must(tcp.Write(b1[i%nb], wbuf[i%nb])) }},
		{name: "fabric tcp Read, polling " + ps, pages: *batch, note: "random pages", f: func(i int) { must(ptcp.Read(b3[i%nb], buf)) },
			check: func(i int) { checkBatch("fabric tcp Read, polling", buf, i) }},
		{name: "memcpy", pages: *batch, note: "random pages of a 64 MiB buffer", f: func(i int) {
			for j, p := range batchPages[i%nb] {
				o := int(p) * fabric.PageSize
				copy(buf[j*fabric.PageSize:(j+1)*fabric.PageSize], local[o:o+fabric.PageSize])
			}
		}, check: func(i int) { checkBatch("memcpy", buf, i) }},
		{name: "fabric shm Read", pages: *batch, note: "random pages", f: func(i int) { must(shm.Read(b2[i%nb], buf)) }, check: func(i int) { checkBatch("fabric shm Read", buf, i) }},
		{name: "fabric shm Write", pages: *batch, note: "random pages", f: func(i int) { must(shm.Write(b2[i%nb], wbuf[i%nb])) }},
	}
	raw.stream(min(mib, 64), true) // every byte of a stream, untimed: the measured calls check their last MiB
	// The stream moves as much as all the other paths' requests together: one call per round.
	measure(thr[:3], *rounds, bn)
	measure(thr[3:4], *rounds, 1)
	measure(thr[4:], *rounds, bn)
	// The writes above wrote each page's own content back: every page of every slab must
	// still hold it, read over the transport that wrote it.
	for _, sl := range []struct {
		slab uint64
		t    fabric.Transport
		name string
	}{{1, tcp, "tcp"}, {2, shm, "shm"}, {3, ptcp, "tcp, polling"}} {
		for first := 0; first < slabPages; first += fabric.MaxPages {
			addrs := make([]fabric.Addr, fabric.MaxPages)
			for i := range addrs {
				addrs[i] = fabric.Addr{Slab: sl.slab, Page: uint32(first + i)}
			}
			got := make([]byte, fabric.MaxPages*fabric.PageSize)
			must(sl.t.Read(addrs, got))
			if !bytes.Equal(got, data) {
				mismatch("slab %d over %s, after the writes: pages %d-%d", sl.slab, sl.name, first, first+fabric.MaxPages-1)
			}
		}
	}

	var flt []*path
	if *faults > 0 {
		fmt.Fprintf(os.Stderr, "bench-fabric: fault service, %d rounds of %d faults per path\n", *rounds, max(*faults / *rounds, 1))
		fl, err := faultBench(max(*faults / *rounds, 1), *rounds, map[string]fabric.Transport{"tcp": tcp, "shm": shm, "ptcp": ptcp}, local, want, ps,
			func(cpus []int) { check(pinProcess(child.Process.Pid, cpus)) })
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench-fabric: fault service not measured: %v\n", err)
		}
		flt = fl
	}
	return report(lat, thr, flt, ps)
}

func report(lat, thr, flt []*path, ps string) error {
	var b strings.Builder
	var uname unix.Utsname
	unix.Uname(&uname)
	idle, _ := os.ReadFile("/sys/devices/system/cpu/cpuidle/current_driver")
	if ns, err := os.ReadFile("/sys/module/haltpoll/parameters/guest_halt_poll_ns"); err == nil {
		idle = append(bytes.TrimSpace(idle), []byte(", guest_halt_poll_ns "+strings.TrimSpace(string(ns)))...)
	}
	fmt.Fprintf(&b, "# fabric transports vs raw floors\n\n")
	fmt.Fprintf(&b, "Made by `make bench-fabric`, which ran `%s`, at commit %s on %s: Linux %s, %d CPUs (cpuidle %s), %s.\n\n",
		strings.Join(append([]string{"bin/bench-fabric"}, os.Args[1:]...), " "), cmp.Or(*commit, "(not given)"), time.Now().UTC().Format("2006-01-02 15:04 MST"),
		unix.ByteSliceToString(uname.Release[:]), runtime.NumCPU(), strings.TrimSpace(string(idle)), runtime.Version())
	fmt.Fprintf(&b, "The memory servers and the raw echo server run in a child process; one request in flight unless a row says otherwise; "+
		"every path measured in %d interleaved rounds (order rotated), histograms merged. The round trips are measured unpinned (where the scheduler puts "+
		"the threads), with this process and the servers' on one CPU, and on two CPUs. \"polling %s\" is fabric's Spin (DialConfig and ServerConfig): a wait for "+
		"the peer polls with non-blocking receives, yielding the CPU between tries, for up to %s before it sleeps; "+
		"the raw floor is measured both ways. What sleeps depends on how busy the machine is: a vCPU with nothing "+
		"to run halts (no halt-polling when guest_halt_poll_ns is 0), and waking it costs tens of microseconds, so "+
		"the sleeping figures are worse on an idle machine than under load; \"rounds' p50\" shows the spread. "+
		"Every page read was compared with what was written there, after each timed call (the raw stream: each call's last MiB, and every byte of an untimed call), "+
		"every page a fault installed too, and every slab read back whole after the writes; a mismatch stops the benchmark. "+
		"The raw rows are in [%s](%s): each path's every round, its calls' time and histogram (log-linear buckets, within 12.5 %%), "+
		"from which every figure here is computed again.\n\n", *rounds, ps, ps, filepath.Base(csvPath(*out)), filepath.Base(csvPath(*out)))

	fmt.Fprintf(&b, "## 4 KiB read latency\n\n| path | p50 µs | p99 µs | mean µs | rounds' p50 µs | note |\n|---|---:|---:|---:|---|---|\n")
	for _, r := range lat {
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.name, us(r.h.Quantile(0.5)), us(r.h.Quantile(0.99)), us(r.h.Mean()), spread(r.roundP50), r.note)
	}
	fmt.Fprintf(&b, "\n## Batched throughput (%d pages per request)\n\n| path | pages/s | GB/s | request p50 µs | p99 µs | note |\n|---|---:|---:|---:|---:|---|\n", *batch)
	for _, r := range thr {
		fmt.Fprintf(&b, "| %s | %.0f | %.2f | %s | %s | %s |\n", r.name, r.pagesPerSec(), r.gbPerSec(), us(r.h.Quantile(0.5)), us(r.h.Quantile(0.99)), r.note)
	}
	if len(flt) > 0 {
		fmt.Fprintf(&b, "\n## Fault service (userfaultfd; handler and faulting thread pinned to one CPU, as farmem's fetcher places them)\n\n"+
			"A read fault on an absent page of a registered anonymous region, timed by the faulting thread.\n\n"+
			"| fault served by | p50 µs | p99 µs | mean µs | rounds' p50 µs |\n|---|---:|---:|---:|---|\n")
		for _, r := range flt {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", r.name, us(r.h.Quantile(0.5)), us(r.h.Quantile(0.99)), us(r.h.Mean()), spread(r.roundP50))
		}
	}

	byName := func(rows []*path, name string) *path {
		for _, r := range rows {
			if r.name == name {
				return r
			}
		}
		return &path{elapsed: 1}
	}
	suffixes := []string{""}
	if len(allowedCPUs()) > 1 {
		suffixes = append(suffixes, ", same CPU", ", across CPUs")
	}
	fmt.Fprintf(&b, "\n## Against the targets (issue 3)\n\nUnpinned figures depend on where the scheduler put the threads in each round "+
		"(see rounds' p50); the pinned placements compare like with like.\n\n| target | measured | ratio | met |\n|---|---|---:|---|\n")
	for _, pl := range suffixes {
		for _, v := range []string{"", ", polling " + ps} {
			t, r := byName(lat, "fabric tcp Read"+v+pl).h.Quantile(0.5), byName(lat, "raw loopback tcp ping-pong"+v+pl).h.Quantile(0.5)
			ratio := float64(t) / float64(r)
			how, where := cmp.Or(strings.TrimPrefix(v, ", "), "blocking"), cmp.Or(strings.TrimPrefix(pl, ", "), "unpinned")
			fmt.Fprintf(&b, "| tcp 4 KiB read within 1.3x of the raw loopback round trip (%s, %s) | %s vs %s µs (p50) | %.2fx | %s |\n",
				how, where, us(t), us(r), ratio, yes(ratio <= 1.3))
		}
	}
	for _, t := range []string{"fabric tcp Read", "fabric tcp Read, 2 in flight"} {
		tr := byName(thr, t).gbPerSec()
		for _, floor := range []string{"raw loopback tcp ping-pong", "raw loopback tcp stream"} {
			f := byName(thr, floor).gbPerSec()
			fmt.Fprintf(&b, "| batched tcp reads (%s) >= 70%% of the raw %s bandwidth | %.2f vs %.2f GB/s | %.0f%% | %s |\n",
				cmp.Or(strings.TrimPrefix(strings.TrimPrefix(t, "fabric tcp Read"), ", "), "1 in flight"), strings.TrimPrefix(floor, "raw loopback tcp "), tr, f, 100*tr/f, yes(tr >= 0.7*f))
		}
	}
	if len(flt) > 0 {
		z, s := byName(flt, "zero-fill (UFFDIO_ZEROPAGE)").h.Quantile(0.5), byName(flt, "shm Read + UFFDIO_COPY").h.Quantile(0.5)
		r := float64(s) / float64(z)
		fmt.Fprintf(&b, "| shm fault service within 1.5x of a zero-fill fault (ZEROPAGE, farmem's read first touch) | %s vs %s µs (p50) | %.2fx | %s |\n", us(s), us(z), r, yes(r <= 1.5))
		z = byName(flt, "zero-fill by UFFDIO_COPY of zeros (a write fault's first touch)").h.Quantile(0.5)
		r = float64(s) / float64(z)
		fmt.Fprintf(&b, "| shm fault service within 1.5x of a zero-fill fault (COPY of zeros, farmem's write first touch) | %s vs %s µs (p50) | %.2fx | %s |\n", us(s), us(z), r, yes(r <= 1.5))
	}
	fmt.Fprintf(&b, "\n## TLS on the page path\n\nfabric's tcp data path is blocking syscalls on a raw descriptor; crypto/tls needs a net.Conn, so a TLS page path "+
		"would pay Go's netpoller (the reader parked and woken) and the record layer. Each against the raw floor of the same shape, same run (p50s; batched: pages/s):\n\n"+
		"| placement | raw µs | net.Conn µs | TLS µs | TLS / raw | TLS / net.Conn |\n|---|---:|---:|---:|---:|---:|\n")
	for _, pl := range suffixes {
		r, g, t := byName(lat, "raw loopback tcp ping-pong"+pl).h.Quantile(0.5), byName(lat, "Go net.Conn ping-pong"+pl).h.Quantile(0.5), byName(lat, "TLS ping-pong"+pl).h.Quantile(0.5)
		fmt.Fprintf(&b, "| 4 KiB read, %s | %s | %s | %s | %.2fx | %.2fx |\n", cmp.Or(strings.TrimPrefix(pl, ", "), "unpinned"), us(r), us(g), us(t), float64(t)/float64(r), float64(t)/float64(g))
	}
	{
		r, g, t := byName(thr, "raw loopback tcp ping-pong").pagesPerSec(), byName(thr, "Go net.Conn ping-pong").pagesPerSec(), byName(thr, "TLS ping-pong").pagesPerSec()
		fmt.Fprintf(&b, "| %d pages a request, pages/s | %.0f | %.0f | %.0f | %.2fx | %.2fx |\n", *batch, r, g, t, t/r, t/g)
	}
	fmt.Fprintf(&b, "\nFor scale, docs/DESIGN.md, \"Latency\" (measured with C probes): kernel first-touch fault 0.5-1.2 µs; uffd round trip, "+
		"handler on the faulting CPU 3.9 µs p50; ZEROPAGE-served fault 2.8 µs end to end; pipe ping-pong across CPUs 76 µs.\n")
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	os.Stdout.WriteString(b.String())
	// make bench-ctrl keeps a section of its own at the end of this file, between markers
	// (workloads/bench/ctrl): carry it over.
	if old, err := os.ReadFile(*out); err == nil {
		if i := bytes.Index(old, []byte("<!-- bench-ctrl:")); i >= 0 {
			b.WriteString("\n")
			b.Write(old[i:])
		}
	}
	if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
		return err
	}
	return writeCSV(csvPath(*out), map[string][]*path{"latency": lat, "throughput": thr, "fault": flt})
}

// allowedCPUs lists the CPUs this process may run on, as it started.
func allowedCPUs() []int { return startCPUs }

var startCPUs = func() []int {
	var set unix.CPUSet
	check(unix.SchedGetaffinity(0, &set))
	var out []int
	for i := 0; i < 1024; i++ {
		if set.IsSet(i) {
			out = append(out, i)
		}
	}
	return out
}()

// pinProcess sets the CPUs of every thread of process pid (the threads it starts later inherit
// them); cpus nil: all of allowedCPUs.
func pinProcess(pid int, cpus []int) error {
	if cpus == nil {
		cpus = allowedCPUs()
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return err
	}
	for _, t := range tasks {
		var tid int
		fmt.Sscan(t.Name(), &tid)
		if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
			return err
		}
	}
	return nil
}

// spread is the smallest and largest of the rounds' figures.
func spread(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	lo, hi := ds[0], ds[0]
	for _, d := range ds {
		lo, hi = min(lo, d), max(hi, d)
	}
	return us(lo) + "-" + us(hi)
}

func yes(ok bool) string {
	if ok {
		return "yes"
	}
	return "**no**"
}

// faultBench measures userfaultfd fault service: a thread touches pages of a registered
// anonymous region, another serves each fault, both on one CPU (as farmem's fetcher places its
// fault thread on the faulting thread's CPU). Served by zero-fill, by a copy of a local page
// (what the embedded store does), and by a page fetched over shm and over tcp (blocking and
// polling).
func faultBench(n, rounds int, tr map[string]fabric.Transport, local []byte, want func(uint32) []byte, ps string, pinServer func([]int)) ([]*path, error) {
	const region = slabPages * fabric.PageSize
	fd, err := uffd.Open(0) // kept open to the end: its handler thread blocks on it
	if err != nil {
		return nil, err
	}
	if _, _, err := uffd.API(fd, 0); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(-1, 0, region, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, err
	}
	// Warm the guest memory the faults will be given (first use of cold guest memory costs
	// ~10 µs a page here), then give it back: the free pages are reused by the faults.
	for i := 0; i < region; i += fabric.PageSize {
		mem[i] = 1
	}
	unix.Madvise(mem, unix.MADV_DONTNEED)
	base := uint64(uintptr(unsafe.Pointer(&mem[0])))
	if _, err := uffd.Register(fd, base, region, uffd.ModeMissing); err != nil {
		return nil, err
	}
	cpus := allowedCPUs()
	one := cpus[len(cpus)-1] // the fault's CPU: the last allowed
	pin := func() {
		runtime.LockOSThread()
		var s unix.CPUSet
		s.Set(one)
		unix.SchedSetaffinity(0, &s)
	}

	fetch := func(t fabric.Transport, slab uint64) func(uint64, []byte) error {
		return func(addr uint64, buf []byte) error {
			if err := t.Read([]fabric.Addr{{Slab: slab, Page: uint32((addr - base) / fabric.PageSize)}}, buf); err != nil {
				return err
			}
			_, err := uffd.Copy(fd, addr, unsafe.Pointer(&buf[0]), fabric.PageSize, 0)
			return err
		}
	}
	zeros := make([]byte, fabric.PageSize)
	type mode struct {
		name   string
		serve  func(addr uint64, buf []byte) error
		server []int // the servers' CPUs while this mode runs (nil: all)
		zero   bool  // the page it installs is zeros (else the page's content, want)
	}
	modes := []mode{
		{name: "zero-fill (UFFDIO_ZEROPAGE)", zero: true, serve: func(addr uint64, _ []byte) error {
			_, err := uffd.ZeroPage(fd, addr, fabric.PageSize, 0)
			return err
		}},
		{name: "zero-fill by UFFDIO_COPY of zeros (a write fault's first touch)", zero: true, serve: func(addr uint64, _ []byte) error {
			_, err := uffd.Copy(fd, addr, unsafe.Pointer(&zeros[0]), fabric.PageSize, 0)
			return err
		}},
		{name: "local memcpy + UFFDIO_COPY (embedded store)", serve: func(addr uint64, buf []byte) error {
			p := int(addr-base) / fabric.PageSize * fabric.PageSize
			copy(buf, local[p:p+fabric.PageSize])
			_, err := uffd.Copy(fd, addr, unsafe.Pointer(&buf[0]), fabric.PageSize, 0)
			return err
		}},
		{name: "shm Read + UFFDIO_COPY", serve: fetch(tr["shm"], 2)},
	}
	other := -1 // a CPU other than the fault's
	for _, c := range allowedCPUs() {
		if c != one {
			other = c
		}
	}
	for _, t := range []struct{ name, key string }{{"tcp Read", "tcp"}, {"tcp Read, polling " + ps + ",", "ptcp"}} {
		slab := uint64(1)
		if t.key == "ptcp" {
			slab = 3
		}
		modes = append(modes, mode{name: t.name + " + UFFDIO_COPY", serve: fetch(tr[t.key], slab)})
		if other >= 0 {
			modes = append(modes,
				mode{name: t.name + " + UFFDIO_COPY, server on the fault's CPU", serve: fetch(tr[t.key], slab), server: []int{one}},
				mode{name: t.name + " + UFFDIO_COPY, server on another CPU", serve: fetch(tr[t.key], slab), server: []int{other}})
		}
	}
	// One handler thread serves every fault with the current mode; it lives until the process
	// ends (a thread blocked reading a uffd is not worth waking).
	var cur atomic.Pointer[mode]
	herr := make(chan error, 1)
	go func() {
		pin()
		msgs := make([]uffd.Msg, 1)
		buf := make([]byte, fabric.PageSize)
		for {
			k, err := uffd.ReadMsgs(fd, msgs)
			if err == unix.EINTR {
				continue
			}
			if err != nil || k != 1 {
				herr <- fmt.Errorf("reading faults: %v", err)
				return
			}
			_, addr, _ := msgs[0].Pagefault()
			addr &^= fabric.PageSize - 1
			err = cur.Load().serve(addr, buf)
			if errors.Is(err, unix.EEXIST) { // already there (a fault raised twice): wake it
				err = uffd.Wake(fd, addr, fabric.PageSize)
			}
			if err != nil {
				herr <- fmt.Errorf("%s: %v", cur.Load().name, err)
				return
			}
		}
	}()
	rows := make([]*path, len(modes))
	for i, m := range modes {
		rows[i] = &path{name: m.name}
	}
	order := rand.New(rand.NewSource(3)).Perm(slabPages)
	next := 0 // index into order; every page is faulted once before any twice
	for r := 0; r < rounds; r++ {
		for k := range modes {
			i := (k + r) % len(modes)
			cur.Store(&modes[i])
			pinServer(modes[i].server)
			h := &rows[i].h
			var rh latency.Histogram
			done := make(chan struct{})
			go func() { // the faulting thread
				pin()
				defer runtime.UnlockOSThread()
				defer close(done)
				for j := 0; j < n+n/10; j++ {
					if next == slabPages {
						unix.Madvise(mem, unix.MADV_DONTNEED) // absent again: they fault again
						next = 0
					}
					pg := order[next]
					p := unsafe.Pointer(&mem[pg*fabric.PageSize])
					next++
					t0 := time.Now()
					sink += *(*byte)(p)
					d := time.Since(t0)
					if j >= n/10 {
						h.Record(d)
						rh.Record(d)
					}
					// The page the fault installed, untimed: zeros, or the page's content.
					w := zeros
					if !modes[i].zero {
						w = want(uint32(pg))
					}
					if !bytes.Equal(mem[pg*fabric.PageSize:(pg+1)*fabric.PageSize], w) {
						mismatch("a fault served by %s installed the wrong bytes at page %d", modes[i].name, pg)
					}
				}
			}()
			select {
			case <-done:
			case err := <-herr:
				return nil, err // the faulting thread stays blocked; the process is about to end
			}
			rows[i].endRound(&rh, int(rh.Count()), rh.Sum())
		}
	}
	pinServer(nil)
	return rows, nil
}
