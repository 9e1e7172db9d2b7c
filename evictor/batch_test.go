package evictor

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

// The batch protocols run here against fakeProc, a Target made of the test process's own
// memory: the "program" is a region of it registered MISSING|WP on a real userfaultfd, its
// fault thread a goroutine that reads that uffd (and applies REMOVE events to the page table,
// as the fetcher does), its agent plain calls in this process (madvise, UFFDIO_MOVE into a
// staging area registered on a second uffd with no features, as the shim's make_staging does).

const ps = uffd.PageSize

// The kinds of page the tests lay out, page i of the region holding layout[i].
type kind int

const (
	untouched    kind = iota // never touched: no entry, not a victim
	dirty                    // written, no slot: copied out and stored
	zero                     // written with zeros: copied out, slot 0
	clean                    // installed write-protected from its slot, not written: dropped
	guessSame                // installed writable on a guess, content still its slot's: stored, not WasWritten
	guessNew                 // installed writable on a guess and changed: stored, WasWritten
	discarded                // dirty; discarded by the program while the batch stores, then written again
	refused                  // dirty; the fake agent will not move it (EBUSY): the drop way
	refusedClean             // clean; not moved either (EBUSY): dropped the drop way
	absent                   // dirty; the fake agent reports it absent (ENOENT): left Resident
	rewritten                // dirty; written by the program while the batch stores
)

var layout = []kind{
	dirty, dirty, dirty, dirty, zero, clean, clean, guessSame, guessNew, discarded,
	refused, absent, rewritten, refusedClean, untouched, untouched, dirty, dirty, dirty, dirty,
}

// fakeProc is a Target over a region of this process.
type fakeProc struct {
	t        *testing.T
	mem      []byte // the program's region
	addr     uint64
	fd       int    // its uffd: MISSING|WP, REMOVE and UNMAP events
	stage    []byte // the staging area, BatchPages pages
	stageFd  int    // the staging area's uffd: no features, never read
	staging  bool   // Staging returns the area (else 0: the drop protocol only)
	status   map[uint64]byte
	tb       *pagetable.PageTable
	resident atomic.Int64
	be       *hookBackend
	slots    *pagetable.Slots
	space    backend.Space // the store's part for this process's pages

	stop     int           // eventfd that ends the reader
	done     chan struct{} // closed when the reader has ended
	wpFaults chan uint64   // the pages of WP faults the reader saw
	removed  chan uint64   // the start of each REMOVE the reader applied
	failed   error         // Fail's error
	odd      atomic.Value  // a fault the reader could not serve (string)
	// beforeMove, if set, runs as the agent starts a move: a layout event read then.
	beforeMove func()
	// beforeDrop, if set, runs as the agent starts a drop.
	beforeDrop func()
	// reading is held by the reader across each read of the uffd and the events it applies: a
	// test holds it to keep events unread.
	reading sync.Mutex
}

// hookBackend is a backend that runs onStore, once, as the batch stores: between the copy out
// and the commit.
type hookBackend struct {
	backend.Backend
	onStore func()
}

func (h *hookBackend) Store(src []byte, slots []backend.Slot) error {
	return h.StoreIn(0, src, slots)
}

func (h *hookBackend) StoreIn(sp backend.Space, src []byte, slots []backend.Slot) error {
	if f := h.onStore; f != nil {
		h.onStore = nil
		f()
	}
	return h.Backend.(*backend.Memory).StoreIn(sp, src, slots)
}

func (h *hookBackend) NewSpace() (backend.Space, error) {
	return h.Backend.(*backend.Memory).NewSpace()
}
func (h *hookBackend) EndSpace(sp backend.Space) { h.Backend.(*backend.Memory).EndSpace(sp) }
func (h *hookBackend) Where(s backend.Slot) (backend.Space, int64) {
	return h.Backend.(*backend.Memory).Where(s)
}

func (p *fakeProc) page(i int) uint64  { return p.addr + uint64(i)*ps }
func (p *fakeProc) bytes(i int) []byte { return p.mem[i*ps : (i+1)*ps] }

func (p *fakeProc) Pid() int                    { return os.Getpid() }
func (p *fakeProc) UFFD() int                   { return p.fd }
func (p *fakeProc) Table() *pagetable.PageTable { return p.tb }
func (p *fakeProc) CanEvict() bool              { return true }
func (p *fakeProc) Space() backend.Space        { return p.space }
func (p *fakeProc) Fail(err error)              { p.failed = err }
func (p *fakeProc) WakeIfWaiting()              {}
func (p *fakeProc) Hold() bool                  { return true }
func (p *fakeProc) Release()                    {}

// Fenced is the fetcher's gate as it is before the agent reads the uffd: the kernel's alone.
func (p *fakeProc) Fenced(op func() error) error { return op() }

func (p *fakeProc) Staging() uint64 {
	if !p.staging {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&p.stage[0])))
}

// Drop is the commit, then the agent's madvise(DONTNEED) of each run it returns.
func (p *fakeProc) Drop(commit func() []Run) error {
	runs := commit()
	if p.beforeDrop != nil {
		p.beforeDrop()
	}
	var first error
	for _, r := range runs {
		if _, _, e := unix.Syscall(unix.SYS_MADVISE, uintptr(r.Addr), uintptr(r.Len), unix.MADV_DONTNEED); e != 0 && first == nil {
			first = e
		}
	}
	return first
}

// Move is the agent's UFFDIO_MOVE of each page, in order, to consecutive staging pages from
// dst on, issued on the staging area's uffd. A page in status is not tried: its status is
// reported as if the kernel had refused it. As the agent does, it moves nothing once the page
// table has applied a layout event after the layout-th (ESTALE); here, the event beforeMove
// makes, there, one read under the fence.
func (p *fakeProc) Move(runs []Run, dst uint64, layout uint64, status []byte) error {
	if p.beforeMove != nil {
		p.beforeMove()
	}
	p.tb.Lock()
	stale := p.tb.Layout() != layout
	p.tb.Unlock()
	if stale {
		for k := range status {
			status[k] = byte(unix.ESTALE)
		}
		return nil
	}
	k := 0
	for _, r := range runs {
		for a := r.Addr; a < r.Addr+r.Len; a += ps {
			if st, ok := p.status[a]; ok {
				status[k] = st
			} else {
				err := retryEAGAIN(func() error {
					_, err := uffd.Move(p.stageFd, dst+uint64(k)*ps, a, ps, uffd.MoveDontWake)
					return err
				})
				status[k] = 0
				var errno unix.Errno
				if errors.As(err, &errno) {
					status[k] = byte(errno)
				}
			}
			k++
		}
	}
	return nil
}

// read is the fault thread: it applies REMOVE and UNMAP events to the page table, serves a
// MISSING fault on an evicted page from its slot, and leaves a WP fault waiting (the batch's
// wake releases it) after saying so on wpFaults.
func (p *fakeProc) read() {
	runtime.LockOSThread()
	defer close(p.done)
	var msgs [16]uffd.Msg
	var pending []uint64 // faults to serve again once the events that blocked them are read
	buf := make([]byte, ps)
	for {
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}, {Fd: int32(p.stop), Events: unix.POLLIN}}
		timeout := -1
		if len(pending) > 0 {
			timeout = 1
		}
		if _, err := unix.Poll(fds, timeout); err != nil && err != unix.EINTR {
			p.odd.Store(fmt.Sprintf("poll: %v", err))
			return
		}
		if fds[1].Revents != 0 {
			return
		}
		p.reading.Lock()
		n, err := uffd.ReadMsgs(p.fd, msgs[:])
		if err != nil && err != unix.EAGAIN {
			p.reading.Unlock()
			p.odd.Store(fmt.Sprintf("read: %v", err))
			return
		}
		for _, m := range msgs[:n] {
			switch m.Event() {
			case uffd.EventRemove:
				start, end := m.Range()
				p.tb.Lock()
				p.tb.Removed(start, end, time.Now())
				p.tb.Unlock()
				select {
				case p.removed <- start:
				default:
				}
			case uffd.EventUnmap:
				start, end := m.Range()
				p.tb.Lock()
				p.tb.DiscardRange(start, end)
				p.tb.Unlock()
			case uffd.EventPagefault:
				flags, addr, _ := m.Pagefault()
				page := addr &^ (ps - 1)
				if flags&uffd.PagefaultWP != 0 {
					select { // (a signal makes the writer fault again: the same fault, twice)
					case p.wpFaults <- page:
					default:
					}
					continue
				}
				pending = append(pending, page)
			}
		}
		p.reading.Unlock()
		left := pending[:0]
		for _, page := range pending {
			if !p.serve(page, buf) {
				left = append(left, page)
			}
		}
		pending = left
	}
}

// serve installs an evicted page from its slot, or a page never touched (or discarded) as
// zeros, writable; false: try again later (EAGAIN).
func (p *fakeProc) serve(page uint64, buf []byte) bool {
	p.tb.Lock()
	defer p.tb.Unlock()
	en := p.tb.Get(page)
	if en != nil && en.State == pagetable.Resident {
		uffd.Wake(p.fd, page, ps) // served already: the fault was reported twice (a signal interrupted it)
		return true
	}
	if en != nil && en.State != pagetable.Evicted {
		p.odd.Store(fmt.Sprintf("fault on page %#x, which is not evicted (%+v)", page, en))
		uffd.ZeroPage(p.fd, page, ps, 0)
		return true
	}
	clear(buf)
	var slot backend.Slot
	if en != nil {
		slot = en.Slot
	}
	if slot != 0 {
		if err := p.be.Load(slot, buf); err != nil {
			p.odd.Store(fmt.Sprintf("load of page %#x: %v", page, err))
		}
	}
	_, err := uffd.Copy(p.fd, page, unsafe.Pointer(&buf[0]), ps, 0)
	switch err {
	case nil:
		p.tb.Install(page, pagetable.Written, slot)
	case unix.EAGAIN:
		return false
	case unix.EEXIST:
		uffd.Wake(p.fd, page, ps)
	default:
		p.odd.Store(fmt.Sprintf("copy of page %#x: %v", page, err))
	}
	return true
}

// content is what the test writes into page i of the region: distinct for every page and
// every version (guessNew's slot holds version 0, the program's page version 1).
func content(i, version int) []byte {
	b := make([]byte, ps)
	for j := range b {
		b[j] = byte(i*31 + j*7 + version*101 + 1)
	}
	return b
}

// programContent is what page i, of kind k, holds in the program before any batch.
func programContent(i int, k kind) []byte {
	switch k {
	case zero:
		return make([]byte, ps)
	case guessNew:
		return content(i, 1)
	}
	return content(i, 0)
}

func sum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// newFakeProc maps and fills the region as layout says, registers it, and starts the reader.
func newFakeProc(t *testing.T, staging bool) *fakeProc {
	if os.Geteuid() != 0 {
		t.Skip("needs root for userfaultfd")
	}
	p := &fakeProc{t: t, staging: staging, done: make(chan struct{}), wpFaults: make(chan uint64, 16), removed: make(chan uint64, 64), status: map[uint64]byte{}}
	p.be = &hookBackend{Backend: backend.NewMemory()}
	var err error
	if p.space, err = p.be.NewSpace(); err != nil {
		t.Fatal(err)
	}
	p.slots = pagetable.NewSlots(p.be)
	p.tb = pagetable.New(&p.resident, p.slots)
	mapArea := func(pages int) []byte {
		m, err := unix.Mmap(-1, 0, pages*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			t.Fatal(err)
		}
		unix.Madvise(m, unix.MADV_NOHUGEPAGE)
		t.Cleanup(func() { unix.Munmap(m) })
		return m
	}
	p.mem = mapArea(len(layout))
	p.addr = uint64(uintptr(unsafe.Pointer(&p.mem[0])))
	p.stage = mapArea(BatchPages)
	openUFFD := func(features uint64) int {
		fd, err := uffd.Open(unix.O_CLOEXEC | unix.O_NONBLOCK)
		if err != nil {
			t.Skip(err)
		}
		if _, _, err := uffd.API(fd, features); err != nil {
			unix.Close(fd)
			t.Skip(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	p.fd = openUFFD(uffd.FeatureEventRemove | uffd.FeatureEventUnmap | uffd.FeaturePagefaultFlagWP)
	p.stageFd = openUFFD(0)

	// What the program holds before registration: written pages, present and writable.
	for i, k := range layout {
		switch k {
		case dirty, discarded, refused, absent, rewritten, guessSame:
			copy(p.bytes(i), content(i, 0))
		case guessNew:
			copy(p.bytes(i), content(i, 1))
		case zero:
			p.bytes(i)[0] = 0 // a write: a page of its own, present
		}
	}
	if _, err = uffd.Register(p.fd, p.addr, uint64(len(p.mem)), uffd.ModeMissing|uffd.ModeWP); err != nil {
		t.Fatal(err)
	}
	st := uint64(uintptr(unsafe.Pointer(&p.stage[0])))
	if _, err = uffd.Register(p.stageFd, st, uint64(len(p.stage)), uffd.ModeMissing|uffd.ModeWP); err != nil {
		t.Fatal(err)
	}
	p.stop, err = unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	go p.read()
	t.Cleanup(func() {
		unix.Write(p.stop, []byte{1, 0, 0, 0, 0, 0, 0, 0})
		<-p.done
		unix.Close(p.stop)
	})

	// The page table, and the clean pages installed write-protected from their slots.
	p.tb.Lock()
	defer p.tb.Unlock()
	for i, k := range layout {
		page := p.page(i)
		switch k {
		case dirty, zero, discarded, refused, absent, rewritten:
			p.tb.Install(page, pagetable.Written, 0)
		case clean, refusedClean, guessSame, guessNew:
			slot := p.store(content(i, 0))
			if k == clean || k == refusedClean {
				c := content(i, 0)
				if err := retryEAGAIN(func() error {
					_, err := uffd.Copy(p.fd, page, unsafe.Pointer(&c[0]), ps, uffd.CopyWP)
					return err
				}); err != nil {
					t.Fatal(err)
				}
				p.tb.Install(page, pagetable.Clean, slot)
			} else {
				en := p.tb.Install(page, pagetable.GuessWritten, slot)
				en.Sum = sum(content(i, 0)) // as the eviction that stored the slot left it
			}
		}
		if staging {
			switch k {
			case refused, refusedClean:
				p.status[page] = byte(unix.EBUSY)
			case absent:
				p.status[page] = byte(unix.ENOENT)
			}
		}
	}
	return p
}

func (p *fakeProc) store(b []byte) backend.Slot {
	s := []backend.Slot{0}
	if err := p.be.Store(b, s); err != nil {
		p.t.Fatal(err)
	}
	return s[0]
}

// present reports which of the region's (or the staging area's) pages are in memory.
func present(t *testing.T, m []byte) []bool {
	vec := make([]byte, len(m)/ps)
	if _, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&m[0])), uintptr(len(m)), uintptr(unsafe.Pointer(&vec[0]))); e != 0 {
		t.Fatal(e)
	}
	out := make([]bool, len(vec))
	for i, v := range vec {
		out[i] = v&1 != 0
	}
	return out
}

// evict runs one batch that wants every victim, failing rather than hanging if it never ends
// (a batch holding the page-table lock across the agent or the store would deadlock with the
// reader here).
func evict(t *testing.T, p *fakeProc) (*Evictor, *BatchRecord) {
	var rec *BatchRecord
	e := New(Config{CapPages: 1 << 20, Resident: &p.resident, Backend: p.be,
		Targets: func() []Target { return []Target{p} },
		Trace:   func(r *BatchRecord) { c := *r; rec = &c }})
	errc := make(chan error, 1)
	go func() { errc <- e.evictBatch(p, BatchPages) }()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("evictBatch: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("evictBatch did not return: deadlocked with the fault thread?")
	}
	if p.failed != nil {
		t.Fatalf("Fail(%v)", p.failed)
	}
	if rec == nil {
		t.Fatal("no batch record traced")
	}
	return e, rec
}

// discardAndWrite is the program's madvise(DONTNEED) of page i, then a write of discardMark to
// its first byte: a new page, with an entry of its own. It returns once the reader has applied
// the REMOVE event to the page table (madvise itself returns once the event is read), and the
// write is done.
func (p *fakeProc) discardAndWrite(i int) {
	if err := unix.Madvise(p.bytes(i), unix.MADV_DONTNEED); err != nil {
		p.t.Errorf("madvise: %v", err)
	}
	for start := range p.removed {
		if start == p.page(i) {
			break
		}
	}
	p.write(i, 0, discardMark)
}

const discardMark = 0x5A

// write is the program's write of v at offset off of page i, through a read(2) from a pipe: a
// thread blocked in a fault inside a system call leaves its P to the others, where one blocked
// in a plain store would hold it (and, at GOMAXPROCS=1, starve this process's own fault
// thread). It returns once the write is done.
func (p *fakeProc) write(i, off int, v byte) {
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		p.t.Error(err)
		return
	}
	defer unix.Close(pipe[0])
	defer unix.Close(pipe[1])
	if _, err := unix.Write(pipe[1], []byte{v}); err != nil {
		p.t.Error(err)
		return
	}
	if n, err := unix.Read(pipe[0], p.bytes(i)[off:off+1]); n != 1 {
		p.t.Errorf("write to page %d: %d, %v", i, n, err)
	}
}

// check asserts what a batch must leave of each page, and the counts. The dirty pages in skip
// are left to the caller.
func check(t *testing.T, p *fakeProc, e *Evictor, rec *BatchRecord, skip map[int]bool) {
	t.Helper()
	here := present(t, p.mem)
	p.tb.Lock()
	defer p.tb.Unlock()
	var written, zeros, dropped int
	for i, k := range layout {
		if k == untouched {
			continue
		}
		if skip[i] { // checked by the caller; copied out and stored all the same
			written++
			continue
		}
		en := p.tb.Get(p.page(i))
		what := fmt.Sprintf("page %d (kind %d)", i, k)
		if k == discarded {
			want := make([]byte, ps)
			want[0] = discardMark
			// (Only a present page is read: an absent one would fault, and the fault thread
			// needs the page-table lock held here.)
			if en == nil || en.State != pagetable.Resident || !en.Dirty || !here[i] {
				t.Errorf("%s, discarded and written again during the batch: entry %+v, present %v; want the new page, Resident, dirty and present", what, en, here[i])
			} else if got := p.bytes(i); !bytes.Equal(got, want) {
				t.Errorf("%s, discarded and written again during the batch: content sum %#x, want %#x", what, sum(got), sum(want))
			}
			continue
		}
		if en == nil {
			t.Errorf("%s: no entry", what)
			continue
		}
		if k == absent && p.staging {
			if en.State != pagetable.Resident || !here[i] {
				t.Errorf("%s, reported absent by the move: state %d, present %v; want left Resident and untouched", what, en.State, here[i])
			}
			continue
		}
		if en.State != pagetable.Evicted || en.Zapping || en.Stage != 0 {
			t.Errorf("%s: state %d, Zapping %v, Stage %d; want Evicted, its drop done", what, en.State, en.Zapping, en.Stage)
		}
		if here[i] {
			t.Errorf("%s: still present in the program after the batch", what)
		}
		var want []byte
		switch k {
		case zero:
			zeros++
			if en.Slot != 0 {
				t.Errorf("%s, all zeros: slot %d, want 0", what, en.Slot)
			}
			continue
		case clean, refusedClean:
			dropped++
			want = content(i, 0)
		case guessNew:
			written++
			want = content(i, 1)
		default:
			written++
			want = content(i, 0)
		}
		if en.Slot == 0 {
			t.Errorf("%s: slot 0, want its content stored", what)
			continue
		}
		if sp, _ := p.be.Backend.(*backend.Memory).Where(en.Slot); (k == dirty || k == guessNew) && sp != p.space {
			t.Errorf("%s: stored in space %d, want the process's own, %d", what, sp, p.space)
		}
		got := make([]byte, ps)
		if err := p.be.Load(en.Slot, got); err != nil {
			t.Errorf("%s: load of slot %d: %v", what, en.Slot, err)
		} else if !bytes.Equal(got, want) {
			t.Errorf("%s: slot %d holds something else than the page held (sum %#x, want %#x)", what, en.Slot, sum(got), sum(want))
		}
		if k != clean && k != refusedClean && en.Sum != sum(want) {
			t.Errorf("%s: Sum %#x, want the copied content's %#x", what, en.Sum, sum(want))
		}
		if wantWritten := k != clean && k != refusedClean && k != guessSame; en.WasWritten != wantWritten {
			t.Errorf("%s: WasWritten %v, want %v", what, en.WasWritten, wantWritten)
		}
	}
	if n := e.Stats.Written.Load(); n != int64(written) || rec.Written != written {
		t.Errorf("written: Stats %d, record %d; want %d", n, rec.Written, written)
	}
	if n := e.Stats.Zero.Load(); n != int64(zeros) || rec.Zero != zeros {
		t.Errorf("zero: Stats %d, record %d; want %d", n, rec.Zero, zeros)
	}
	if n := e.Stats.Dropped.Load(); n != int64(dropped) || rec.Dropped != dropped {
		t.Errorf("dropped clean: Stats %d, record %d; want %d", n, rec.Dropped, dropped)
	}
	// Every slot stored is an evicted page's: the clean ones kept theirs, the guessed ones'
	// old slots were released, the discarded page's was freed.
	if n := p.be.Stored(); n != written+dropped {
		t.Errorf("backend holds %d pages, want %d (%d written, %d clean)", n, written+dropped, written, dropped)
	}
	if n := e.Stats.Aborted.Load(); n != 0 {
		t.Errorf("%d batches aborted", n)
	}
	if s, ok := p.odd.Load().(string); ok {
		t.Errorf("fault thread: %s", s)
	}
}

func victims() (n int) {
	for _, k := range layout {
		if k != untouched {
			n++
		}
	}
	return n
}

// The move protocol: every victim the agent moves is copied out of the staging area (clean
// ones not), stored, and committed; the staging area is dropped whole; a victim the agent
// could not move goes the drop way; one it found absent is left alone; one the program
// discarded meanwhile is not committed and its slot is freed.
func TestBatchMove(t *testing.T) {
	p := newFakeProc(t, true)
	p.be.onStore = func() { p.discardAndWrite(9) } // after the copy out, before the commit
	e, rec := evict(t, p)
	check(t, p, e, rec, nil)

	n := victims()
	notMoved := 3 // refused, refusedClean, absent
	if rec.Victims != n || rec.Staged != n-notMoved || e.Stats.Staged.Load() != int64(n-notMoved) {
		t.Errorf("victims %d, staged %d (Stats %d); want %d, %d", rec.Victims, rec.Staged, e.Stats.Staged.Load(), n, n-notMoved)
	}
	if a := e.Stats.Absent.Load(); a != 1 {
		t.Errorf("Absent %d, want 1", a)
	}
	// Only the two refused pages left the program by a drop, in two runs.
	if r := e.Stats.Removes.Load(); r != 2 {
		t.Errorf("Removes %d, want 2: the refused pages' runs", r)
	}
	for i, in := range present(t, p.stage) {
		if in {
			t.Errorf("staging page %d still present after the batch: the next batch's move to it would fail", i)
		}
	}
	if got := p.bytes(11); !bytes.Equal(got, content(11, 0)) { // present: reading it cannot fault
		t.Errorf("the page reported absent was changed")
	}
	if r := p.resident.Load(); r != 2 {
		t.Errorf("resident %d, want 2: the page reported absent, the page discarded and written again", r)
	}
}

// A batch whose victims' layout changed between the choice and the move (the agent read a
// layout event: ESTALE) evicts none of them and loses none: each is left resident, with its
// content, and queued again, and the next batch takes them all.
func TestBatchMoveStale(t *testing.T) {
	p := newFakeProc(t, true)
	p.beforeMove = func() {
		p.tb.Lock()
		p.tb.LayoutChanged(1)
		p.tb.Unlock()
	}
	e, rec := evict(t, p)
	n := victims()
	if rec.Victims != n || rec.Staged != 0 || e.Stats.Stale.Load() != int64(n) {
		t.Errorf("victims %d, staged %d, stale %d; want %d, 0, %d", rec.Victims, rec.Staged, e.Stats.Stale.Load(), n, n)
	}
	here := present(t, p.mem)
	p.tb.Lock()
	for i, k := range layout {
		if k == untouched {
			continue
		}
		if en := p.tb.Get(p.page(i)); en == nil || en.State != pagetable.Resident || en.Stage != 0 || !here[i] {
			t.Errorf("page %d (kind %d): entry %+v, present %v; want left Resident and present", i, k, en, here[i])
		}
	}
	p.tb.Unlock()
	for i, k := range layout {
		if k != untouched && !bytes.Equal(p.bytes(i), programContent(i, k)) {
			t.Errorf("page %d (kind %d): content changed by a stale batch", i, k)
		}
	}
	if r := p.resident.Load(); r != int64(n) {
		t.Errorf("resident %d, want %d", r, n)
	}
	p.beforeMove = nil
	_, rec = evict(t, p)
	if rec.Victims != n || rec.Staged != n-3 { // refused, refusedClean, absent
		t.Errorf("the next batch: victims %d, staged %d; want %d, %d", rec.Victims, rec.Staged, n, n-3)
	}
}

// The drop protocol: the dirty victims are write-protected, copied out, stored, committed,
// dropped by the agent and their writers woken; clean ones are dropped with no store; a write
// that comes during the batch waits for it and lands on the stored copy; a page the program
// discarded meanwhile is not committed and its slot is freed.
func TestBatchDrop(t *testing.T) {
	p := newFakeProc(t, false)
	const rewrittenPage = 12
	wrote := make(chan struct{})
	p.be.onStore = func() {
		// The program discards one victim and writes another while the batch stores.
		p.discardAndWrite(9)
		go func() {
			p.write(rewrittenPage, 100, 0xAB)
			close(wrote)
		}()
		// The write either went through (nothing protected the page) or waits on the
		// protection; the batch must not go on before it is one or the other.
		select {
		case <-wrote:
		case page := <-p.wpFaults:
			if page != p.page(rewrittenPage) {
				t.Errorf("WP fault on %#x, want %#x", page, p.page(rewrittenPage))
			}
		}
	}
	e, rec := evict(t, p)
	select {
	case <-wrote:
	case <-time.After(30 * time.Second):
		t.Fatal("the write held by the batch's write-protection was never woken")
	}
	check(t, p, e, rec, map[int]bool{rewrittenPage: true})

	// The rewritten page was stored as it was before the write, then brought back (by the
	// write's fault) with the write on it.
	en := func() pagetable.Entry {
		p.tb.Lock()
		defer p.tb.Unlock()
		return *p.tb.Get(p.page(rewrittenPage))
	}()
	stored := make([]byte, ps)
	if err := p.be.Load(en.Slot, stored); err != nil || !bytes.Equal(stored, content(rewrittenPage, 0)) {
		t.Errorf("rewritten page: slot %d (%v) does not hold its content as copied", en.Slot, err)
	}
	want := content(rewrittenPage, 0)
	want[100] = 0xAB
	if !bytes.Equal(p.bytes(rewrittenPage), want) {
		t.Errorf("rewritten page: the write made during the batch was lost")
	}
	if en.State != pagetable.Resident || !en.Dirty {
		t.Errorf("rewritten page: state %d, dirty %v; want Resident and dirty again", en.State, en.Dirty)
	}

	if rec.Victims != victims() || rec.Staged != 0 {
		t.Errorf("victims %d, staged %d; want %d, 0", rec.Victims, rec.Staged, victims())
	}
	// Pages 0-8, 10-13 and 16-19 were dropped from the program (9 was discarded): three runs.
	if r := e.Stats.Removes.Load(); r != 3 {
		t.Errorf("Removes %d, want 3", r)
	}
	if r := p.resident.Load(); r != 2 {
		t.Errorf("resident %d, want 2: the rewritten page, back, and the page discarded and written again", r)
	}
}

// A batch commits nothing of the drop way while a layout event is raised and not read: a victim's
// address may hold another page by then, which the drop would discard. Here, while the batch
// stores, the program unmaps a victim and maps a page of its own at the same address, and the
// fault thread has not read the UNMAP yet when the batch commits: the batch leaves every victim
// in the program, and the program's new page keeps its content.
func TestBatchDropUnreadLayoutEvent(t *testing.T) {
	p := newFakeProc(t, false)
	const replaced = 19 // dirty
	unmapped := make(chan struct{})
	resume := sync.OnceFunc(p.reading.Unlock)
	defer resume()
	mark := bytes.Repeat([]byte{0xC3}, ps)
	p.be.onStore = func() {
		p.reading.Lock() // the fault thread reads nothing more until resume
		go func() {
			// munmap raises its UNMAP once the range is gone, and waits for it to be read.
			unix.Syscall(unix.SYS_MUNMAP, uintptr(p.page(replaced)), ps, 0)
			close(unmapped)
		}()
		fds := []unix.PollFd{{Fd: int32(p.fd), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 10000); n != 1 || err != nil {
			t.Errorf("the UNMAP was not raised: poll %d, %v", n, err)
			return
		}
		// The program's own page at the address, a mapping farmem never registered.
		m, err := unix.MmapPtr(-1, 0, unsafe.Pointer(&p.mem[replaced*ps]), ps,
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED_NOREPLACE)
		if err != nil {
			t.Errorf("mapping a page at the unmapped victim's address: %v", err)
			return
		}
		copy(unsafe.Slice((*byte)(m), ps), mark)
	}
	p.beforeDrop = resume // the drop's REMOVE events must be read
	e, rec := evict(t, p)
	resume()
	select {
	case <-unmapped:
	case <-time.After(30 * time.Second):
		t.Fatal("the munmap's UNMAP event was never read")
	}
	p.reading.Lock() // and applied: the reader holds it from the read until then
	p.reading.Unlock()

	if !bytes.Equal(p.bytes(replaced), mark) {
		t.Errorf("the program's page mapped over the unmapped victim lost its content (sum %#x, want %#x)", sum(p.bytes(replaced)), sum(mark))
	}
	if a, u := e.Stats.Aborted.Load(), e.Stats.Unsettled.Load(); a != 1 || u != 1 {
		t.Errorf("aborted %d, unsettled %d; want 1, 1", a, u)
	}
	if rec.Written != 0 || rec.Dropped != 0 {
		t.Errorf("written %d, dropped %d; want none", rec.Written, rec.Dropped)
	}
	here := present(t, p.mem)
	p.tb.Lock()
	for i, k := range layout {
		if k == untouched || i == replaced {
			continue
		}
		if en := p.tb.Get(p.page(i)); en == nil || en.State != pagetable.Resident || !here[i] {
			t.Errorf("page %d (kind %d): entry %+v, present %v; want left Resident and present", i, k, en, here[i])
		}
	}
	if en := p.tb.Get(p.page(replaced)); en != nil {
		t.Errorf("the unmapped victim still has an entry: %+v", en)
	}
	p.tb.Unlock()
	for i, k := range layout {
		if k != untouched && i != replaced && !bytes.Equal(p.bytes(i), programContent(i, k)) {
			t.Errorf("page %d (kind %d): content changed", i, k)
		}
	}
	before := 0 // the slots made before the batch: the clean and guessed pages'
	for _, k := range layout {
		if k == clean || k == refusedClean || k == guessSame || k == guessNew {
			before++
		}
	}
	if n := p.be.Stored(); n != before {
		t.Errorf("backend holds %d pages, want the %d stored before the batch: the slots stored for nothing were not freed", n, before)
	}
	if s, ok := p.odd.Load().(string); ok {
		t.Errorf("fault thread: %s", s)
	}
}
