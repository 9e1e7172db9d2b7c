package fetcher

import (
	"os"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

// selfHost serves the test's own process: its faults are the test's reads of its own memory.
type selfHost struct {
	nopHost
	failed atomic.Value // the error Fail was given, if any
}

func (h *selfHost) Pid() int        { return os.Getpid() }
func (h *selfHost) Fail(err error)  { h.failed.Store(err.Error()) }
func (h *selfHost) failure() string { s, _ := h.failed.Load().(string); return s }

// mapRegistered maps n anonymous pages and registers them on a new uffd for missing faults.
func mapRegistered(t *testing.T, n int) (mem []byte, addr uint64, fd int) {
	t.Helper()
	mem, err := unix.Mmap(-1, 0, n*ps, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	fd, err = uffd.Open(unix.O_CLOEXEC | unix.O_NONBLOCK)
	if err != nil {
		t.Skipf("userfaultfd: %v", err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if _, _, err := uffd.API(fd, 0); err != nil {
		t.Fatal(err)
	}
	addr = uint64(uintptr(unsafe.Pointer(&mem[0])))
	if _, err := uffd.Register(fd, addr, uint64(n*ps), uffd.ModeMissing); err != nil {
		t.Fatal(err)
	}
	return mem, addr, fd
}

// storeAndTable returns an embedded store, closed when the test ends (after the fetcher
// serveSelf starts later, whose cleanup runs first), and an empty page table on it.
func storeAndTable(t *testing.T) (*backend.Memory, *pagetable.PageTable) {
	be := backend.NewMemory()
	t.Cleanup(func() { be.Close() })
	var resident atomic.Int64
	return be, pagetable.New(&resident, pagetable.NewSlots(be))
}

// fillPages installs n pages from addr on fd, page k filled with k+1, and returns the buffer
// they were copied from.
func fillPages(t *testing.T, fd int, addr uint64, n int) []byte {
	t.Helper()
	page := make([]byte, ps)
	for k := 0; k < n; k++ {
		for i := range page {
			page[i] = byte(k + 1)
		}
		if _, err := uffd.Copy(fd, addr+uint64(k)*ps, unsafe.Pointer(&page[0]), ps, 0); err != nil {
			t.Fatal(err)
		}
	}
	return page
}

// serveSelf starts a fetcher serving the test's own faults on fd, with table tb and store be,
// stopped when the test ends.
func serveSelf(t *testing.T, fd int, tb *pagetable.PageTable, be backend.Backend) (*Fetcher, *selfHost, *Stats) {
	t.Helper()
	host, stats := &selfHost{}, &Stats{}
	f, err := New(Config{UFFD: fd, Table: tb, Backend: be, Host: host, Stats: stats})
	if err != nil {
		t.Fatal(err)
	}
	f.Start()
	t.Cleanup(func() {
		f.Stop()
		f.Close()
	})
	return f, host, stats
}

// readByte reads b[0] on a goroutine of its own, through a pipe: the kernel's read of it, inside
// write(2), takes the fault and waits there until the fetcher serves it. A Go load would wait in
// user code, where the runtime could not stop that goroutine for a garbage collection, and the
// fetcher's goroutine, this process's too, would then wait for the collection: a deadlock that
// farmem itself never meets, serving other processes.
func readByte(b []byte) <-chan byte {
	c := make(chan byte, 1)
	go func() {
		var p [2]int
		if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
			panic(err)
		}
		defer unix.Close(p[0])
		defer unix.Close(p[1])
		if _, err := unix.Write(p[1], b[:1]); err != nil {
			panic(err)
		}
		var out [1]byte
		unix.Read(p[0], out[:])
		c <- out[0]
	}()
	return c
}

// A fault on a victim of the batch in flight that the agent has already moved is served from
// its copy in the staging area, without waiting for the batch; one on a victim not moved (its
// staging page empty) is not read there, and waits for the batch to commit it.
func TestFaultOnStagedVictim(t *testing.T) {
	const n = 4
	progMem, prog, progFD := mapRegistered(t, n)
	_, stage, stageFD := mapRegistered(t, n) // a staging area (on a uffd of its own here)
	be, tb := storeAndTable(t)
	tb.SetStaging(stage, stage+n*ps)
	page := fillPages(t, progFD, prog, n)
	for k := uint64(0); k < n; k++ {
		tb.Install(prog+k*ps, pagetable.Written, 0)
	}

	// Page 1, staged at index 2, moved there as the agent does.
	moved := prog + ps
	tb.Stage(moved, tb.Get(moved), 2)
	if _, err := uffd.Move(stageFD, stage+2*ps, moved, ps, 0); err != nil {
		t.Skipf("UFFDIO_MOVE: %v", err)
	}
	// Page 3, staged at index 3 and gone from the program, but never moved: its staging page
	// is empty (the record of a page an mremap took, say).
	unmoved := prog + 3*ps
	tb.Stage(unmoved, tb.Get(unmoved), 3)
	if err := unix.Madvise(progMem[3*ps:4*ps], unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}

	f, host, stats := serveSelf(t, progFD, tb, be)

	select {
	case b := <-readByte(progMem[ps:]):
		if b != 2 {
			t.Fatalf("moved victim read %d, want 2 (its content)", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("a fault on a moved victim was not served before the batch committed (fail: %q)", host.failure())
	}
	// The install wakes the reader before the fetcher, which installs with the table unlocked,
	// records it.
	var st pagetable.State
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		tb.Lock()
		st = tb.Get(moved).State
		tb.Unlock()
		if st == pagetable.Resident && stats.FromStaging.Load() == 1 {
			break
		}
	}
	if st != pagetable.Resident || stats.FromStaging.Load() != 1 {
		t.Errorf("moved victim: state %v, FromStaging %d; want Resident, 1", st, stats.FromStaging.Load())
	}

	got := readByte(progMem[3*ps:])
	select {
	case b := <-got:
		t.Fatalf("a fault on a victim not moved was served (%d) before its batch committed", b)
	case <-time.After(100 * time.Millisecond):
	}
	// The batch commits it: stored (its content, 4), Evicted; the fault is then served from
	// its slot.
	for i := range page {
		page[i] = 4
	}
	slots := make([]backend.Slot, 1)
	if err := be.Store(page, slots); err != nil {
		t.Fatal(err)
	}
	tb.Lock()
	tb.CommitStaged(unmoved, tb.Get(unmoved), slots[0])
	tb.Unlock()
	f.waiting.Store(true) // as the fault thread left it, so that Wake writes
	f.Wake()
	select {
	case b := <-got:
		if b != 4 {
			t.Fatalf("victim not moved read %d after its commit, want 4", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("a fault on a victim not moved was not served after its commit (fail: %q)", host.failure())
	}
	if s := host.failure(); s != "" {
		t.Errorf("the fetcher stopped the program: %s", s)
	}
}
