package uffd

import (
	"bytes"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// These tests drive the real kernel (Linux >= 6.8 for MOVE, root or access to
// /dev/userfaultfd) against memory mapped in the test process itself.
//
// A thread that touches an unserved registered page sleeps in the kernel until
// the test serves it, so every touch runs on its own goroutine (locked to its
// OS thread, to know its tid) while the test goroutine reads and serves the
// fault; every wait has a timeout so a bug fails the test instead of hanging
// it. The Go runtime never touches the regions mapped here.
//
// Three things about running faults inside a Go process:
//   - The GC is disabled: a stop-the-world cannot stop a goroutine that is
//     blocked in a fault at a non-preemptible point (e.g. inside memmove), and
//     the goroutine that would serve it is stopped too.
//   - sysmon preempts a goroutine "running" for >10ms with a signal (SIGURG),
//     which interrupts the fault wait; the access is retried after the signal
//     and the kernel queues a new, duplicate fault message, or finds the page
//     un-protected by a WPModeDontWake it should still be sleeping through.
//     run blocks SIGURG on the touching threads; the helpers still skip
//     stale fault messages.
//   - A goroutine blocked in a fault (or in fork via RawSyscall) keeps its P,
//     so TestMain ensures GOMAXPROCS >= 2.

const testFeatures = FeaturePagefaultFlagWP | FeatureEventRemap | FeatureEventRemove |
	FeatureEventUnmap | FeatureThreadID | FeatureMove | FeaturePoison

const timeout = 5 * time.Second

func TestMain(m *testing.M) {
	debug.SetGCPercent(-1)
	// A goroutine blocked in a fault keeps its P (it is not in a system call)
	// and, with the preemption signal blocked (see run), cannot give it up:
	// the serving goroutine needs another P.
	if runtime.GOMAXPROCS(0) < 2 {
		runtime.GOMAXPROCS(2)
	}
	os.Exit(m.Run())
}

// fixture is one userfaultfd plus the regions mapped for a test. Cleanup
// closes the descriptor first, which unregisters everything and wakes every
// blocked thread (fault or event), then unmaps.
type fixture struct {
	fd   int
	maps []mapping
}

type mapping struct {
	p unsafe.Pointer
	n uintptr
}

func newFixture(t *testing.T, features uint64) *fixture {
	t.Helper()
	fd, err := Open(unix.O_CLOEXEC | unix.O_NONBLOCK)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	if _, _, err := API(fd, features); err != nil {
		unix.Close(fd)
		t.Fatalf("API(%#x): %v", features, err)
	}
	f := &fixture{fd: fd}
	t.Cleanup(func() {
		unix.Close(f.fd)
		for _, m := range f.maps {
			unix.MunmapPtr(m.p, m.n) // unmapping a hole is not an error; leftovers of a mremap are fine
		}
	})
	return f
}

// mmap maps pages of anonymous private memory and returns it and its address.
func (f *fixture) mmap(t *testing.T, pages int, prot int) ([]byte, uint64) {
	t.Helper()
	n := uintptr(pages) * PageSize
	p, err := unix.MmapPtr(-1, 0, nil, n, prot, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatalf("mmap: %v", err)
	}
	f.maps = append(f.maps, mapping{p, n})
	return unsafe.Slice((*byte)(p), n), uint64(uintptr(p))
}

// region maps and registers pages in mode.
func (f *fixture) region(t *testing.T, pages int, mode uint64) ([]byte, uint64) {
	t.Helper()
	b, addr := f.mmap(t, pages, unix.PROT_READ|unix.PROT_WRITE)
	ioctls, err := Register(f.fd, addr, uint64(len(b)), mode)
	if err != nil {
		t.Fatalf("Register: %v", err)
	}
	want := IoctlWake | IoctlCopy | IoctlZeroPage | IoctlMove | IoctlPoison
	if mode&ModeWP != 0 {
		want |= IoctlWriteProtect
	}
	if ioctls&want != want {
		t.Fatalf("Register ioctls = %#x, want at least %#x", ioctls, want)
	}
	return b, addr
}

// next returns the next message, polling up to the timeout.
func (f *fixture) next(t *testing.T) Msg {
	t.Helper()
	var buf [1]Msg
	deadline := time.Now().Add(timeout)
	for {
		n, err := ReadMsgs(f.fd, buf[:])
		if err == nil {
			if n != 1 {
				t.Fatalf("ReadMsgs = %d messages", n)
			}
			return buf[0]
		}
		if err != unix.EAGAIN {
			t.Fatalf("ReadMsgs: %v", err)
		}
		f.poll(t, deadline)
	}
}

// poll waits until the descriptor is readable (a message is queued).
func (f *fixture) poll(t *testing.T, deadline time.Time) {
	t.Helper()
	for {
		left := time.Until(deadline)
		if left <= 0 {
			t.Fatal("timed out waiting for a userfaultfd message")
		}
		pfd := []unix.PollFd{{Fd: int32(f.fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, int(left.Milliseconds())+1)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			t.Fatalf("poll: %v", err)
		}
		if n == 1 && pfd[0].Revents&unix.POLLIN != 0 {
			return
		}
	}
}

// fault returns the flags and tid of the next fault on page, skipping
// duplicates of faults already served.
func (f *fixture) fault(t *testing.T, page uint64) (flags uint64, tid uint32) {
	t.Helper()
	for {
		m := f.next(t)
		if m.Event() == EventPagefault {
			flags, addr, tid := m.Pagefault()
			if addr == page {
				return flags, tid
			}
		}
		t.Logf("skipping %v while waiting for a fault at %#x", m, page)
	}
}

// event returns the next message of type ev, skipping stale faults.
func (f *fixture) event(t *testing.T, ev uint8) Msg {
	t.Helper()
	for {
		m := f.next(t)
		if m.Event() == ev {
			return m
		}
		if m.Event() != EventPagefault {
			t.Fatalf("got %v, want event %#x", m, ev)
		}
		t.Logf("skipping %v", m)
	}
}

// async runs fn on its own locked OS thread and reports its tid; fn's result
// arrives on the returned channel.
type async struct {
	tid  int
	done chan byte
}

func run(fn func() byte) *async {
	tidc := make(chan int, 1)
	a := &async{done: make(chan byte, 1)}
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		// Block the runtime's preemption signal on this thread while it may
		// sit in a fault: a signal interrupts the fault wait and the retried
		// access would be served by whatever happened meanwhile (e.g. an
		// un-protect with WPModeDontWake), defeating the "still blocked"
		// checks.
		var urg, old unix.Sigset_t
		urg.Val[(unix.SIGURG-1)/64] |= 1 << ((unix.SIGURG - 1) % 64)
		unix.PthreadSigmask(unix.SIG_BLOCK, &urg, &old)
		defer unix.PthreadSigmask(unix.SIG_SETMASK, &old, nil)
		tidc <- unix.Gettid()
		a.done <- fn()
	}()
	a.tid = <-tidc
	return a
}

func touchRead(b []byte, off int) *async { return run(func() byte { return b[off] }) }

func touchWrite(b []byte, off int, v byte) *async {
	return run(func() byte { b[off] = v; return b[off] })
}

func (a *async) wait(t *testing.T) byte {
	t.Helper()
	select {
	case v := <-a.done:
		return v
	case <-time.After(timeout):
		t.Fatal("timed out waiting for the faulting thread")
		return 0
	}
}

// blocked checks that the thread is still blocked after d.
func (a *async) blocked(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case <-a.done:
		t.Fatal("thread was not blocked")
	case <-time.After(d):
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7) + byte(i>>12)
	}
	return b
}

func TestOpenAPI(t *testing.T) {
	for _, o := range []struct {
		name string
		open func(int) (int, error)
	}{{"Open", Open}, {"dev", openDev}, {"syscall", openSyscall}} {
		fd, err := o.open(unix.O_CLOEXEC | unix.O_NONBLOCK)
		if err != nil {
			t.Fatalf("%s: %v", o.name, err)
		}
		avail, ioctls, err := API(fd, 0)
		if err != nil {
			t.Fatalf("%s: API(0): %v", o.name, err)
		}
		t.Logf("%s: fd %d features %#x ioctls %#x", o.name, fd, avail, ioctls)
		want := FeaturePagefaultFlagWP | FeatureEventFork | FeatureEventRemap | FeatureEventRemove |
			FeatureEventUnmap | FeatureThreadID | FeatureWPUnpopulated | FeaturePoison | FeatureMove
		if avail&want != want {
			t.Errorf("%s: features %#x lack %#x", o.name, avail, want&^avail)
		}
		if w := IoctlAPI | IoctlRegister | IoctlUnregister; ioctls&w != w {
			t.Errorf("%s: ioctls %#x lack %#x", o.name, ioctls, w&^ioctls)
		}
		if _, _, err := API(fd, 0); err != unix.EINVAL {
			t.Errorf("%s: second API = %v, want EINVAL", o.name, err)
		}
		unix.Close(fd)

		// A fresh descriptor accepts every feature the kernel reported.
		fd, err = o.open(unix.O_CLOEXEC | unix.O_NONBLOCK)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := API(fd, avail)
		if err != nil || got != avail {
			t.Errorf("%s: API(%#x) = %#x, %v", o.name, avail, got, err)
		}
		var buf [4]Msg
		if n, err := ReadMsgs(fd, buf[:]); n != 0 || err != unix.EAGAIN {
			t.Errorf("%s: ReadMsgs on idle non-blocking fd = %d, %v; want EAGAIN", o.name, n, err)
		}
		if _, err := ReadMsgs(fd, nil); err != unix.EINVAL {
			t.Errorf("%s: ReadMsgs(nil) = %v, want EINVAL", o.name, err)
		}
		unix.Close(fd)
	}

	// An unknown feature bit is refused, and the kernel zeroes the answer.
	fd, err := Open(unix.O_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if got, ioctls, err := API(fd, 1<<62); err != unix.EINVAL || got != 0 || ioctls != 0 {
		t.Errorf("API(1<<62) = %#x, %#x, %v; want 0, 0, EINVAL", got, ioctls, err)
	}
}

func TestRegisterErrors(t *testing.T) {
	f := newFixture(t, testFeatures)
	g := newFixture(t, testFeatures)
	b, addr := f.region(t, 2, ModeMissing)
	if _, err := Register(g.fd, addr, uint64(len(b)), ModeMissing); err != unix.EBUSY {
		t.Errorf("Register on a range owned by another uffd = %v, want EBUSY", err)
	}
	if _, err := Register(f.fd, addr+1, PageSize, ModeMissing); err != unix.EINVAL {
		t.Errorf("Register unaligned = %v, want EINVAL", err)
	}
	// The kernel only checks that the destination VMA is registered with
	// some userfaultfd of the same mm, not with this one.
	n, err := ZeroPage(g.fd, addr, PageSize, 0)
	t.Logf("ZeroPage on a range registered with another uffd of the same mm = %d, %v", n, err)
	if err := Unregister(f.fd, addr, uint64(len(b))); err != nil {
		t.Fatalf("Unregister: %v", err)
	}
	// Unregistered: the page is an ordinary anonymous page again.
	if v := touchRead(b, 0).wait(t); v != 0 {
		t.Errorf("read %d", v)
	}
}

func TestReadFaultZeroPage(t *testing.T) {
	f := newFixture(t, testFeatures)
	b, addr := f.region(t, 4, ModeMissing|ModeWP)
	a := touchRead(b, PageSize+123)
	flags, tid := f.fault(t, addr+PageSize) // page-aligned: no FeatureExactAddress
	if flags != 0 {
		t.Errorf("read fault flags = %#x, want 0", flags)
	}
	if int(tid) != a.tid {
		t.Errorf("fault tid = %d, want %d", tid, a.tid)
	}
	a.blocked(t, 20*time.Millisecond)
	n, err := ZeroPage(f.fd, addr+PageSize, PageSize, 0)
	if err != nil || n != PageSize {
		t.Fatalf("ZeroPage = %d, %v", n, err)
	}
	if v := a.wait(t); v != 0 {
		t.Errorf("read %d after ZeroPage", v)
	}
	// The zero page is not write-protected: a write is an ordinary COW fault.
	b[PageSize] = 9
	if n, err := ZeroPage(f.fd, addr+PageSize, PageSize, 0); err != unix.EEXIST || n != 0 {
		t.Errorf("ZeroPage over a present page = %d, %v; want 0, EEXIST", n, err)
	}
}

func TestWriteFaultCopy(t *testing.T) {
	f := newFixture(t, testFeatures)
	b, addr := f.region(t, 4, ModeMissing|ModeWP)
	page := addr + 2*PageSize
	a := touchWrite(b, 2*PageSize+5, 0x5a)
	flags, tid := f.fault(t, page)
	if flags != PagefaultWrite {
		t.Errorf("write fault flags = %#x, want %#x", flags, PagefaultWrite)
	}
	if int(tid) != a.tid {
		t.Errorf("fault tid = %d, want %d", tid, a.tid)
	}
	src := pattern(PageSize, 1) // Go heap memory as the source
	n, err := Copy(f.fd, page, unsafe.Pointer(&src[0]), PageSize, 0)
	if err != nil || n != PageSize {
		t.Fatalf("Copy = %d, %v", n, err)
	}
	if v := a.wait(t); v != 0x5a {
		t.Errorf("thread read back %#x", v)
	}
	want := append([]byte(nil), src...)
	want[5] = 0x5a // the write lands after the copy
	if !bytes.Equal(b[2*PageSize:3*PageSize], want) {
		t.Error("page content differs from the copied source")
	}
}

func TestCopyBatch(t *testing.T) {
	f := newFixture(t, testFeatures)
	b, addr := f.region(t, 8, ModeMissing)
	src := pattern(8*PageSize, 3)
	n, err := Copy(f.fd, addr, unsafe.Pointer(&src[0]), 8*PageSize, 0)
	if err != nil || n != 8*PageSize {
		t.Fatalf("Copy 8 pages = %d, %v", n, err)
	}
	if !bytes.Equal(b, src) {
		t.Error("content differs")
	}
	if n, err := Copy(f.fd, addr, unsafe.Pointer(&src[0]), 8*PageSize, 0); err != unix.EEXIST || n != 0 {
		t.Errorf("Copy over present pages = %d, %v; want 0, EEXIST", n, err)
	}
}

// A COPY that stops part-way reports its progress, but the ioctl's error is
// EAGAIN, not the cause: the kernel returns -EAGAIN whenever copied < len.
// The cause (EEXIST here) shows on the retry from dst+copied.
func TestCopyPartial(t *testing.T) {
	f := newFixture(t, testFeatures)
	b, addr := f.region(t, 4, ModeMissing)
	old := pattern(PageSize, 77)
	if _, err := Copy(f.fd, addr+2*PageSize, unsafe.Pointer(&old[0]), PageSize, 0); err != nil {
		t.Fatal(err)
	}
	src := pattern(4*PageSize, 5)
	n, err := Copy(f.fd, addr, unsafe.Pointer(&src[0]), 4*PageSize, 0)
	if n != 2*PageSize || err != unix.EAGAIN {
		t.Fatalf("partial Copy = %d, %v; want %d, EAGAIN", n, err, 2*PageSize)
	}
	n, err = Copy(f.fd, addr+uint64(n), unsafe.Pointer(&src[n]), 4*PageSize-uint64(n), 0)
	if n != 0 || err != unix.EEXIST {
		t.Fatalf("Copy resumed at the present page = %d, %v; want 0, EEXIST", n, err)
	}
	if !bytes.Equal(b[:2*PageSize], src[:2*PageSize]) || !bytes.Equal(b[2*PageSize:3*PageSize], old) {
		t.Error("content differs")
	}
	// Skip the present page and finish.
	n, err = Copy(f.fd, addr+3*PageSize, unsafe.Pointer(&src[3*PageSize]), PageSize, 0)
	if n != PageSize || err != nil {
		t.Fatalf("Copy last page = %d, %v", n, err)
	}
	// Same for ZEROPAGE.
	g := newFixture(t, testFeatures)
	_, addr2 := g.region(t, 4, ModeMissing)
	if _, err := ZeroPage(g.fd, addr2+PageSize, PageSize, 0); err != nil {
		t.Fatal(err)
	}
	if n, err := ZeroPage(g.fd, addr2, 4*PageSize, 0); n != PageSize || err != unix.EAGAIN {
		t.Errorf("partial ZeroPage = %d, %v; want %d, EAGAIN", n, err, PageSize)
	}
}

func TestWriteProtect(t *testing.T) {
	f := newFixture(t, testFeatures)
	b, addr := f.region(t, 2, ModeMissing|ModeWP)
	src := pattern(PageSize, 9)
	if n, err := Copy(f.fd, addr, unsafe.Pointer(&src[0]), PageSize, CopyWP); err != nil || n != PageSize {
		t.Fatalf("Copy WP = %d, %v", n, err)
	}
	if b[10] != src[10] { // reading a write-protected page does not fault
		t.Fatal("content differs")
	}
	a := touchWrite(b, 10, 0xee)
	flags, tid := f.fault(t, addr)
	if flags != PagefaultWP|PagefaultWrite {
		t.Errorf("WP fault flags = %#x, want %#x", flags, PagefaultWP|PagefaultWrite)
	}
	if int(tid) != a.tid {
		t.Errorf("fault tid = %d, want %d", tid, a.tid)
	}
	a.blocked(t, 20*time.Millisecond)
	if err := WriteProtect(f.fd, addr, PageSize, 0); err != nil {
		t.Fatalf("WriteProtect(0): %v", err)
	}
	if v := a.wait(t); v != 0xee {
		t.Errorf("read back %#x", v)
	}

	// Protect again; un-protect with DontWake leaves the thread asleep until Wake.
	if err := WriteProtect(f.fd, addr, PageSize, WPModeWP); err != nil {
		t.Fatalf("WriteProtect(WP): %v", err)
	}
	a = touchWrite(b, 11, 0xdd)
	if flags, _ := f.fault(t, addr); flags != PagefaultWP|PagefaultWrite {
		t.Errorf("WP fault flags = %#x", flags)
	}
	if err := WriteProtect(f.fd, addr, PageSize, WPModeDontWake); err != nil {
		t.Fatalf("WriteProtect(DontWake): %v", err)
	}
	a.blocked(t, 20*time.Millisecond)
	if err := Wake(f.fd, addr, PageSize); err != nil {
		t.Fatalf("Wake: %v", err)
	}
	if v := a.wait(t); v != 0xdd || b[10] != 0xee {
		t.Errorf("read back %#x, %#x", v, b[10])
	}
}

// madvise(MADV_DONTNEED) on a registered range queues REMOVE and blocks the
// caller until the event is read; meanwhile the mm is "changing" and the
// filling ioctls fail with EAGAIN. The event is sent before the pages are
// zapped: they are gone only once madvise returns.
func TestRemoveEvent(t *testing.T) {
	f := newFixture(t, testFeatures)
	b, addr := f.region(t, 4, ModeMissing|ModeWP)
	src := pattern(3*PageSize, 11)
	if _, err := Copy(f.fd, addr, unsafe.Pointer(&src[0]), 3*PageSize, 0); err != nil {
		t.Fatal(err)
	}
	var merr error
	a := run(func() byte { merr = unix.Madvise(b[PageSize:3*PageSize], unix.MADV_DONTNEED); return 0 })
	f.poll(t, time.Now().Add(timeout)) // the event is queued
	a.blocked(t, 20*time.Millisecond)

	if n, err := Copy(f.fd, addr+3*PageSize, unsafe.Pointer(&src[0]), PageSize, 0); err != unix.EAGAIN || n != 0 {
		t.Errorf("Copy with an unread event = %d, %v; want 0, EAGAIN", n, err)
	}
	if n, err := ZeroPage(f.fd, addr+3*PageSize, PageSize, 0); err != unix.EAGAIN || n != 0 {
		t.Errorf("ZeroPage with an unread event = %d, %v; want 0, EAGAIN", n, err)
	}
	if err := WriteProtect(f.fd, addr, PageSize, WPModeWP); err != unix.EAGAIN {
		t.Errorf("WriteProtect with an unread event = %v; want EAGAIN", err)
	}
	if err := Wake(f.fd, addr, PageSize); err != nil {
		t.Errorf("Wake with an unread event = %v; want success", err)
	}

	m := f.event(t, EventRemove)
	if start, end := m.Range(); start != addr+PageSize || end != addr+3*PageSize {
		t.Errorf("REMOVE range %#x-%#x, want %#x-%#x", start, end, addr+PageSize, addr+3*PageSize)
	}
	a.wait(t)
	if merr != nil {
		t.Fatalf("madvise: %v", merr)
	}
	if n, err := Copy(f.fd, addr+3*PageSize, unsafe.Pointer(&src[0]), PageSize, 0); err != nil || n != PageSize {
		t.Errorf("Copy after reading the event = %d, %v", n, err)
	}
	if n, err := Copy(f.fd, addr+PageSize, unsafe.Pointer(&src[0]), PageSize, 0); err != nil || n != PageSize {
		t.Errorf("Copy into a removed page = %d, %v", n, err)
	}
	// The other removed page is absent and still registered: it faults again.
	a = touchRead(b, 2*PageSize)
	f.fault(t, addr+2*PageSize)
	if _, err := ZeroPage(f.fd, addr+2*PageSize, PageSize, 0); err != nil {
		t.Fatal(err)
	}
	if v := a.wait(t); v != 0 {
		t.Errorf("read %d", v)
	}
	if !bytes.Equal(b[:PageSize], src[:PageSize]) {
		t.Error("page 0 changed")
	}
}

// munmap of a registered range blocks until UNMAP is read (sent after the
// unmap itself).
func TestUnmapEvent(t *testing.T) {
	f := newFixture(t, testFeatures)
	b, addr := f.region(t, 4, ModeMissing)
	var merr error
	a := run(func() byte { merr = unix.MunmapPtr(unsafe.Pointer(&b[2*PageSize]), 2*PageSize); return 0 })
	f.poll(t, time.Now().Add(timeout))
	a.blocked(t, 20*time.Millisecond)
	m := f.event(t, EventUnmap)
	if start, end := m.Range(); start != addr+2*PageSize || end != addr+4*PageSize {
		t.Errorf("UNMAP range %#x-%#x, want %#x-%#x", start, end, addr+2*PageSize, addr+4*PageSize)
	}
	a.wait(t)
	if merr != nil {
		t.Fatalf("munmap: %v", merr)
	}
	if _, err := ZeroPage(f.fd, addr+2*PageSize, PageSize, 0); err != unix.ENOENT {
		t.Errorf("ZeroPage on the unmapped range = %v, want ENOENT", err)
	}
}

// mremap moving a registered range reports REMAP, then UNMAP of the old
// range; the registration moves with the pages.
func TestRemapEvent(t *testing.T) {
	f := newFixture(t, testFeatures)
	b, addr := f.region(t, 4, ModeMissing)
	src := pattern(2*PageSize, 13)
	if _, err := Copy(f.fd, addr, unsafe.Pointer(&src[0]), 2*PageSize, 0); err != nil {
		t.Fatal(err)
	}
	nb, naddr := f.mmap(t, 4, unix.PROT_NONE) // the destination, replaced by mremap
	var rerr error
	var got uintptr
	a := run(func() byte {
		r, _, e := unix.Syscall6(unix.SYS_MREMAP, uintptr(addr), 4*PageSize, 4*PageSize,
			unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED, uintptr(naddr), 0)
		got = r
		if e != 0 {
			rerr = e
		}
		return 0
	})
	m := f.event(t, EventRemap)
	if from, to, length := m.Remap(); from != addr || to != naddr || length != 4*PageSize {
		t.Errorf("REMAP %#x -> %#x len %#x, want %#x -> %#x len %#x", from, to, length, addr, naddr, 4*PageSize)
	}
	// With FeatureEventUnmap the old range is then reported unmapped too, and
	// mremap blocks until that second event is read.
	m = f.event(t, EventUnmap)
	if start, end := m.Range(); start != addr || end != addr+4*PageSize {
		t.Errorf("UNMAP after REMAP %#x-%#x, want %#x-%#x", start, end, addr, addr+4*PageSize)
	}
	a.wait(t)
	if rerr != nil || uint64(got) != naddr {
		t.Fatalf("mremap = %#x, %v", got, rerr)
	}
	if !bytes.Equal(nb[:2*PageSize], src) {
		t.Error("content did not move")
	}
	_ = b // now unmapped
	a = touchRead(nb, 3*PageSize)
	f.fault(t, naddr+3*PageSize)
	if _, err := ZeroPage(f.fd, naddr+3*PageSize, PageSize, 0); err != nil {
		t.Fatal(err)
	}
	a.wait(t)
}

func TestMove(t *testing.T) {
	f := newFixture(t, testFeatures)
	dst, daddr := f.region(t, 4, ModeMissing)
	sb, saddr := f.mmap(t, 6, unix.PROT_READ|unix.PROT_WRITE) // unregistered source
	want := pattern(4*PageSize, 17)
	copy(sb, want) // pages 4 and 5 stay holes

	n, err := Move(f.fd, daddr, saddr, 2*PageSize, 0)
	if err != nil || n != 2*PageSize {
		t.Fatalf("Move = %d, %v", n, err)
	}
	if r := resident(t, sb[:4*PageSize]); r != "0011" {
		t.Errorf("source residency after Move = %s, want 0011", r)
	}
	if !bytes.Equal(dst[:2*PageSize], want[:2*PageSize]) {
		t.Error("moved content differs")
	}
	// Resolving a fault by MOVE wakes the faulting thread.
	a := touchRead(dst, 2*PageSize+1)
	f.fault(t, daddr+2*PageSize)
	if n, err := Move(f.fd, daddr+2*PageSize, saddr+2*PageSize, PageSize, 0); err != nil || n != PageSize {
		t.Fatalf("Move = %d, %v", n, err)
	}
	if v := a.wait(t); v != want[2*PageSize+1] {
		t.Errorf("read %#x", v)
	}
	// A hole in the source: ENOENT, or skipped (counted, nothing installed)
	// with MoveAllowSrcHoles.
	if n, err := Move(f.fd, daddr+3*PageSize, saddr+4*PageSize, PageSize, 0); err != unix.ENOENT || n != 0 {
		t.Errorf("Move from a hole = %d, %v; want 0, ENOENT", n, err)
	}
	n, err = Move(f.fd, daddr+3*PageSize, saddr+4*PageSize, PageSize, MoveAllowSrcHoles)
	if err != nil || n != PageSize {
		t.Errorf("Move from a hole, AllowSrcHoles = %d, %v", n, err)
	}
	if r := resident(t, dst); r != "1110" {
		t.Errorf("destination residency = %s, want 1110", r)
	}
	// Onto a present page: EEXIST.
	if n, err := Move(f.fd, daddr, saddr+3*PageSize, PageSize, 0); err != unix.EEXIST || n != 0 {
		t.Errorf("Move onto a present page = %d, %v; want 0, EEXIST", n, err)
	}
	if n, err := Move(f.fd, daddr+3*PageSize, saddr+3*PageSize, PageSize, 0); err != nil || n != PageSize {
		t.Fatalf("Move = %d, %v", n, err)
	}
}

// resident reports mincore(2) for b as a string of '0'/'1' per page, without
// touching (and so populating) the pages.
func resident(t *testing.T, b []byte) string {
	t.Helper()
	v := make([]byte, (len(b)+PageSize-1)/PageSize)
	_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
		uintptr(unsafe.Pointer(&v[0])))
	if e != 0 {
		t.Fatalf("mincore: %v", e)
	}
	for i := range v {
		v[i] = '0' + v[i]&1
	}
	return string(v)
}

func TestPoison(t *testing.T) {
	f := newFixture(t, testFeatures)
	_, addr := f.region(t, 2, ModeMissing)
	if n, err := Poison(f.fd, addr, PageSize, 0); err != nil || n != PageSize {
		t.Fatalf("Poison = %d, %v", n, err)
	}
	if n, err := Poison(f.fd, addr, PageSize, 0); err != unix.EEXIST || n != 0 {
		t.Errorf("Poison twice = %d, %v; want 0, EEXIST", n, err)
	}
	if _, err := ZeroPage(f.fd, addr, PageSize, 0); err != unix.EEXIST {
		t.Errorf("ZeroPage over poison = %v; want EEXIST", err)
	}
}

func TestAllocs(t *testing.T) {
	f := newFixture(t, testFeatures)
	const runs = 100
	b, addr := f.region(t, 2*(runs+1)+1, ModeMissing|ModeWP)
	src := pattern(PageSize, 21)
	var failed error
	check := func(err error) {
		if err != nil && failed == nil {
			failed = err
		}
	}
	page := uint64(0)
	allocs := map[string]float64{
		"Copy": testing.AllocsPerRun(runs, func() {
			_, err := Copy(f.fd, addr+page*PageSize, unsafe.Pointer(&src[0]), PageSize, 0)
			check(err)
			page++
		}),
		"ZeroPage": testing.AllocsPerRun(runs, func() {
			_, err := ZeroPage(f.fd, addr+page*PageSize, PageSize, 0)
			check(err)
			page++
		}),
		"WriteProtect": testing.AllocsPerRun(runs, func() {
			check(WriteProtect(f.fd, addr, PageSize, WPModeWP))
			check(WriteProtect(f.fd, addr, PageSize, 0))
		}),
		"Wake": testing.AllocsPerRun(runs, func() {
			check(Wake(f.fd, addr, PageSize))
		}),
		"ReadMsgs": testing.AllocsPerRun(runs, func() {
			var buf [8]Msg
			if _, err := ReadMsgs(f.fd, buf[:]); err != unix.EAGAIN {
				check(err)
			}
		}),
		"Pagefault": testing.AllocsPerRun(runs, func() {
			var m Msg
			m.Pagefault()
			m.Range()
		}),
	}
	for name, n := range allocs {
		if n != 0 {
			t.Errorf("%s: %v allocations per call, want 0", name, n)
		}
	}
	if failed != nil {
		t.Fatalf("a call failed: %v", failed)
	}
	if b[2*PageSize*0+7] != src[7] || page != 2*(runs+1) {
		t.Errorf("pages not filled (%d)", page)
	}
}

func TestMsgLayout(t *testing.T) {
	var m Msg
	raw := (*[32]byte)(unsafe.Pointer(&m))
	raw[0] = EventPagefault
	put := func(off int, v uint64) { *(*uint64)(unsafe.Pointer(&raw[off])) = v }
	put(8, PagefaultWP|PagefaultWrite)
	put(16, 0x7f0000001000)
	put(24, 0xdeadbeef_00001234) // only the low 32 bits are ptid
	if m.Event() != EventPagefault {
		t.Errorf("event %#x", m.Event())
	}
	if flags, addr, tid := m.Pagefault(); flags != 3 || addr != 0x7f0000001000 || tid != 0x1234 {
		t.Errorf("Pagefault() = %#x, %#x, %#x", flags, addr, tid)
	}
	if from, to, length := m.Remap(); from != 3 || to != 0x7f0000001000 || length != 0xdeadbeef_00001234 {
		t.Errorf("Remap() = %#x, %#x, %#x", from, to, length)
	}
	if start, end := m.Range(); start != 3 || end != 0x7f0000001000 {
		t.Errorf("Range() = %#x, %#x", start, end)
	}
	put(8, 0xffffffff_00000007)
	if fd := m.ForkUFD(); fd != 7 {
		t.Errorf("ForkUFD() = %d", fd)
	}
	if s := m.String(); !strings.HasPrefix(s, "pagefault{") {
		t.Errorf("String() = %q", s)
	}
}

// With UserModeOnly, a fault taken inside the kernel (here read(2) into an
// absent registered page) is not delivered: the system call fails with EFAULT.
func TestUserModeOnly(t *testing.T) {
	fd, err := Open(unix.O_CLOEXEC | unix.O_NONBLOCK | UserModeOnly)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, testFeatures)
	unix.Close(f.fd)
	f.fd = fd
	if _, _, err := API(fd, testFeatures); err != nil {
		t.Fatal(err)
	}
	b, _ := f.region(t, 1, ModeMissing)
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	unix.Write(p[1], []byte("x"))
	var rerr error
	run(func() byte { _, rerr = unix.Read(p[0], b[:1]); return 0 }).wait(t)
	if rerr != unix.EFAULT {
		t.Errorf("read(2) into an absent page = %v, want EFAULT", rerr)
	}
}

// forkExit forks; the child exits at once. It runs nothing but raw system
// calls after the fork, as syscall.forkAndExecInChild does.
//
//go:nosplit
func forkExit() (uintptr, syscall.Errno) {
	pid, _, e := syscall.RawSyscall(unix.SYS_CLONE, uintptr(unix.SIGCHLD), 0, 0)
	if e == 0 && pid == 0 {
		syscall.RawSyscall(unix.SYS_EXIT_GROUP, 0, 0, 0)
	}
	return pid, e
}

// fork(2) with FeatureEventFork blocks the parent until FORK is read; the
// message carries a new userfaultfd for the child's mm, installed in the
// reader's descriptor table.
func TestForkEvent(t *testing.T) {
	f := newFixture(t, testFeatures|FeatureEventFork)
	f.region(t, 2, ModeMissing)
	var pid uintptr
	var ferr syscall.Errno
	a := run(func() byte { pid, ferr = forkExit(); return 0 })
	m := f.event(t, EventFork)
	a.wait(t)
	if ferr != 0 {
		t.Fatalf("fork: %v", ferr)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(int(pid), &ws, 0, nil); err != nil || !ws.Exited() {
		t.Errorf("wait4 = %v, %v", ws, err)
	}
	child := m.ForkUFD()
	if child <= 2 || child == f.fd {
		t.Fatalf("ForkUFD() = %d", child)
	}
	defer unix.Close(child)
	if _, err := unix.FcntlInt(uintptr(child), unix.F_GETFD, 0); err != nil {
		t.Errorf("fcntl(ForkUFD()): %v", err)
	}
	// The child's mm is gone: serving it reports ESRCH.
	if _, err := ZeroPage(child, 0x10000, PageSize, 0); err != unix.ESRCH {
		t.Errorf("ZeroPage on the dead child's uffd = %v", err)
	}
}
