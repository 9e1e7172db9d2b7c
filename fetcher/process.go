// Package fetcher is the fault path: one OS-locked thread per process reads its userfaultfd,
// serves each fault from the right tier (zero fill, backend), and applies layout events
// (REMOVE, UNMAP, REMAP, FORK) to the process's page table.
//
// The fault thread never waits on anything that waits on a fault: with EVENT_REMOVE/UNMAP/FORK
// the program's madvise/munmap/fork block until the event is read, and while one is unread
// every COPY/ZEROPAGE returns EAGAIN. A fault hit by EAGAIN is kept and re-resolved from
// scratch after the events are read (the page's state may have changed), never dropped.
package fetcher

import (
	"encoding/binary"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

// RegisterMode is how every range is registered: MISSING for first touch and re-fault, WP for
// dirty tracking and the eviction protocol.
const RegisterMode = uffd.ModeMissing | uffd.ModeWP

// Agent is the connection to a process's agent thread.
type Agent interface {
	// Drop has the agent madvise(DONTNEED) runs and waits for it.
	Drop(runs []evictor.Run) error
	// Move has the agent UFFDIO_MOVE runs into the staging area from dst on (evictor.Target).
	Move(runs []evictor.Run, dst uint64, status []byte) error
	// Staging has the agent map a staging area of bytes and returns its address.
	Staging(bytes uint64) (uint64, error)
	// Filter has the agent install the mapping filter on every thread of its process and
	// returns the filter's seccomp listener (mapfilter.go).
	Filter(minBytes uint64) (listener int, err error)
	// Syscall has the agent make a system call in its process; the raw result is -errno on
	// failure.
	Syscall(nr uint64, args [6]uint64) (int64, error)
	Close() error
}

// Process is one process of the run (the program, or a fork child of it).
type Process struct {
	rt    *Runtime
	fd    int // the uffd; owned
	table *pagetable.PageTable
	stop  int // eventfd that ends the fault thread
	room  int // eventfd the evictor writes when faults wait (waiting) and it made progress

	waiting atomic.Bool // the fault thread holds faults that wait for the evictor or an event

	pid      atomic.Int32 // 0 until the shim's hello (a fork child is served before it says hello)
	agentTid atomic.Int32 // faults from this thread are never throttled: eviction needs it
	agentMu  sync.Mutex
	agent    Agent       // protected by agentMu
	filtered atomic.Bool // the agent was asked to install the mapping filter (mapfilter.go)
	// staging is the staging area the evictor moves victims into (evictor.Target.Staging): 0
	// until the first batch makes it, noStaging once it is known there can be none. Both
	// belong to the evictor goroutine.
	staging   uint64
	noStaging bool
	brkMu     sync.Mutex // serializes the process's notified brk calls
	brk       int64      // protected by brkMu; the break the last of them left (0: not known yet)

	regMu      sync.Mutex
	registered map[uint64]uint64 // protected by regMu; start -> end of ranges we registered

	zero zeroStreams   // fault-thread-only: sequential first-touch detection
	pf   prefetchState // fault-thread-only (under the table lock); pf.pred nil: no prefetching
	// prefetchQ carries the fault thread's predictions to the prefetch worker; nil without a
	// predictor. Closed by retire once the fault thread has stopped.
	prefetchQ chan prefetchBatch
	place     placement  // fault-thread-only: which CPU the fault thread runs on
	clock     faultClock // fault-thread-only: stage timestamps of the fault being served, if traced

	done     chan struct{} // closed when the fault thread has exited
	failOnce sync.Once

	// life is held for reading by each eviction batch (Hold) and for writing by retire while
	// it closes fd, stop and room: a batch never issues an ioctl on a closed (or reused) fd.
	life    sync.RWMutex
	retired bool // protected by life
}

// Hold implements evictor.Target.
func (p *Process) Hold() bool {
	p.life.RLock()
	if p.retired {
		p.life.RUnlock()
		return false
	}
	return true
}

// Release implements evictor.Target.
func (p *Process) Release() { p.life.RUnlock() }

func newProcess(rt *Runtime, fd int, table *pagetable.PageTable) (*Process, error) {
	stop, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	room, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(stop)
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	p := &Process{rt: rt, fd: fd, table: table, stop: stop, room: room, place: newPlacement(), registered: make(map[uint64]uint64), done: make(chan struct{})}
	p.clock.on = rt.Tracer != nil
	p.clock.rng = uint64(nanotime()) | 1 // xorshift's state must not be 0
	if rt.NewPredictor != nil {
		p.pf.pred = rt.NewPredictor()
		if _, remote := rt.Slots.Backend().(backend.BatchLoader); remote {
			p.prefetchQ = make(chan prefetchBatch, 16)
		} else {
			p.pf.inline = newPrefetchScratch()
		}
	}
	return p, nil
}

// start runs the process's fault thread and, with a predictor, its prefetch worker.
func (p *Process) start() {
	go p.serve()
	if p.prefetchQ != nil {
		go p.prefetchLoop()
	}
}

// Pid implements evictor.Target.
func (p *Process) Pid() int { return int(p.pid.Load()) }

// UFFD implements evictor.Target.
func (p *Process) UFFD() int { return p.fd }

// Table implements evictor.Target.
func (p *Process) Table() *pagetable.PageTable { return p.table }

// CanEvict implements evictor.Target.
func (p *Process) CanEvict() bool {
	p.agentMu.Lock()
	defer p.agentMu.Unlock()
	return p.agent != nil && p.pid.Load() != 0
}

// Drop implements evictor.Target.
func (p *Process) Drop(runs []evictor.Run) error {
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	if a == nil {
		return evictor.ErrGone
	}
	return a.Drop(runs)
}

// Staging implements evictor.Target. The agent maps and registers the area itself, on a
// uffd of its own (shim.c, make_staging): its drop then raises no REMOVE event for our fault
// thread to read. Not in a fork child that inherited its parent's area: that may hold the
// parent's staged pages, which the child's table reads (pagetable's Stage).
func (p *Process) Staging() uint64 {
	if p.staging != 0 || p.noStaging {
		return p.staging
	}
	p.noStaging = true
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	p.table.Lock()
	start, _ := p.table.Staging()
	p.table.Unlock()
	if a == nil || start != 0 {
		return 0
	}
	size := uint64(evictor.BatchPages * ps)
	base, err := a.Staging(size)
	if err != nil {
		return 0 // the drop way, then: slower, never wrong
	}
	p.table.Lock()
	p.table.SetStaging(base, base+size)
	p.table.Unlock()
	p.staging, p.noStaging = base, false
	return base
}

// Move implements evictor.Target.
func (p *Process) Move(runs []evictor.Run, dst uint64, status []byte) error {
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	if a == nil {
		return evictor.ErrGone
	}
	err := a.Move(runs, dst, status)
	if err == nil && len(status) > 0 && (status[0] == byte(unix.ENOTTY) || status[0] == byte(unix.ENOSYS)) {
		p.staging, p.noStaging = 0, true // a kernel before 6.8: no UFFDIO_MOVE
	}
	return err
}

// Fail implements evictor.Target: stop the program rather than let it see wrong data.
func (p *Process) Fail(err error) {
	p.failOnce.Do(func() {
		pid := p.Pid()
		fmt.Fprintf(os.Stderr, "farmem: cannot serve process %d any more: %v; stopping it\n", pid, err)
		if pid > 0 {
			unix.Kill(pid, unix.SIGKILL)
		}
		p.rt.noteFailure(fmt.Errorf("process %d: %w", pid, err))
	})
}

// SetAgent attaches the agent connection; tid is the agent thread.
func (p *Process) SetAgent(a Agent, tid int) {
	p.agentMu.Lock()
	old := p.agent
	p.agent = a
	p.agentMu.Unlock()
	p.agentTid.Store(int32(tid))
	if old != nil {
		old.Close()
	}
	if p.rt.Armed() {
		p.rt.filterMappings(p)
	}
}

// Register registers [start, start+length) with the process's uffd and adopts its present
// pages. Before the run is armed it does nothing: arming rescans every mapping.
func (p *Process) Register(start, length uint64) error {
	if !p.rt.Armed() {
		return nil
	}
	fresh, err := p.register(start, length)
	if err != nil || !fresh {
		return err
	}
	_, err = p.adopt(start, length)
	return err
}

// register registers [start, start+length) unless it is already; fresh reports whether it
// was not, so its present pages still need adopting.
func (p *Process) register(start, length uint64) (fresh bool, err error) {
	p.regMu.Lock()
	defer p.regMu.Unlock()
	if end, ok := p.registered[start]; ok && end == start+length {
		return false, nil
	}
	if _, err := uffd.Register(p.fd, start, length, RegisterMode); err != nil {
		return false, err
	}
	p.registered[start] = start + length
	return true, nil
}

// adopt records the pages of a just-registered range that are already present: the program
// touched them before we could register (glibc's internal brk/mmap). They have no stored copy.
func (p *Process) adopt(start, length uint64) (adopted int64, err error) {
	pid := p.Pid()
	if pid == 0 {
		return 0, nil
	}
	n := length / uffd.PageSize
	buf := make([]uint64, min(n, 8192))
	for off := uint64(0); off < n; {
		k := min(n-off, uint64(len(buf)))
		if err := readPagemap(pid, start+off*uffd.PageSize, buf[:k]); err != nil {
			return adopted, err
		}
		p.table.Lock()
		for i, e := range buf[:k] {
			page := start + (off+uint64(i))*uffd.PageSize
			// bit 63: present. The staging area's pages are not the program's (the kernel may
			// have merged it with a neighbour, so a mapping can hold it).
			if e>>63 != 0 && p.table.Get(page) == nil && !p.table.InStaging(page) {
				p.table.Install(page, pagetable.Written, 0)
				adopted++
			}
		}
		p.table.Unlock()
		off += k
	}
	return adopted, nil
}

// readPagemap reads the /proc/PID/pagemap entries of len(out) pages from start.
func readPagemap(pid int, start uint64, out []uint64) error {
	f, err := os.Open(fmt.Sprintf("/proc/%d/pagemap", pid))
	if err != nil {
		return err
	}
	defer f.Close()
	b := make([]byte, 8*len(out))
	if _, err := f.ReadAt(b, int64(start/uffd.PageSize*8)); err != nil {
		return err
	}
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(b[8*i:])
	}
	return nil
}

// forgetRange drops registrations inside [start, end) (UNMAP).
func (p *Process) forgetRange(start, end uint64) {
	p.regMu.Lock()
	for s, e := range p.registered {
		if s < end && e > start {
			delete(p.registered, s)
		}
	}
	p.regMu.Unlock()
}

// WakeIfWaiting implements evictor.Target: the evictor made room or finished a drop.
func (p *Process) WakeIfWaiting() {
	if p.waiting.Load() && p.Hold() {
		var one = [8]byte{1}
		unix.Write(p.room, one[:])
		p.Release()
	}
}

// Stop ends the fault thread and waits for it.
func (p *Process) Stop() {
	var one = [8]byte{1}
	unix.Write(p.stop, one[:])
	<-p.done
}
