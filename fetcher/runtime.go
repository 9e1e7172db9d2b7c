package fetcher

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/pagetable"
)

// Stats counts fault-path work for the run summary.
type Stats struct {
	ZeroFills, ZeroPages, BackendFaults atomic.Int64
}

// Runtime owns every process of one `farmem run`.
type Runtime struct {
	Slots    *pagetable.Slots
	Resident atomic.Int64 // pages resident in all processes
	CapPages int64
	Evictor  *evictor.Evictor
	Stats    Stats
	// MinRegister is the smallest anonymous mapping registered (shim and rescan alike).
	MinRegister uint64

	mu       sync.Mutex
	procs    map[*Process]bool       // protected by mu
	byPid    map[int]*Process        // protected by mu
	forks    map[*Process][]*Process // protected by mu; fork children awaiting their hello, per parent, in fork order
	failure  error                   // protected by mu; first unrecoverable error
	stop     chan struct{}
	finished sync.WaitGroup
}

// NewRuntime builds a runtime holding at most capPages resident pages, storing evicted pages in b.
func NewRuntime(capPages int64, b backend.Backend) *Runtime {
	rt := &Runtime{
		Slots: pagetable.NewSlots(b), CapPages: capPages, MinRegister: 64 << 10,
		procs: map[*Process]bool{}, byPid: map[int]*Process{}, forks: map[*Process][]*Process{},
		stop: make(chan struct{}),
	}
	rt.Evictor = evictor.New(capPages, &rt.Resident, b, rt.targets)
	rt.finished.Add(2)
	go func() { defer rt.finished.Done(); rt.Evictor.Loop(rt.stop) }()
	go func() { defer rt.finished.Done(); rt.rescanLoop() }()
	return rt
}

func (rt *Runtime) targets() []evictor.Target {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	out := make([]evictor.Target, 0, len(rt.procs))
	for p := range rt.procs {
		out = append(out, p)
	}
	return out
}

func (rt *Runtime) overCap() bool { return rt.Resident.Load() >= rt.CapPages }
func (rt *Runtime) roomPages() int64 {
	return rt.CapPages - rt.Resident.Load()
}
func (rt *Runtime) kickEvictor() {
	select {
	case rt.Evictor.Kick <- struct{}{}:
	default:
	}
}

func (rt *Runtime) noteFailure(err error) {
	rt.mu.Lock()
	if rt.failure == nil {
		rt.failure = err
	}
	rt.mu.Unlock()
}

// Failure returns the first error that made the runtime stop a process.
func (rt *Runtime) Failure() error {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.failure
}

// Attach adopts a program process that said hello with its uffd.
func (rt *Runtime) Attach(pid, fd int) (*Process, error) {
	p, err := newProcess(rt, fd, pagetable.New(&rt.Resident, rt.Slots))
	if err != nil {
		return nil, err
	}
	p.pid.Store(int32(pid))
	rt.mu.Lock()
	old := rt.byPid[pid] // an exec replaced the old image: its mm is gone
	rt.procs[p] = true
	rt.byPid[pid] = p
	rt.mu.Unlock()
	if old != nil {
		rt.retire(old)
	}
	go p.serve()
	rt.watchExit(p, pid)
	return p, nil
}

// forked starts serving a fork child at once (its pid comes later, with its hello).
func (rt *Runtime) forked(parent *Process, fd int, table *pagetable.PageTable) {
	c, err := newProcess(rt, fd, table)
	if err != nil {
		parent.Fail(err)
		return
	}
	rt.mu.Lock()
	rt.procs[c] = true
	rt.forks[parent] = append(rt.forks[parent], c)
	rt.mu.Unlock()
	go c.serve()
}

// AttachForked matches a fork child's hello to the uffd its parent's FORK event delivered.
// Children of one parent are matched in fork order; the shim says hello from its atfork
// handler, so this is exact unless two threads of one process fork at the same instant.
//
// The child is runnable before its parent's FORK event is read (the kernel wakes it first and
// then waits for the event to be read), so its hello may arrive first: wait for the event.
func (rt *Runtime) AttachForked(pid, ppid int) (*Process, error) {
	deadline := time.Now().Add(10 * time.Second)
	rt.mu.Lock()
	for {
		if parent := rt.byPid[ppid]; parent != nil && len(rt.forks[parent]) > 0 {
			break
		}
		rt.mu.Unlock()
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("fork child %d: no FORK event from parent %d", pid, ppid)
		}
		time.Sleep(200 * time.Microsecond)
		rt.mu.Lock()
	}
	parent := rt.byPid[ppid]
	q := rt.forks[parent]
	c := q[0]
	rt.forks[parent] = q[1:]
	c.pid.Store(int32(pid))
	rt.byPid[pid] = c
	rt.mu.Unlock()
	rt.watchExit(c, pid)
	return c, nil
}

// Lookup returns the process with pid.
func (rt *Runtime) Lookup(pid int) *Process {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.byPid[pid]
}

// watchExit retires p when pid exits.
func (rt *Runtime) watchExit(p *Process, pid int) {
	pfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		rt.retire(p)
		return
	}
	go func() {
		defer unix.Close(pfd)
		fds := []unix.PollFd{{Fd: int32(pfd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == unix.EINTR {
				continue
			}
			break
		}
		rt.retire(p)
	}()
}

// retire stops serving p and frees everything it held.
func (rt *Runtime) retire(p *Process) {
	rt.mu.Lock()
	if !rt.procs[p] {
		rt.mu.Unlock()
		return
	}
	delete(rt.procs, p)
	if pid := p.Pid(); rt.byPid[pid] == p {
		delete(rt.byPid, pid)
	}
	for _, c := range rt.forks[p] {
		// A child that never said hello: it has exited, or was forked without libc's fork.
		defer rt.retireLater(c)
	}
	delete(rt.forks, p)
	rt.mu.Unlock()
	p.Stop()
	p.agentMu.Lock()
	if p.agent != nil {
		p.agent.Close()
	}
	p.agentMu.Unlock()
	p.table.Lock()
	p.table.Clear()
	p.table.Unlock()
	unix.Close(p.fd)
	unix.Close(p.stop)
}

func (rt *Runtime) retireLater(c *Process) {
	go func() {
		time.Sleep(time.Second)
		if c.Pid() == 0 {
			rt.retire(c)
		}
	}()
}

// Pids returns the pids of the processes served.
func (rt *Runtime) Pids() []int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	out := make([]int, 0, len(rt.byPid))
	for pid := range rt.byPid {
		out = append(out, pid)
	}
	return out
}

// Live returns the number of processes still served.
func (rt *Runtime) Live() int {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return len(rt.procs)
}

// Close stops everything.
func (rt *Runtime) Close() {
	for _, t := range rt.targets() {
		rt.retire(t.(*Process))
	}
	close(rt.stop)
	rt.finished.Wait()
}

// rescanLoop finds anonymous mappings the shim could not see (glibc malloc's internal brk and
// mmap) and registers them, adopting their present pages. Nothing faults in memory we have not
// registered, so the only sign of it is the kernel's count: every 2 ms it compares each
// process's anonymous RSS (statm, one cheap read) with the pages we track and rescans at once
// when they drift apart by more than unseenPages; otherwise every 100 ms.
func (rt *Runtime) rescanLoop() {
	const unseenPages = 1024
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	last := map[*Process]time.Time{}
	for {
		select {
		case <-rt.stop:
			return
		case <-t.C:
		}
		now := time.Now()
		for _, tg := range rt.targets() {
			p := tg.(*Process)
			if p.Pid() == 0 {
				continue
			}
			p.table.Lock()
			tracked := int64(p.table.Resident())
			p.table.Unlock()
			if now.Sub(last[p]) < 100*time.Millisecond && p.anonPages()-tracked < unseenPages {
				continue
			}
			last[p] = now
			p.Rescan()
			if rt.Resident.Load() > rt.Evictor.High {
				rt.kickEvictor()
			}
		}
		for p := range last {
			if !rt.live(p) {
				delete(last, p)
			}
		}
	}
}

func (rt *Runtime) live(p *Process) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.procs[p]
}

// anonPages returns the process's resident anonymous pages (statm: resident - shared).
func (p *Process) anonPages() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", p.Pid()))
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return 0
	}
	res, _ := strconv.ParseInt(f[1], 10, 64)
	shared, _ := strconv.ParseInt(f[2], 10, 64)
	return res - shared
}

// Rescan registers every private anonymous writable mapping of at least MinRegister bytes.
func (p *Process) Rescan() {
	f, err := os.Open(fmt.Sprintf("/proc/%d/maps", p.Pid()))
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		start, end, ok := anonMapping(sc.Text())
		if !ok || end-start < p.rt.MinRegister {
			continue
		}
		p.Register(start, end-start) // EINVAL/ENOMEM: the mapping changed meanwhile
	}
}

// anonMapping parses one /proc/PID/maps line and reports whether it is private anonymous
// read-write memory: no file, not the main stack, vdso or vvar.
func anonMapping(line string) (start, end uint64, ok bool) {
	f := strings.Fields(line)
	if len(f) < 5 || f[1] != "rw-p" || f[4] != "0" {
		return 0, 0, false
	}
	if len(f) >= 6 && f[5] != "[heap]" {
		return 0, 0, false
	}
	se := strings.SplitN(f[0], "-", 2)
	s, err1 := strconv.ParseUint(se[0], 16, 64)
	e, err2 := strconv.ParseUint(se[1], 16, 64)
	return s, e, err1 == nil && err2 == nil
}

// PageSize is the page size farmem manages.
const PageSize = ps
