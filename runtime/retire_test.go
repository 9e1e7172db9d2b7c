package runtime

import (
	"os"
	"testing"
	"time"
	"unsafe"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
	"golang.org/x/sys/unix"
)

// servedProcess starts a runtime on backend b and serves a process of it (no program: a uffd of
// this process's, with no features) with its fault thread started; it returns the uffd too.
func servedProcess(t *testing.T, b backend.Backend) (*Runtime, *Process, int) {
	t.Helper()
	rt, err := New(Config{CapPages: 1 << 20, Backend: b})
	if err != nil {
		t.Fatal(err)
	}
	rt.Start()
	fd, err := uffd.Open(unix.O_CLOEXEC | unix.O_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := uffd.API(fd, 0); err != nil {
		t.Fatal(err)
	}
	p, err := rt.newProcess(fd, pagetable.New(&rt.resident, rt.slots))
	if err != nil {
		t.Fatal(err)
	}
	rt.mu.Lock()
	rt.procs[p] = true
	rt.mu.Unlock()
	p.fetch.Start()
	return rt, p, fd
}

// A process whose retire has begun but not yet released its slots is still live: the launcher
// closes the backend once Live reaches 0 and Close returns, and a slot released after that
// would free into a closed store. (CI caught exactly this: an exit watcher's retire, waiting
// for an eviction batch to finish, cleared its page table after the backend had closed.)
func TestRetireInProgressKeepsTheRunLive(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for userfaultfd")
	}
	b := backend.NewCompressed(nil)
	rt, p, _ := servedProcess(t, b)

	// The process holds one stored page.
	page := make([]byte, PageSize)
	page[0] = 1
	slot := []backend.Slot{0}
	if err := b.Store(page, slot); err != nil {
		t.Fatal(err)
	}
	p.table.Lock()
	p.table.Install(0x7000_0000, pagetable.Clean, slot[0])
	p.table.Unlock()

	// An eviction batch is in flight on it when it exits.
	if !p.Hold() {
		t.Fatal("Hold of a live process failed")
	}
	retired := make(chan struct{})
	go func() { rt.retire(p); close(retired) }()
	for {
		rt.mu.Lock()
		left := !rt.procs[p]
		rt.mu.Unlock()
		if left {
			break
		}
		time.Sleep(time.Millisecond)
	}
	if n := rt.Live(); n != 1 {
		t.Fatalf("Live() = %d while the process's retire waits for its eviction batch, want 1", n)
	}
	closed := make(chan struct{})
	go func() { rt.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a retire had not released the process's slots")
	case <-time.After(50 * time.Millisecond):
	}
	p.Release()
	<-retired
	<-closed
	if n := rt.Live(); n != 0 {
		t.Errorf("Live() = %d after the retire finished, want 0", n)
	}
	if n := b.Stored(); n != 0 {
		t.Errorf("%d pages still stored after every process retired, want 0", n)
	}
	b.Close()
}

// A retired process's uffd is closed, and its number may be another uffd's by then: a mapping
// the process's filter or shim reports after its retire (their goroutines run on) is registered
// on nothing.
func TestRetiredProcessRegistersNothing(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root for userfaultfd")
	}
	b := backend.NewCompressed(nil)
	defer b.Close()
	rt, p, fd := servedProcess(t, b)
	defer rt.Close()
	rt.armed.Store(true)
	rt.retire(p)

	// The next uffd made takes the retired one's number.
	other, err := uffd.Open(unix.O_CLOEXEC | unix.O_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(other)
	if other != fd {
		t.Skipf("the retired uffd's number %d was not reused (%d)", fd, other)
	}
	if _, _, err := uffd.API(other, 0); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(-1, 0, 4*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	mem[0] = 1 // present: a zero-page request on it answers EEXIST if registered, ENOENT if not
	start := uint64(uintptr(unsafe.Pointer(&mem[0])))
	p.Register(start, 4*PageSize)
	if _, err := uffd.ZeroPage(other, start, PageSize, uffd.ZeroPageDontWake); err != unix.ENOENT {
		t.Fatalf("after the retired process's Register, a zero-page request on the uffd now at its old number: %v, want ENOENT (the range registered on another's uffd)", err)
	}
}
