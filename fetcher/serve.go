package fetcher

import (
	"errors"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/faulttrace"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

const (
	ps = uffd.PageSize
	// maxZeroWindow bounds how many never-touched pages one sequential first-touch fault fills:
	// one fault that installs 8 pages costs ~1.1 us/page against ~4.1 for one (DESIGN.md).
	maxZeroWindow = 64
)

var zeros [maxZeroWindow * ps]byte

// outcome of serving one message.
type outcome int

const (
	served outcome = iota
	retry          // keep the message and resolve it again after draining events
)

// pendingFault is a fault that could not be served yet, with the time it was first read.
type pendingFault struct {
	msg   uffd.Msg
	since time.Time
}

// serve is the fault thread: it runs on a locked OS thread (not the netpoller, whose wakeup
// costs ~55 us here) until Stop.
func (p *Process) serve() {
	runtime.LockOSThread()
	defer close(p.done)

	msgs := make([]uffd.Msg, 64)
	var pending []pendingFault
	page := make([]byte, ps)
	pfd := []unix.PollFd{
		{Fd: int32(p.fd), Events: unix.POLLIN},
		{Fd: int32(p.stop), Events: unix.POLLIN},
		{Fd: int32(p.room), Events: unix.POLLIN},
	}
	var counter [8]byte
	var wait unix.Timespec
	for {
		// Pending faults wait for one of three things, each of which wakes this poll: an
		// unread event (it is on the uffd), the evictor making room or finishing a drop (it
		// writes p.room, see WakeIfWaiting), or a fork child's pid (rare: the timeout).
		var timeout *unix.Timespec
		switch {
		case len(pending) > 0:
			wait, timeout = unix.Timespec{Nsec: 1_000_000}, &wait
		case p.place.pinned != 0:
			// A pinned thread is unpinned after a quiet spell: look at least twice a spell.
			p.place.quiet(nanotime())
			wait, timeout = unix.Timespec{Nsec: quietSpell / 2}, &wait
		}
		if _, err := unix.Ppoll(pfd, timeout, nil); err != nil && err != unix.EINTR {
			p.Fail(fmt.Errorf("poll uffd: %w", err))
			return
		}
		if pfd[1].Revents != 0 {
			return
		}
		if pfd[2].Revents != 0 {
			unix.Read(p.room, counter[:])
		}
		for {
			n, err := uffd.ReadMsgs(p.fd, msgs)
			if err == unix.EAGAIN || n == 0 {
				break
			}
			if err != nil {
				p.Fail(fmt.Errorf("read uffd: %w", err))
				return
			}
			now := time.Now()
			for i := range msgs[:n] {
				p.clock.retried = false
				if p.handle(&msgs[i], page, now) == retry {
					pending = append(pending, pendingFault{msgs[i], now})
				}
			}
		}
		// Faults that hit EAGAIN (an unread event) or the cap: resolve again from scratch.
		// waiting is raised before they look at the cap, and the evictor lowers Resident
		// before it reads waiting, so room made meanwhile is never missed.
		p.waiting.Store(len(pending) > 0)
		kept := pending[:0]
		for i := range pending {
			p.clock.retried = true
			if p.handle(&pending[i].msg, page, pending[i].since) == retry {
				kept = append(kept, pending[i])
			}
		}
		pending = kept
		p.waiting.Store(len(pending) > 0)
	}
}

// handle serves one message read at since (earlier than now if it had to wait).
func (p *Process) handle(m *uffd.Msg, buf []byte, since time.Time) outcome {
	switch m.Event() {
	case uffd.EventPagefault:
		flags, addr, tid := m.Pagefault()
		pg := addr &^ (ps - 1)
		if p.clock.on {
			p.clock.reset(p.rt.TraceSample, pg)
		}
		p.place.fault(p.Pid(), int(tid), p.agentTid.Load())
		if p.rt.Evictor.Used() > p.rt.Evictor.HighWater() {
			p.rt.kickEvictor() // start before the cap is reached, so faults rarely wait
		}
		var o outcome
		var src Source
		switch {
		case flags&uffd.PagefaultWP != 0:
			o, src = p.wpFault(pg), FromWP
		case p.rt.overCap() && !p.makesRoom(int32(tid)) && p.CanEvict():
			// A process with no agent yet (a fork child before its hello) goes on: the evictor
			// cannot take its pages, and holding its faults would hold the thread that is
			// starting its agent (a redis BGSAVE child's inherited pages, counted again for
			// it, once kept every fault of the run waiting for room that never came).
			if !p.rt.arming.Load() {
				p.rt.Evictor.Waited() // at the cap, not arming: the evictor keeps more room
			}
			p.rt.kickEvictor()
			o = retry
		default:
			o, src = p.missing(pg, flags&uffd.PagefaultWrite != 0, buf, since)
		}
		if o == served {
			d := time.Since(since)
			p.rt.Stats.Latency[src].Record(d)
			if tr := p.rt.Trace; tr != nil {
				p.record(tr, flags, pg, src, since)
			}
			if tr := p.rt.Tracer; tr != nil {
				p.traceFault(tr, flags, pg, src, since, d)
			}
		}
		return o
	case uffd.EventRemove:
		p.rt.Stats.Removes.Add(1)
		s, e := m.Range()
		p.table.Lock()
		p.table.Removed(s, e)
		p.table.Unlock()
	case uffd.EventUnmap:
		s, e := m.Range()
		p.table.Lock()
		p.table.DiscardRange(s, e)
		p.table.Unlock()
		p.forgetRange(s, e)
	case uffd.EventRemap:
		from, to, n := m.Remap()
		p.table.Lock()
		p.table.Move(from, to, n)
		p.table.Unlock()
		p.forgetRange(from, from+n)
	case uffd.EventFork:
		p.table.Lock()
		ct := p.table.CloneFor()
		p.table.Unlock()
		p.rt.forked(p, m.ForkUFD(), ct)
	}
	return served
}

// makesRoom reports whether faults of thread tid are eviction's own, never held for room: the
// agent's (it moves and drops the victims) and the evictor's reads of the victims.
func (p *Process) makesRoom(tid int32) bool {
	return tid == p.agentTid.Load() || tid == p.rt.Evictor.Tid()
}

// absentGrace is how long a fault on a page the table holds resident, yet absent, is retried
// before the record is taken to be wrong: the time for a REMAP event the kernel sends after an
// mremap moved the page (microseconds) to be read.
const absentGrace = 100 * time.Millisecond

// missing serves a MISSING fault, read at since: the page is absent from the program.
func (p *Process) missing(pg uint64, write bool, buf []byte, since time.Time) (o outcome, src Source) {
	t := p.table
	t.Lock()
	defer t.Unlock()
	e := t.Get(pg)
	p.clock.mark(&p.clock.lookup) // a backend fault's lookup ends after the prefetch cache's, below
	if e == nil {
		return p.zeroFill(pg, write), FromZero
	}
	switch e.State {
	case pagetable.Resident, pagetable.Evicting:
		// Already installed (a batch filled it, or two threads faulted on it): just wake. The
		// pagemap read is on this rare path only. If the page is absent, an mremap may have
		// moved it (its REMAP event re-keys the entry shortly); past absentGrace the record
		// is wrong and the content may be lost: the program is stopped, never woken into the
		// same fault for ever, nor given zeros.
		present, err := p.present(pg)
		switch {
		case err != nil || present:
			return p.wake(pg), FromZero
		case time.Since(since) < absentGrace:
			return retry, FromZero
		}
		p.Fail(fmt.Errorf("page %#x is absent from the program though farmem records it resident: its content may be lost", pg))
		return served, FromZero
	case pagetable.Staged:
		// Moved out by the batch in flight: it commits the page (or puts it back) shortly
		// and wakes this thread, which then finds it Evicted (or present).
		return retry, FromBackend
	}
	if e.Stage != 0 {
		return p.fromStaging(pg, e, buf), FromBackend
	}
	if e.Prefetching {
		// The prefetch worker is fetching it: wait for that batch (it wakes this thread)
		// rather than fetch the page a second time.
		return retry, FromBackend
	}
	// Evicted: a re-fault, which is what the prefetcher learns from.
	src = FromBackend
	if p.pf.pred != nil {
		defer func() {
			if o == served { // not a retry: the prefetcher sees each re-fault once
				p.predict(pg, src == FromCache) // after the install and its wake: the program runs on meanwhile
			}
		}()
	}
	if e.Slot == 0 {
		n, err := uffd.Copy(p.fd, pg, unsafe.Pointer(&zeros[0]), ps, 0)
		p.clock.installed(IoctlCopy)
		return p.installed(pg, n, err, pagetable.Written, 0, FromZero), FromZero
	}
	if c := p.rt.PrefetchCache; c != nil && c.take(p, pg, e, buf) {
		src = FromCache
		p.clock.mark(&p.clock.lookup)
	} else {
		p.clock.mark(&p.clock.lookup)
		p.clock.slot = e.Slot
		if err := p.fetchPage(e.Slot, buf); err != nil {
			p.Fail(fmt.Errorf("page %#x: %w", pg, err))
			return served, FromBackend
		}
		p.clock.mark(&p.clock.fetch)
	}
	d := e.Refetch(write)
	mode := uffd.CopyWP // Clean: the first write arrives as a WP fault
	if d != pagetable.Clean {
		mode = 0
	}
	n, err := uffd.Copy(p.fd, pg, unsafe.Pointer(&buf[0]), ps, mode)
	p.clock.installed(IoctlCopy)
	return p.installed(pg, n, err, d, e.Slot, src), src
}

// zeroFill serves the first touch of a page, filling a growing window of following
// never-touched pages when first touches are sequential in one of a few streams.
func (p *Process) zeroFill(pg uint64, write bool) outcome {
	stream, win := p.zero.window(pg, maxZeroWindow)
	k := uint64(1)
	room := uint64(max(p.rt.roomPages(), 1))
	for k < uint64(win) && k < room && p.table.Get(pg+k*ps) == nil {
		k++
	}
	for {
		var n int64
		var err error
		if write {
			n, err = uffd.Copy(p.fd, pg, unsafe.Pointer(&zeros[0]), k*ps, 0)
			p.clock.installed(IoctlCopy)
		} else {
			n, err = uffd.ZeroPage(p.fd, pg, k*ps, 0)
			p.clock.installed(IoctlZeroPage)
		}
		p.clock.pages = int(max(n, 0) / ps)
		if n == 0 && k > 1 && (err == unix.ENOENT || err == unix.EFAULT || err == unix.EEXIST) {
			k = 1 // the window crossed the end of the mapping or a present page
			continue
		}
		if n > 0 {
			for i := int64(0); i < n/ps; i++ {
				p.table.Install(pg+uint64(i)*ps, pagetable.Written, 0)
			}
			p.zero.filled(stream, pg+uint64(n))
			p.rt.Stats.ZeroFills.Add(1)
			p.rt.Stats.ZeroPages.Add(n / ps)
			return served
		}
		return p.failed(pg, err)
	}
}

// installed finishes a one-page install of slot (or zeros if slot is 0) from src: the demand
// re-fault of an evicted page, which tells the replacement policy the page is in use.
func (p *Process) installed(pg uint64, n int64, err error, d pagetable.Dirt, slot backend.Slot, src Source) outcome {
	if n == ps {
		p.table.Refaulted(p.table.Install(pg, d, slot))
		switch src {
		case FromBackend:
			p.rt.Stats.BackendFaults.Add(1)
		case FromCache:
			p.rt.Stats.PrefetchUsed.Add(1)
		default:
			p.rt.Stats.ZeroFills.Add(1)
		}
		return served
	}
	return p.failed(pg, err)
}

// failed interprets an install ioctl's error.
func (p *Process) failed(pg uint64, err error) outcome {
	switch {
	case err == nil:
		return served
	case err == unix.EAGAIN:
		return retry // an event is unread; the page's state may change when we read it
	case err == unix.EEXIST:
		return p.wake(pg)
	case err == unix.ENOENT, err == unix.ESRCH:
		return served // unmapped meanwhile / the process exited
	}
	p.Fail(fmt.Errorf("install page %#x: %w", pg, err))
	return served
}

func (p *Process) wake(pg uint64) outcome {
	err := uffd.Wake(p.fd, pg, ps)
	p.clock.mark(&p.clock.wake)
	if err != nil && err != unix.ESRCH {
		p.Fail(fmt.Errorf("wake %#x: %w", pg, err))
	}
	return served
}

// wpFault serves a write to a write-protected page.
func (p *Process) wpFault(pg uint64) outcome {
	t := p.table
	t.Lock()
	defer t.Unlock()
	e := t.Get(pg)
	p.clock.mark(&p.clock.lookup)
	switch {
	case e == nil || e.State == pagetable.Resident:
		// First write to a clean page: from now on its slot is stale.
		if e != nil {
			e.Dirty = true
		}
		return p.unprotect(pg)
	case e.State == pagetable.Evicting:
		return served // the evictor wakes the writer once the page is gone
	case e.Zapping, e.State == pagetable.Staged:
		// Our agent is dropping or moving it right now; afterwards the retry finds it absent
		// (and wakes the writer, whose retry faults MISSING) or present again.
		return retry
	}
	// Evicted and not being dropped, yet a write hit its protection: if the page is present it
	// is a fork child's copy of a page the parent was evicting at fork time; its content is the
	// slot's. If absent, this message is stale: the writer was woken already.
	present, err := p.present(pg)
	if err != nil {
		return retry // no pid yet (fork child before its hello)
	}
	if !present {
		return p.wake(pg)
	}
	t.Install(pg, pagetable.Written, e.Slot)
	return p.unprotect(pg)
}

// fromStaging serves a fork child's page that its parent had moved out, and not yet stored,
// when it forked (pagetable's Stage): its content is the child's copy of the staging page.
// That copy is present whenever the page is absent (the parent drops its staging area only
// after committing every staged page); it is checked all the same, because the child's copy of
// the area is not registered (its uffd has no EVENT_FORK): an absent page there would read as
// zeros, and a program must never be served zeros for a page we cannot fetch.
func (p *Process) fromStaging(pg uint64, e *pagetable.Entry, buf []byte) outcome {
	start, _ := p.table.Staging()
	src := start + uint64(e.Stage-1)*ps
	present, err := p.present(src)
	if err != nil {
		return retry // no pid yet (fork child before its hello)
	}
	if !present {
		p.Fail(fmt.Errorf("page %#x: its copy in the staging area (%#x) is gone", pg, src))
		return served
	}
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(ps)
	got, err := unix.ProcessVMReadv(p.Pid(), local, []unix.RemoteIovec{{Base: uintptr(src), Len: ps}}, 0)
	if err == unix.ESRCH {
		return served
	}
	if err != nil || got != ps {
		p.Fail(fmt.Errorf("page %#x: reading its copy in the staging area: %d bytes, %v", pg, got, err))
		return served
	}
	n, err := uffd.Copy(p.fd, pg, unsafe.Pointer(&buf[0]), ps, 0)
	p.clock.installed(IoctlCopy)
	if n == ps {
		p.rt.Stats.FromStaging.Add(1)
	}
	return p.installed(pg, n, err, pagetable.Written, 0, FromBackend)
}

func (p *Process) unprotect(pg uint64) outcome {
	err := uffd.WriteProtect(p.fd, pg, ps, 0)
	p.clock.installed(IoctlWriteProtect)
	if err == unix.EAGAIN {
		return retry
	}
	if err != nil && err != unix.ENOENT && err != unix.ESRCH {
		p.Fail(fmt.Errorf("unprotect %#x: %w", pg, err))
	}
	return served
}

var errNoPid = errors.New("pid not known yet")

// present reads the page's present bit from /proc/PID/pagemap.
func (p *Process) present(pg uint64) (bool, error) {
	pid := p.Pid()
	if pid == 0 {
		return false, errNoPid
	}
	var e [1]uint64
	if err := readPagemap(pid, pg, e[:]); err != nil {
		return false, err
	}
	return e[0]>>63 != 0, nil
}

// traceSource is how a fault trace names each Source.
var traceSource = [NumSources]uint8{FromZero: faulttrace.SourceZero, FromBackend: faulttrace.SourceBackend, FromWP: faulttrace.SourceWP, FromCache: faulttrace.SourcePrefetchHit}

// record writes one served fault to the run's trace.
func (p *Process) record(tr *faulttrace.Writer, flags, pg uint64, src Source, at time.Time) {
	kind := faulttrace.KindRead
	switch {
	case flags&uffd.PagefaultWP != 0:
		kind = faulttrace.KindWP
	case flags&uffd.PagefaultWrite != 0:
		kind = faulttrace.KindWrite
	}
	tr.Record(faulttrace.Record{Time: at.Sub(p.rt.start).Nanoseconds(), Pid: uint32(p.Pid()), Kind: kind, Source: traceSource[src], Addr: pg})
}
