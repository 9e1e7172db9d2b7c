// Package launcher starts a program under farmem: it writes out the embedded preload shim,
// listens for the shim's connections, starts the program with LD_PRELOAD (or, a statically
// linked one, with the agent injected: static.go), serves it through a runtime.Runtime,
// forwards signals, and returns the program's exit status.
package launcher

import (
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/faulttrace"
	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/latency"
	"github.com/farmem/farmem/prefetch"
	"github.com/farmem/farmem/runtime"
)

//go:embed shim/libfarmem.so
var shimSO []byte

// Options configure one run.
type Options struct {
	LocalMem int64    // cap in bytes
	Argv     []string // program and its arguments
	Backend  backend.Backend
	Quiet    bool
	// Prefetch chooses each process's prefetcher (its Name "none": no prefetching).
	Prefetch prefetch.Config
	// EvictHeat is the page tables' MaxHeat (0: FIFO).
	EvictHeat uint8
	// LastStayGuess is the page tables' LastStayGuess (--write-guess last).
	LastStayGuess bool
	// FaultsInProgram is runtime.Config's (--serve-faults program).
	FaultsInProgram bool
	// PrefetchCachePages > 0 puts the prefetcher in cache mode with a cache of that many pages;
	// 0 is map mode.
	PrefetchCachePages int
	// Trace, if set, records every served fault. Run stops writing to it before it returns;
	// the caller closes it.
	Trace *faulttrace.Writer
	// Tracing and EvictTrace, if set, trace the run's faults and eviction batches
	// (runtime.Config).
	Tracing    *fetcher.Tracing
	EvictTrace func(*evictor.BatchRecord)
	// Observe, if set, is called with the runtime before the program starts (the metrics read
	// its counters).
	Observe func(rt *runtime.Runtime)
	// StatsEvery > 0 prints one line of live figures on stderr at that interval.
	StatsEvery time.Duration
	// LatencyOut, if set, gets the run's latency histograms at exit (WriteLatency), whatever
	// Quiet says.
	LatencyOut string
	// SummaryJSON, if set, gets the whole summary at exit as one JSON object (Summary), whatever
	// Quiet says, and also when the program was stopped.
	SummaryJSON string
	// Static: the program is statically linked; farmem injects its agent (static.go) instead of
	// preloading the shim.
	Static bool
	// NoPreload: LD_PRELOAD is not set for the program, which must then be Static (a dynamic
	// program entered by injection: a shim it loaded too would make a second uffd and hello).
	// Images it exec's that do not load the shim are entered as any run's are (execed.go).
	NoPreload bool
}

// Run runs the program to completion and returns the exit status farmem should exit with.
func Run(o Options) (int, error) {
	dir, err := os.MkdirTemp("", "farmem-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	// Readable by anyone: a process of the run that switched users loads the shim too (asuser.go).
	if err := os.Chmod(dir, 0o755); err != nil {
		return 0, err
	}
	shim := filepath.Join(dir, "libfarmem.so")
	if err := os.WriteFile(shim, shimSO, 0o555); err != nil {
		return 0, fmt.Errorf("writing the preload shim: %w", err)
	}
	ln, sock, err := listen()
	if err != nil {
		return 0, err
	}
	defer ln.Close()

	img, err := readAgent(agentELF)
	if err != nil {
		return 0, err
	}
	// The program's parent thread (tracer.go): a static program's, and, for every program, the
	// one thread that may trace it when it exec's an image farmem must enter (execed.go).
	parent := newParentThread()
	images := &imageServer{img: img, sock: sock, shim: shim, parent: parent, known: make(chan struct{})}
	say := &announcer{o: o}
	rt, err := newRuntime(o, say, false, images)
	if err != nil {
		signal.Stop(parent.sigs)
		return 0, err
	}
	if o.Observe != nil {
		o.Observe(rt)
	}
	if rt.Armed() {
		say.armed(0)
	}
	agents := &staticAgents{rt: rt}
	images.rt, images.agents = rt, agents
	rt.Start()
	defer rt.Close()
	defer serve(rt, o, ln, agents)()

	cmd := exec.Command(o.Argv[0], o.Argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	pre := shim
	if old := os.Getenv("LD_PRELOAD"); old != "" {
		pre = shim + ":" + old
	}
	cmd.Env = append(os.Environ(), "LD_PRELOAD="+pre, "FARMEM_SOCK="+sock)
	if o.NoPreload {
		cmd.Env = append(os.Environ(), "FARMEM_SOCK="+sock)
	}
	// If farmem dies, the program dies with it: nobody could serve its evicted pages.
	// Pdeathsig fires when the *thread* that forked exits, so fork from a thread that lives
	// as long as farmem: this goroutine keeps it locked and never unlocks.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	tty := foregroundTerminal()
	if tty != nil {
		defer tty.close()
	}
	tty.attr(cmd.SysProcAttr) // see terminal.go
	lifeline := -1            // a static program's (static.go); written before started is sent
	defer func() {
		if lifeline >= 0 {
			unix.Close(lifeline)
		}
	}()
	started := make(chan error, 1)
	type result struct {
		ws  unix.WaitStatus
		err error
	}
	waited := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		// Born in a memory cgroup whose threshold says when to arm, the program costs the
		// runtime no polling until then; where there is none, the runtime polls instead.
		contained, _ := rt.ContainChildren(cmd.SysProcAttr)
		var err error
		if o.Static {
			lifeline, err = startStatic(cmd, rt, sock, agents, parent, contained)
		} else {
			err = cmd.Start()
			contained()
		}
		if err != nil {
			signal.Stop(parent.sigs)
			images.started(0)
			started <- err
			return
		}
		images.started(cmd.Process.Pid)
		started <- nil
		ws, err := parent.serve(tty, cmd.Process.Pid)
		waited <- result{ws, err}
		select {} // keep the locked thread (and so Pdeathsig) alive until farmem exits
	}()
	if err := <-started; err != nil {
		return 0, fmt.Errorf("starting %s: %w", o.Argv[0], err)
	}

	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(sigs)
	var end result
wait:
	for {
		select {
		case s := <-sigs:
			cmd.Process.Signal(s)
		case end = <-waited:
			break wait
		}
	}
	cmd.Process.Release() // reaped by tty.wait
	// Fork children (redis's BGSAVE, daemons) still depend on us for their evicted pages.
	for rt.Live() > 0 {
		select {
		case s := <-sigs:
			signalAll(rt, s)
		case <-time.After(20 * time.Millisecond):
		}
	}
	status := exitStatus(end.ws, end.err)
	sum := summarize(rt, o, status)
	if o.SummaryJSON != "" {
		if err := writeSummary(o.SummaryJSON, sum); err != nil {
			fmt.Fprintf(os.Stderr, "farmem: --summary-json: %v\n", err)
		}
	}
	if f := rt.Failure(); f != nil {
		return status, fmt.Errorf("the program was stopped: %w", f)
	}
	say.summary(sum)
	if o.LatencyOut != "" {
		if err := writeLatency(rt, o.LatencyOut); err != nil {
			fmt.Fprintf(os.Stderr, "farmem: --latency-out: %v\n", err)
		}
	}
	return status, nil
}

// listen listens on an abstract unix SOCK_SEQPACKET socket with a random name, for the shim's
// and the agents' connections, and returns it with its name ('@': abstract).
func listen() (*net.UnixListener, string, error) {
	var rnd [8]byte
	rand.Read(rnd[:])
	sock := fmt.Sprintf("@farmem-%d-%s", os.Getpid(), hex.EncodeToString(rnd[:]))
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: sock, Net: "unixpacket"})
	if err != nil {
		return nil, "", fmt.Errorf("listening for the shim: %w", err)
	}
	return ln, sock, nil
}

// serve starts what every run and attachment has beside its runtime: the shims' and agents'
// connections, the periodic stats, and a stop of every process as soon as the store says it
// lost pages (memory servers), not when a process next touches one. The function it returns
// ends the stats.
func serve(rt *runtime.Runtime, o Options, ln *net.UnixListener, agents *staticAgents) (stop func()) {
	go acceptLoop(ln, rt, agents)
	done := make(chan struct{})
	if o.StatsEvery > 0 {
		go statsLoop(rt, o.StatsEvery, done)
	}
	if l, ok := o.Backend.(interface{ Lost() <-chan error }); ok {
		go func() {
			if err, ok := <-l.Lost(); ok {
				rt.Fail(err)
			}
		}()
	}
	return func() { close(done) }
}

// newRuntime makes the runtime of a run or an attach from its options (noFilter:
// runtime.Config.NoFilter; images: runtime.Config.Images, nil for none).
func newRuntime(o Options, say *announcer, noFilter bool, images runtime.ImageServer) (*runtime.Runtime, error) {
	cfg := runtime.Config{CapPages: o.LocalMem / runtime.PageSize, Backend: o.Backend, MaxHeat: o.EvictHeat, LastStayGuess: o.LastStayGuess, FaultsInProgram: o.FaultsInProgram,
		Record: o.Trace, Tracing: o.Tracing, EvictTrace: o.EvictTrace, NoFilter: noFilter, Images: images,
		// Said from a goroutine of its own: stderr may be slow to take it, and the RSS poll
		// that armed the run must not wait on it.
		OnArm: func(b int64) { go say.armed(b) }}
	if s, ok := images.(*imageServer); ok {
		cfg.RawForks = s.rawFork // rawfork.go
	}
	if o.Prefetch.WithDefaults().Name != prefetch.NameNone {
		if err := o.Prefetch.Validate(); err != nil {
			return nil, err
		}
		cfg.NewPrefetcher = func() prefetch.Prefetcher {
			p, _ := prefetch.New(o.Prefetch) // validated above
			return p
		}
		cfg.PrefetchCachePages = o.PrefetchCachePages
	}
	return runtime.New(cfg)
}

// writeLatency writes every fault-service and eviction-batch latency farmem measured, as CSV:
// one line per histogram bucket that holds any (what,lower_ns,upper_ns,count), "what" being the
// fault's source (zero, backend, wp, cache) or eviction-batch. Buckets are log-linear, 8 to a
// power of two, so a CDF drawn from them is within 12.5 % in time.
func writeLatency(rt *runtime.Runtime, path string) error {
	var b strings.Builder
	b.WriteString("what,lower_ns,upper_ns,count\n")
	var snap latency.Snapshot
	put := func(what string, h *latency.Histogram) {
		h.Snapshot(&snap)
		snap.Buckets(func(lo, hi time.Duration, n uint64) {
			fmt.Fprintf(&b, "%s,%d,%d,%d\n", what, lo.Nanoseconds(), hi.Nanoseconds(), n)
		})
	}
	for src := fetcher.Source(0); src < fetcher.NumSources; src++ {
		put(src.String(), &rt.Stats.Latency[src])
	}
	for h := fetcher.Held(0); h < fetcher.NumHeld; h++ {
		put("held-"+h.String(), &rt.Stats.Held[h])
	}
	put("eviction-batch", &rt.Evictor().Stats.Batch)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// exitStatus is the status farmem exits with for a program that ended as ws: its own, or 128+N
// if signal N killed it.
func exitStatus(ws unix.WaitStatus, err error) int {
	switch {
	case err != nil:
		return 1
	case ws.Signaled():
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// announcer says on stderr, once, when the run arms, unless the run is quiet; nothing once the
// summary is out (an arming at the program's very end comes too late to say).
type announcer struct {
	o    Options
	mu   sync.Mutex
	done bool
}

// armed says the run armed with the programs holding anonBytes (0: from the start).
func (a *announcer) armed(anonBytes int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.o.Quiet || a.done {
		return
	}
	name, store := filepath.Base(a.o.Argv[0]), "the embedded store"
	if _, ok := a.o.Backend.(interface{ Lost() <-chan error }); ok {
		store = "the memory servers" // only they can lose pages
	}
	if anonBytes == 0 {
		fmt.Fprintf(os.Stderr, "farmem: armed from the start: %s's pages beyond its %s cap go to %s\n", name, size(a.o.LocalMem), store)
		return
	}
	fmt.Fprintf(os.Stderr, "farmem: armed at %s of %s's memory (cap %s): pages beyond the cap now go to %s\n",
		size(anonBytes), name, size(a.o.LocalMem), store)
}

// summary prints the summary, after which nothing more is announced.
func (a *announcer) summary(s *Summary) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.done = true
	if !a.o.Quiet {
		printSummary(os.Stderr, s)
	}
}

// statsLoop prints one line per interval on stderr (--stats): faults/s by source with the
// interval's p99, evictions/s (written and dropped clean), resident pages against the cap.
func statsLoop(rt *runtime.Runtime, every time.Duration, stop <-chan struct{}) {
	var prev, cur [fetcher.NumSources]latency.Snapshot
	for src := range prev {
		rt.Stats.Latency[src].Snapshot(&prev[src])
	}
	e := &rt.Evictor().Stats
	lastW, lastD, last := e.Written.Load(), e.Dropped.Load(), time.Now()
	t := time.NewTicker(every)
	defer t.Stop()
	var b strings.Builder
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		now := time.Now()
		secs := now.Sub(last).Seconds()
		b.Reset()
		fmt.Fprintf(&b, "farmem: stats: faults/s")
		for src := fetcher.Source(0); src < fetcher.NumSources; src++ {
			rt.Stats.Latency[src].Snapshot(&cur[src])
			d := cur[src]
			d.Sub(&prev[src])
			prev[src] = cur[src]
			if d.N > 0 {
				fmt.Fprintf(&b, " %s %.0f (p99 %s)", src, float64(d.N)/secs, duration(int64(d.Quantile(0.99))))
			} else {
				fmt.Fprintf(&b, " %s 0", src)
			}
		}
		w, dr := e.Written.Load(), e.Dropped.Load()
		fmt.Fprintf(&b, "; evictions/s written %.0f clean %.0f; resident %d MiB of %d MiB cap (%d MiB counted against it)\n",
			float64(w-lastW)/secs, float64(dr-lastD)/secs, rt.Resident()*runtime.PageSize>>20,
			rt.Config().CapPages*runtime.PageSize>>20, rt.Evictor().Used()*runtime.PageSize>>20)
		lastW, lastD, last = w, dr, now
		os.Stderr.WriteString(b.String())
	}
}

func acceptLoop(ln *net.UnixListener, rt *runtime.Runtime, agents *staticAgents) {
	for {
		c, err := ln.AcceptUnix()
		if err != nil {
			return
		}
		go handleConn(&conn{c: c}, rt, agents)
	}
}

// handleConn serves one shim connection: a control connection (HELLO, then REGISTER requests)
// or an agent connection (AGENT_HELLO, then eviction requests we send).
func handleConn(c *conn, rt *runtime.Runtime, agents *staticAgents) {
	m, fd, lifeline, err := c.recvLifeline()
	if err == nil && m.Type == msgUffdDev {
		// A process that may not open /dev/userfaultfd asks for it before its HELLO.
		if fd >= 0 {
			unix.Close(fd)
		}
		if sendUffdDev(c, rt, int(m.Pid)) != nil {
			c.c.Close()
			return
		}
		m, fd, lifeline, err = c.recvLifeline()
	}
	if lifeline >= 0 {
		// The write end of the process's lifeline pipe (shim.c, make_lifeline): held, never
		// written, until the process's control connection ends (it exited or exec'd) or
		// farmem dies, when the kernel SIGKILLs the process. That is what ends a process
		// whose threads wait on farmem forever once it is gone (a fault, or the agent's drop
		// waiting for its REMOVE to be read): a fork child like redis's BGSAVE, which no
		// parent-death signal of farmem's reaches.
		defer unix.Close(lifeline)
	}
	if err != nil {
		// A process that exec'd or exited before its agent said hello closes quietly.
		if !errors.Is(err, errClosed) {
			fmt.Fprintf(os.Stderr, "farmem: bad shim handshake: %v\n", err)
		}
		c.c.Close()
		return
	}
	switch m.Type {
	case msgAgentHello:
		p := rt.Lookup(int(m.Pid))
		if p == nil {
			c.c.Close()
			return
		}
		a, err := newAgentConn(c)
		if err != nil {
			fmt.Fprintf(os.Stderr, "farmem: process %d: %v\n", m.Pid, err)
			return
		}
		if m.B != 0 {
			p.Table().Lock()
			p.Table().Pin(m.B, m.B+m.C)
			p.Table().Unlock()
		}
		p.SetAgent(a, int(m.A))     // installs the mapping filter if the run is armed
		if !agents.attached(p, a) { // a static program's filter goes in now, armed or not
			p.ServeInProgram(a) // if the run has faults served there
		}
		a.Ready() // a failure is the agent's death, which the evictor meets next
		return    // the evictor drives this connection from now on
	case msgHello:
	default:
		c.c.Close()
		return
	}
	defer c.c.Close()
	var p *runtime.Process
	keep := -1
	if fd >= 0 && m.C&helloAPILeft != 0 {
		err = handshakeFor(fd)
	}
	switch {
	case fd < 0:
		err = errors.New("hello without a userfaultfd")
	case err != nil:
		unix.Close(fd)
	case m.C&helloForkChild != 0:
		parent := rt.Lookup(int(m.A))
		p, err = rt.AttachForked(int(m.Pid), int(m.A), fd, m.C&^(pageSize-1))
		if err == nil && p.UFFD() != fd {
			keep = p.UFFD() // served on the uffd of its FORK event: the shim keeps a copy of it
		}
		if err == nil {
			p.InheritFilter(parent)
		}
	default:
		// Whose mapping filter it has, if any: the image it replaced, or, for a child that exec'd
		// with no hello of its own (vfork, posix_spawn), its parent.
		from := rt.Lookup(int(m.Pid))
		if from == nil {
			from = rt.Lookup(int(m.A))
		}
		p, err = rt.Attach(int(m.Pid), fd)
		if err == nil {
			p.InheritFilter(from)
		}
	}
	status := uint64(0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "farmem: process %d: %v\n", m.Pid, err)
		status = uint64(unix.EPROTO)
	}
	armed := uint64(0)
	if rt.Armed() {
		armed = 1 // the shim waits for its agent to be attached (shim.c, start_agent)
	}
	if c.send(msg{Type: msgHelloOK, A: status, B: rt.Config().MinRegister, C: armed}, keep) != nil || err != nil {
		return
	}
	for {
		m, _, err := c.recv()
		if err != nil {
			rt.ControlEnded(p) // it exited, or exec'd: into an image that may not be served
			return
		}
		if m.Type != msgRegister {
			continue
		}
		st := uint64(0)
		if err := p.Register(m.A, m.B); err != nil {
			var en unix.Errno
			if errors.As(err, &en) {
				st = uint64(en)
			} else {
				st = uint64(unix.EIO)
			}
		}
		if c.send(msg{Type: msgRegisterOK, A: st}, -1) != nil {
			return
		}
	}
}

// signalAll forwards a signal to every process still served once the program itself exited.
func signalAll(rt *runtime.Runtime, s os.Signal) {
	for _, pid := range rt.Pids() {
		if sig, ok := s.(syscall.Signal); ok {
			syscall.Kill(pid, sig)
		}
	}
}
