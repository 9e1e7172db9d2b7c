package runtime

import (
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/fetcher"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

// writtenRegistered maps n pages, writes i+1 into page i, and registers them on a new uffd (no
// events: nobody reads them here); all undone when the test ends.
func writtenRegistered(t *testing.T, n int) (mem []byte, start uint64, fd int) {
	t.Helper()
	return writtenRegisteredWith(t, n, 0)
}

// writtenRegisteredWith is writtenRegistered on a uffd with features.
func writtenRegisteredWith(t *testing.T, n int, features uint64) (mem []byte, start uint64, fd int) {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, n*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	for i := range n {
		mem[i*PageSize] = byte(i + 1)
	}
	if fd, err = uffd.Open(unix.O_CLOEXEC | unix.O_NONBLOCK); err != nil {
		t.Skipf("userfaultfd: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, _, err := uffd.API(fd, features); err != nil {
		t.Fatal(err)
	}
	start = uint64(uintptr(unsafe.Pointer(&mem[0])))
	if _, err := uffd.Register(fd, start, uint64(n)*PageSize, RegisterMode); err != nil {
		t.Fatal(err)
	}
	return mem, start, fd
}

// adoptee is this process as a served Process on uffd fd with table, and the fetcher whose gate
// adopt asks through (no fault thread).
func adoptee(t *testing.T, fd int, table *pagetable.PageTable) *Process {
	t.Helper()
	p := &Process{fd: fd, table: table}
	p.pid.Store(int32(os.Getpid()))
	f, err := fetcher.New(fetcher.Config{UFFD: fd, Table: table, Backend: backend.NewMemory(), Host: p, Stats: &fetcher.Stats{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	p.fetch = f
	return p
}

// A page of a registered range that a MAP_FIXED replaced, before the range's present pages were
// adopted, is in a mapping nobody registered: adopting it would let it be evicted, and the
// program would then read the kernel's zero page there instead of faulting. adopt takes every
// present page of the registered mappings, and not that one.
func TestAdoptTakesOnlyRegisteredPages(t *testing.T) {
	const pages = 16
	mem, start, fd := writtenRegistered(t, pages)
	// Page 5 replaced by a fresh mapping, written: present, and registered with nothing.
	const replaced = 5
	at := start + replaced*PageSize
	if _, _, errno := unix.Syscall6(unix.SYS_MMAP, uintptr(at), PageSize, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED, ^uintptr(0), 0); errno != 0 {
		t.Fatal(errno)
	}
	mem[replaced*PageSize] = 99

	var resident atomic.Int64
	p := adoptee(t, fd, pagetable.New(&resident, pagetable.NewSlots(backend.NewMemory())))
	adopted, again, err := p.adopt(start, pages*PageSize)
	if err != nil || again {
		t.Fatal(err, again)
	}
	if adopted != pages-1 {
		t.Errorf("adopted %d pages, want %d (every present page of the registered mappings)", adopted, pages-1)
	}
	for i := range pages {
		e := p.table.Get(start + uint64(i)*PageSize)
		switch {
		case i == replaced && e != nil:
			t.Errorf("page %d, in a mapping not registered, was adopted", i)
		case i != replaced && (e == nil || e.State != pagetable.Resident):
			t.Errorf("page %d, present and registered, was not adopted: %+v", i, e)
		}
	}
	for i := range pages { // the check installed nothing and changed nothing
		want := byte(i + 1)
		if i == replaced {
			want = 99
		}
		if mem[i*PageSize] != want {
			t.Errorf("page %d holds %d, want %d", i, mem[i*PageSize], want)
		}
	}
}

// The program's discard is zapped only after its REMOVE event is read and applied: until then
// its pages are present. adopt must not take them, or the zap would leave them recorded
// resident yet absent, and the next touch would stop the program. Here the discard's event
// was read and its zap is still to come (it never comes: pages 3 and 4 stay present).
func TestAdoptLeavesPagesBeingDiscarded(t *testing.T) {
	const pages = 8
	_, start, fd := writtenRegistered(t, pages)
	var resident atomic.Int64
	p := adoptee(t, fd, pagetable.New(&resident, pagetable.NewSlots(backend.NewMemory())))
	const lo, hi = 3, 5 // the discard's pages
	p.table.Lock()
	p.table.Removed(start+lo*PageSize, start+hi*PageSize, time.Now())
	p.table.Unlock()

	adopted, again, err := p.adopt(start, pages*PageSize)
	if err != nil || again {
		t.Fatal(err, again)
	}
	if adopted != pages-(hi-lo) {
		t.Errorf("adopted %d pages, want %d (every present page but the discard's)", adopted, pages-(hi-lo))
	}
	for i := range pages {
		e := p.table.Get(start + uint64(i)*PageSize)
		switch {
		case i >= lo && i < hi && e != nil:
			t.Errorf("page %d, being discarded, was adopted", i)
		case (i < lo || i >= hi) && (e == nil || e.State != pagetable.Resident):
			t.Errorf("page %d, present and not discarded, was not adopted: %+v", i, e)
		}
	}
}

// While an event is raised and not read, the kernel cannot tell whether a range is still one
// registered mapping of ours (its check fails with EAGAIN). adopt then adopts nothing there and
// says so (again), for the range to be adopted later: pages left untracked for good would never
// be evicted, and the cap would not hold. Once the event is read, the same call adopts them.
func TestAdoptAgainAfterAnUnreadEvent(t *testing.T) {
	const pages = 8
	mem, start, fd := writtenRegisteredWith(t, pages, uffd.FeatureEventRemove)
	var resident atomic.Int64
	p := adoptee(t, fd, pagetable.New(&resident, pagetable.NewSlots(backend.NewMemory())))
	// The program discards its last page: the madvise waits until its REMOVE event is read.
	const discarded = pages - 1
	done := make(chan error, 1)
	go func() { done <- unix.Madvise(mem[discarded*PageSize:], unix.MADV_DONTNEED) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := uffd.ZeroPage(fd, start, PageSize, uffd.ZeroPageDontWake); err == unix.EAGAIN {
			break // the event is raised
		}
		if time.Now().After(deadline) {
			t.Fatal("the discard raised no event")
		}
	}
	adopted, again, err := p.adopt(start, pages*PageSize)
	if err != nil || !again || adopted != 0 {
		t.Fatalf("with an event unread: adopted %d, again %v, %v; want 0, true, nil", adopted, again, err)
	}
	msgs := make([]uffd.Msg, 4)
	if n, err := uffd.ReadMsgs(fd, msgs); err != nil || n != 1 || msgs[0].Event() != uffd.EventRemove {
		t.Fatalf("reading the event: %d messages, %v", n, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	adopted, again, err = p.adopt(start, pages*PageSize)
	if err != nil || again || adopted != pages-1 {
		t.Fatalf("once the event is read: adopted %d, again %v, %v; want %d, false, nil", adopted, again, err, pages-1)
	}
}
