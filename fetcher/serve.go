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
	"github.com/farmem/farmem/procfs"
	"github.com/farmem/farmem/uffd"
)

// maxZeroWindow bounds how many never-touched pages one sequential first-touch fault fills: one
// fault that installs several pages costs far less a page than a fault a page (docs/DESIGN.md,
// "Latency").
const maxZeroWindow = 64

var zeros [maxZeroWindow * ps]byte

// outcome of serving one message: served, or kept and resolved again from scratch later, for
// one of three reasons.
type outcome int

const (
	served     outcome = iota
	retryRoom          // over the cap: waits for the evictor to make room
	retryEvent         // an install met an unread event (EAGAIN): tried again once events are read
	retryBusy          // the page is in an eviction batch or being read, or its process is not known yet
)

// held is the Held category of a fault kept for the reasons in mask (a bit per outcome): room if
// it ever waited for it, else busy, else event.
func held(mask uint8) Held {
	switch {
	case mask&(1<<retryRoom) != 0:
		return HeldRoom
	case mask&(1<<retryBusy) != 0:
		return HeldBusy
	}
	return HeldEvent
}

// pendingFault is a fault that could not be served yet, with the time it was first read and why
// it was kept (a bit per outcome).
type pendingFault struct {
	msg   uffd.Msg
	since time.Time
	why   uint8
}

// serve is the fault thread: it runs on a locked OS thread, not the netpoller, whose wakeup is
// far slower than a direct switch (docs/DESIGN.md, "Latency"), until Stop.
func (f *Fetcher) serve() {
	runtime.LockOSThread()
	defer close(f.done)

	msgs := make([]uffd.Msg, 64)
	var pending []pendingFault
	page := make([]byte, ps)
	pfd := []unix.PollFd{
		{Fd: int32(f.fd), Events: unix.POLLIN},
		{Fd: int32(f.stop), Events: unix.POLLIN},
		{Fd: int32(f.room), Events: unix.POLLIN},
	}
	var counter [8]byte
	var wait unix.Timespec
	for {
		if f.stopped.Load() {
			return
		}
		if fd := f.takeOver(); fd >= 0 {
			pfd[0].Fd = int32(fd)
		}
		if f.in != nil && f.in.closed {
			pfd[0].Fd = -1
		}
		// Read first, poll only when nothing is queued. The install that served the last fault
		// woke the program, which on this CPU ran inside the ioctl until its next fault: that
		// fault is usually queued by the time the ioctl returns, and the read takes it at once.
		// In steady state a fault costs the read and the install, two system calls, where
		// polling first and reading until EAGAIN cost four.
		n, err := f.read(msgs)
		if err != nil && err != unix.EAGAIN {
			f.host.Fail(fmt.Errorf("read uffd: %w", err))
			return
		}
		f.topUp()
		if err == unix.EAGAIN || n == 0 {
			// Pending faults wait for one of three things, each of which wakes this poll: an
			// unread event (it is on the uffd), the evictor making room or finishing a drop (it
			// writes f.room, see Wake), or a fork child's pid (rare: the timeout).
			var timeout *unix.Timespec
			if len(pending) > 0 {
				wait, timeout = unix.Timespec{Nsec: 1_000_000}, &wait
			} else if d := f.host.Idle(nanotime()); d > 0 {
				wait, timeout = unix.NsecToTimespec(int64(d)), &wait
			}
			if _, err := unix.Ppoll(pfd, timeout, nil); err != nil && err != unix.EINTR {
				f.host.Fail(fmt.Errorf("poll uffd: %w", err))
				return
			}
			if pfd[1].Revents != 0 {
				return
			}
			if pfd[2].Revents != 0 {
				unix.Read(f.room, counter[:])
			}
			n = 0
		}
		if n > 0 {
			now := time.Now()
			for i := range msgs[:n] {
				if msgs[i].Event() != uffd.EventPagefault {
					continue // applied by read
				}
				f.clock.retried = false
				if o := f.fault(&msgs[i], page, now); o != served {
					pending = append(pending, pendingFault{msgs[i], now, 1 << o})
				}
			}
		}
		if len(pending) == 0 {
			continue
		}
		// Faults that hit EAGAIN (an unread event) or the cap: resolve again from scratch.
		// waiting is raised before they look at the cap, and the evictor lowers Resident
		// before it reads waiting, so room made meanwhile is never missed.
		f.waiting.Store(len(pending) > 0)
		kept := pending[:0]
		for i := range pending {
			f.clock.retried = true
			pf := &pending[i]
			if o := f.fault(&pf.msg, page, pf.since); o != served {
				pf.why |= 1 << o
				kept = append(kept, *pf)
				continue
			}
			f.stats.Held[held(pf.why)].Record(time.Since(pf.since))
		}
		pending = kept
		f.waiting.Store(len(pending) > 0)
	}
}

// read reads the messages queued on the uffd into msgs, and applies the layout events among them
// (REMOVE, UNMAP, REMAP, FORK), in their order, before any fault read with them is served.
//
// The order is a fork child's: its table, cloned at its FORK event, must be its parent's as it
// was when the fork copied the parent's memory. While the event is unread the kernel fails
// every install in the parent (EAGAIN), so the table cannot run ahead of that memory; the read
// that takes the event lifts the fence, and one read returns the faults queued before the
// events. Served first, those faults' installs, and the prefetches they start, would put pages
// in the parent only, and the clone would record them resident in a child that does not have
// them: its first touch of one would find it absent. So the table is locked from before the
// read until every event of it is applied (the prefetch worker installs under that lock too),
// and the faults come after. An UNMAP or REMAP read before a FORK took effect before the fork
// (the kernel raises them once the change is made), so they are applied before the clone.
//
// Once the agent reads the uffd (inprogram.go), the messages are those it sent on, and what it
// installed before it sent them is read first; the events applied are counted on the control
// page, which lets the agent serve faults again.
//
// The uffd is read under the move fence's lock, and the layout events read are counted there
// and in the table (pubtable.Fence says why). The agent's drops of the staging area are no
// layout events: their REMOVEs are passed over (the agent's fault thread does not send them on).
func (f *Fetcher) read(msgs []uffd.Msg) (int, error) {
	f.table.LockForFault()
	var n, events int
	var staged uint64 // bit i: message i is a drop of the staging area (len(msgs) <= 64)
	var err error
	if f.in != nil {
		n, err = f.in.recv(msgs)
		f.table.Drain(f.in.faulted)
		if err == nil {
			events, staged = f.layoutEvents(msgs[:n])
		}
	} else {
		if f.fence != nil {
			f.fence.Lock()
		}
		n, err = uffd.ReadMsgs(f.fd, msgs)
		if err == nil {
			events, staged = f.layoutEvents(msgs[:n])
		}
		if f.fence != nil {
			f.fence.Read(events)
			f.fence.Unlock()
		}
	}
	if err != nil || n == 0 {
		f.table.Unlock()
		return n, err
	}
	var forks []*pagetable.PageTable // the FORK events' tables, in their order
	f.table.LayoutChanged(events)
	for i := range msgs[:n] {
		m := &msgs[i]
		if staged&(1<<i) != 0 {
			continue
		}
		switch m.Event() {
		case uffd.EventRemove:
			s, e := m.Range()
			f.table.Removed(s, e, time.Now())
		case uffd.EventUnmap:
			s, e := m.Range()
			f.table.DiscardRange(s, e)
		case uffd.EventRemap:
			from, to, l := m.Remap()
			f.table.Move(from, to, l)
		case uffd.EventFork:
			forks = append(forks, f.table.CloneFor())
		}
	}
	if f.in != nil && events > 0 {
		f.in.ctl.Applied(events)
	}
	f.table.Unlock()
	// What the events tell the rest of the run waits on nothing of the program's (Forked
	// starts serving the child; its faults queue on its uffd meanwhile).
	for i := range msgs[:n] {
		m := &msgs[i]
		if staged&(1<<i) != 0 {
			continue
		}
		switch m.Event() {
		case uffd.EventRemove:
			f.stats.Removes.Add(1)
		case uffd.EventUnmap:
			f.host.Unmapped(m.Range())
		case uffd.EventRemap:
			from, _, l := m.Remap()
			f.host.Unmapped(from, from+l)
		case uffd.EventFork:
			f.host.Forked(m.ForkUFD(), forks[0])
			forks = forks[1:]
		}
	}
	return n, nil
}

// layoutEvents counts the layout events among msgs (at most 64): every event but the staging
// area's drops, whose messages it marks in staged (bit i: msgs[i]). The table is locked.
func (f *Fetcher) layoutEvents(msgs []uffd.Msg) (n int, staged uint64) {
	for i := range msgs {
		switch {
		case msgs[i].Event() == uffd.EventPagefault:
		case f.stagingRemove(&msgs[i]):
			staged |= 1 << i
		default:
			n++
		}
	}
	return n, staged
}

// stagingRemove reports whether m is the REMOVE event of the agent's drop of the staging area.
// The table is locked.
func (f *Fetcher) stagingRemove(m *uffd.Msg) bool {
	if m.Event() != uffd.EventRemove {
		return false
	}
	s, e := m.Range()
	return f.table.InStaging(s) && f.table.InStaging(e-1)
}

// fault serves one page-fault message read at since (earlier than now if it had to wait).
func (f *Fetcher) fault(m *uffd.Msg, buf []byte, since time.Time) outcome {
	flags, addr, tid := m.Pagefault()
	pg := addr &^ (ps - 1)
	f.faultTid = int32(tid)
	if f.clock.on {
		f.clock.reset(f.tracing.Sample, pg)
	}
	f.host.Faulting(int32(tid))
	var o outcome
	var src Source
	switch {
	case flags&uffd.PagefaultWP != 0:
		o, src = f.wpFault(pg), FromWP
	case f.host.MustWait(int32(tid)):
		o = retryRoom
	default:
		o, src = f.missing(pg, flags&uffd.PagefaultWrite != 0, buf, since)
	}
	if o == served {
		d := time.Since(since)
		f.stats.Latency[src].Record(d)
		if f.record != nil {
			f.recordFault(flags, pg, src, since)
		}
		if f.tracing != nil {
			f.traceFault(f.tracing, flags, pg, src, since, d)
		}
	}
	return o
}

// absentGrace is how long a fault on a page the table holds resident, yet absent, is retried
// before the record is taken to be wrong: the time for a REMAP event the kernel sends after an
// mremap moved the page (microseconds) to be read.
const absentGrace = 100 * time.Millisecond

// missing serves a MISSING fault, read at since: the page is absent from the program.
func (f *Fetcher) missing(pg uint64, write bool, buf []byte, since time.Time) (o outcome, src Source) {
	t := f.table
	t.LockForFault()
	defer t.Unlock()
	e := t.Get(pg)
	f.clock.mark(&f.clock.lookup) // a backend fault's lookup ends after the prefetch cache's, below
	if e == nil {
		return f.zeroFill(pg, write), FromZero
	}
	switch e.State {
	case pagetable.Resident, pagetable.Evicting:
		// Already installed (a batch filled it, or two threads faulted on it): just wake. The
		// pagemap read is on this rare path only. If the page is absent, an mremap may have
		// moved it (its REMAP event re-keys the entry shortly); past absentGrace the record
		// is wrong and the content may be lost: the process is stopped, never woken into the
		// same fault for ever, nor given zeros.
		if f.host.Exited() {
			return f.endFarmemRead(pg), FromZero
		}
		present, err := f.present(pg)
		switch {
		case err != nil || present:
			return f.wake(pg), FromZero
		case time.Since(since) < absentGrace:
			return retryBusy, FromZero
		case e.Adopted:
			// Its content was never farmem's: the kernel dropped it at the program's request
			// (pagetable.Adopt), and it reads as zeros now, as on a first touch.
			t.Discard(pg)
			f.stats.Vanished.Add(1)
			return f.zeroFill(pg, write), FromZero
		}
		f.host.Fail(fmt.Errorf("page %#x is absent from the program though farmem records it resident: its content may be lost", pg))
		// Kept until the process is gone: the fault may be an eviction batch's read of the
		// page, which only this thread can end (endFarmemRead).
		return retryBusy, FromZero
	case pagetable.Staged:
		// A victim of the batch in flight. Moved out already, it is served from its copy in
		// the staging area at once rather than after the batch commits; not moved yet (or
		// not to be), it waits for the batch, which wakes this thread.
		if o, ok := f.fromStagedVictim(pg, e, buf); ok {
			return o, FromBackend
		}
		return retryBusy, FromBackend
	}
	if e.Stage != 0 {
		return f.fromStaging(pg, e, buf), FromBackend
	}
	// Fetching here means the prefetch worker's (this thread's own reads are over): its batch
	// may still be queued behind others, and a batch's read and install take longer than one
	// page's, so the page is read again here rather than waited for. Whichever install comes
	// second finds the page changed and drops its copy (unchanged, readEvicted's same).
	// Evicted: a re-fault, which is what the prefetcher learns from.
	src = FromBackend
	if f.pf.pred != nil {
		defer func() {
			if o == served { // not a retry: the prefetcher sees each re-fault once
				f.predict(pg, src == FromCache) // after the install and its wake: the program runs on meanwhile
			}
		}()
	}
	if e.Slot == 0 {
		n, err := f.installUnlocked(e, pg, unsafe.Pointer(&zeros[0]), 0)
		f.clock.installed(IoctlCopy)
		return f.installed(pg, n, err, pagetable.Written, 0, FromZero), FromZero
	}
	if c := f.cache; c != nil && c.take(f, pg, e, buf) {
		src = FromCache
		f.clock.mark(&f.clock.lookup)
	} else {
		f.clock.mark(&f.clock.lookup)
		f.clock.slot = e.Slot
		same, err := f.readEvicted(pg, e, buf)
		if err != nil {
			f.host.Fail(fmt.Errorf("page %#x: %w", pg, err))
			return served, FromBackend
		}
		f.clock.mark(&f.clock.fetch)
		if !same {
			return retryBusy, FromBackend
		}
	}
	d := f.table.Refetch(e, write)
	mode := uffd.CopyWP // Clean: the first write arrives as a WP fault
	if d != pagetable.Clean {
		mode = 0
	}
	n, err := f.installUnlocked(e, pg, unsafe.Pointer(&buf[0]), mode)
	f.clock.installed(IoctlCopy)
	return f.installed(pg, n, err, d, e.Slot, src), src
}

// endFarmemRead ends a fault on a page recorded resident in a process that is gone. No thread of
// the process waits in it; farmem's own read of the page can (an eviction batch copying a
// victim out, which keeps the memory alive), and waits until the fault is answered. A zero
// page answers it: no program will ever see the page, and the batch's copy dies with the
// process's table. Anything but an install would leave the read, and the batch that retire
// waits for, stuck for ever.
func (f *Fetcher) endFarmemRead(pg uint64) outcome {
	_, err := f.ZeroPage(pg, ps, 0)
	switch err {
	case nil, unix.EEXIST, unix.ENOENT, unix.ESRCH:
		return served
	case unix.EAGAIN:
		return retryEvent
	}
	f.host.Fail(fmt.Errorf("page %#x of a process gone: %w", pg, err))
	return served
}

// installUnlocked installs evicted page pg (entry e, its table locked) from src, with the table
// unlocked across the ioctl, and returns with it locked again. The ioctl wakes the faulting
// thread, which on its CPU runs at once, inside the ioctl, until it blocks again: held across
// that, the lock would keep the evictor waiting for the program's next fault, and the unlock
// that ends the wait would cost the fault path a wakeup of the evictor's thread.
//
// e is marked Fetching meanwhile, as for the read (readEvicted): the prefetcher passes it by,
// the evictor cannot choose it (only Resident pages are victims), and the events that could
// discard or move it are applied by this thread only, after. So e is still pg's evicted entry
// when the lock is taken again, and the caller records the install as it would have under it.
func (f *Fetcher) installUnlocked(e *pagetable.Entry, pg uint64, src unsafe.Pointer, mode uint64) (int64, error) {
	if !f.table.Fetch(pg, e) {
		return 0, unix.EEXIST // the agent installed it meanwhile
	}
	f.table.Unlock()
	n, err := f.copy(pg, src, ps, mode)
	f.table.LockForFault()
	f.table.Fetched(pg, e)
	return n, err
}

// readEvicted reads the copy of evicted page pg (entry e, its table locked) into buf. The table
// is unlocked for the read, so that a slow one (a memory server's round trip) holds up neither
// the evictor nor the prefetch worker; e is marked Fetching meanwhile (see the package doc).
// same reports whether pg is still that evicted page afterwards; if not, the fault is resolved
// again from scratch.
func (f *Fetcher) readEvicted(pg uint64, e *pagetable.Entry, buf []byte) (same bool, err error) {
	slot := e.Slot
	if !f.table.Fetch(pg, e) {
		return false, nil // the agent installed it meanwhile
	}
	f.table.Unlock()
	err = f.fetchPage(slot, buf)
	f.table.LockForFault()
	f.table.Fetched(pg, e)
	return f.table.Get(pg) == e && e.State == pagetable.Evicted && e.Slot == slot, err
}

// zeroFill serves the first touch of a page, filling a growing window of following
// never-touched pages when first touches are sequential in one of a few streams.
func (f *Fetcher) zeroFill(pg uint64, write bool) outcome {
	stream, win := f.zero.window(pg, maxZeroWindow)
	k := uint64(1)
	room := uint64(max(f.host.Room(), 1))
	for k < uint64(win) && k < room && f.table.Get(pg+k*ps) == nil {
		k++
	}
	for {
		var n int64
		var err error
		if write {
			n, err = f.copy(pg, unsafe.Pointer(&zeros[0]), k*ps, 0)
			f.clock.installed(IoctlCopy)
		} else {
			n, err = f.ZeroPage(pg, k*ps, 0)
			f.clock.installed(IoctlZeroPage)
		}
		f.clock.pages = int(max(n, 0) / ps)
		if n == 0 && k > 1 && (err == unix.ENOENT || err == unix.EFAULT || err == unix.EEXIST) {
			k = 1 // the window crossed the end of the mapping or a present page
			continue
		}
		if n > 0 {
			for i := int64(0); i < n/ps; i++ {
				f.table.Install(pg+uint64(i)*ps, pagetable.Written, 0)
			}
			f.zero.filled(stream, pg+uint64(n))
			f.stats.ZeroFills.Add(1)
			f.stats.ZeroPages.Add(n / ps)
			return served
		}
		return f.failed(pg, err)
	}
}

// installed finishes a one-page install of slot (or zeros if slot is 0) from src: the demand
// re-fault of an evicted page, which tells the replacement policy the page is in use.
func (f *Fetcher) installed(pg uint64, n int64, err error, d pagetable.Dirt, slot backend.Slot, src Source) outcome {
	if n == ps {
		f.table.Refaulted(f.table.Install(pg, d, slot))
		switch src {
		case FromBackend:
			f.stats.BackendFaults.Add(1)
		case FromCache:
			f.stats.PrefetchUsed.Add(1)
		default:
			f.stats.ZeroFills.Add(1)
		}
		return served
	}
	return f.failed(pg, err)
}

// failed interprets an install ioctl's error.
func (f *Fetcher) failed(pg uint64, err error) outcome {
	switch {
	case err == nil:
		return served
	case err == unix.EAGAIN:
		return retryEvent // the page's state may change when the event is read
	case err == unix.EEXIST:
		return f.wake(pg)
	case err == unix.ENOENT, err == unix.ESRCH:
		return served // unmapped meanwhile / the process exited
	}
	f.host.Fail(fmt.Errorf("install page %#x: %w", pg, err))
	return served
}

func (f *Fetcher) wake(pg uint64) outcome {
	err := uffd.Wake(f.fd, pg, ps)
	f.clock.mark(&f.clock.wake)
	if err != nil && err != unix.ESRCH {
		f.host.Fail(fmt.Errorf("wake %#x: %w", pg, err))
	}
	return served
}

// wpFault serves a write to a write-protected page.
func (f *Fetcher) wpFault(pg uint64) outcome {
	t := f.table
	t.LockForFault()
	defer t.Unlock()
	e := t.Get(pg)
	f.clock.mark(&f.clock.lookup)
	switch {
	case e == nil || e.State == pagetable.Resident:
		// First write to a clean page: from now on its slot is stale.
		if e != nil {
			t.FirstWrite(pg, e)
		}
		return f.unprotect(pg)
	case e.State == pagetable.Evicting:
		return served // the evictor wakes the writer once the page is gone
	case e.Zapping, e.State == pagetable.Staged:
		// Our agent is dropping or moving it right now; afterwards the retry finds it absent
		// (and wakes the writer, whose retry faults MISSING) or present again.
		return retryBusy
	}
	// Evicted and not being dropped, yet a write hit its protection: if the page is present it
	// is a fork child's copy of a page the parent was evicting at fork time; its content is the
	// slot's. If absent, this message is stale: the writer was woken already.
	present, err := f.present(pg)
	if err != nil {
		return retryBusy // no pid yet (fork child before its hello)
	}
	if !present {
		return f.wake(pg)
	}
	t.Install(pg, pagetable.Written, e.Slot)
	return f.unprotect(pg)
}

// fromStagedVictim serves a fault on pg, a victim of the batch in flight (e Staged, the table
// locked), from its staging page if the agent has moved it there; ok is false if it has not.
//
// A fault on a Staged page is what a program that keeps using its pages meets most: the batch
// chose pages that were hot again (a collector marking its heap), and the fault would wait out
// the whole batch. A missing fault on a page chosen present means the move took it: the move
// clears the program's entry and fills the staging one under both page-table locks, so the copy
// is whole by the time the fault is read. The staging area is dropped only after the batch's
// commit, which needs the lock held here; the page is read before it is released.
//
// The page goes back written, without a slot: what the batch stores of it is freed by its
// commit, which takes only pages still Staged (and moveOut, before that, passes over pages no
// longer Staged).
func (f *Fetcher) fromStagedVictim(pg uint64, e *pagetable.Entry, buf []byte) (outcome, bool) {
	present, err := f.readStagingCopy(pg, e, buf)
	switch {
	case errors.Is(err, errNoPid) || (err == nil && !present):
		return served, false
	case errors.Is(err, unix.ESRCH):
		return served, true
	case err != nil:
		f.host.Fail(err)
		return served, true
	}
	n, err := f.installUnlocked(e, pg, unsafe.Pointer(&buf[0]), 0)
	f.clock.installed(IoctlCopy)
	if n == ps {
		f.stats.FromStaging.Add(1)
	}
	return f.installed(pg, n, err, pagetable.Written, 0, FromBackend), true
}

// fromStaging serves a fork child's page that its parent had moved out, and not yet stored,
// when it forked (pagetable's Stage): its content is the child's copy of the staging page.
// That copy is present whenever the page is absent (the parent drops its staging area only
// after committing every staged page); it is checked all the same, because the child's copy of
// the area is not registered (its uffd has no EVENT_FORK): an absent page there would read as
// zeros, and a program must never be served zeros for a page we cannot fetch.
func (f *Fetcher) fromStaging(pg uint64, e *pagetable.Entry, buf []byte) outcome {
	present, err := f.readStagingCopy(pg, e, buf)
	switch {
	case errors.Is(err, errNoPid):
		return retryBusy // a fork child before its hello
	case errors.Is(err, unix.ESRCH):
		return served
	case err != nil:
		f.host.Fail(err)
		return served
	case !present:
		f.host.Fail(fmt.Errorf("page %#x: its copy in the staging area is gone", pg))
		return served
	}
	n, err := f.copy(pg, unsafe.Pointer(&buf[0]), ps, 0)
	f.clock.installed(IoctlCopy)
	if n == ps {
		f.stats.FromStaging.Add(1)
	}
	return f.installed(pg, n, err, pagetable.Written, 0, FromBackend)
}

// readStagingCopy reads page pg's copy in the staging area (its entry e's Stage) into buf, if
// the page is there: present false, and nothing read, if not. It looks before it reads: in the
// process that made the area, an absent staging page is registered on the agent's uffd, which
// nobody serves, and the read would wait for ever; in a fork child's copy it would read zeros.
func (f *Fetcher) readStagingCopy(pg uint64, e *pagetable.Entry, buf []byte) (present bool, err error) {
	start, end := f.table.Staging()
	src := start + uint64(e.Stage-1)*ps
	if e.Stage == 0 || src >= end {
		return false, nil
	}
	if present, err = f.present(src); err != nil || !present {
		return present, err
	}
	f.clock.mark(&f.clock.lookup)
	local := []unix.Iovec{{Base: &buf[0]}}
	local[0].SetLen(ps)
	got, err := unix.ProcessVMReadv(f.memPid(), local, []unix.RemoteIovec{{Base: uintptr(src), Len: ps}}, 0)
	if err == unix.ESRCH {
		return true, err
	}
	if err != nil || got != ps {
		return true, fmt.Errorf("page %#x: reading its copy in the staging area (%#x): %d bytes, %v", pg, src, got, err)
	}
	f.clock.mark(&f.clock.fetch) // the read of its copy is this fault's fetch
	return true, nil
}

func (f *Fetcher) unprotect(pg uint64) outcome {
	err := uffd.WriteProtect(f.fd, pg, ps, 0)
	f.clock.installed(IoctlWriteProtect)
	if err == unix.EAGAIN {
		return retryEvent
	}
	if err != nil && err != unix.ENOENT && err != unix.ESRCH {
		f.host.Fail(fmt.Errorf("unprotect %#x: %w", pg, err))
	}
	return served
}

var errNoPid = errors.New("pid not known yet")

// present reads the page's present bit from /proc/PID/pagemap.
func (f *Fetcher) present(pg uint64) (bool, error) {
	pid := f.memPid()
	if pid == 0 {
		return false, errNoPid
	}
	return procfs.PagePresent(pid, pg)
}

// memPid is the pid through which the fault thread reads the process's memory for the fault
// it serves: the process's own, or, for a fork child that has not said hello, the faulting
// thread's process if the Host vouches that it is this child (ForkChild). A child can fault
// before its hello (a static program's child runs the agent's fork entry on its stack), and on
// a page whose content only its own memory holds (its copy of its parent's staging area); a
// fault that waited for the hello would wait for ever. 0: not known yet.
func (f *Fetcher) memPid() int {
	if pid := f.host.Pid(); pid != 0 {
		return pid
	}
	return f.host.ForkChild(f.faultTid)
}

// traceSource is how a fault trace names each Source.
var traceSource = [NumSources]uint8{FromZero: faulttrace.SourceZero, FromBackend: faulttrace.SourceBackend, FromWP: faulttrace.SourceWP, FromCache: faulttrace.SourcePrefetchHit}

// recordFault writes one served fault to the run's fault trace.
func (f *Fetcher) recordFault(flags, pg uint64, src Source, at time.Time) {
	kind := faulttrace.KindRead
	switch {
	case flags&uffd.PagefaultWP != 0:
		kind = faulttrace.KindWP
	case flags&uffd.PagefaultWrite != 0:
		kind = faulttrace.KindWrite
	}
	f.record.Record(faulttrace.Record{Time: at.Sub(f.epoch).Nanoseconds(), Pid: uint32(f.host.Pid()), Kind: kind, Source: traceSource[src], Addr: pg})
}
