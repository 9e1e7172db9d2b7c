package procfs

import (
	"os"
	"os/exec"
	"runtime"
	"slices"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

func TestStatmReadsOwnRSS(t *testing.T) {
	s, err := OpenStatm(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	before := s.AnonPages()
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += PageSize {
		b[i] = 1
	}
	after := s.AnonPages()
	if grew := after - before; grew < (60<<20)/PageSize {
		t.Fatalf("statm saw %d more anonymous pages after touching 16384 (before %d, after %d)", grew, before, after)
	}
	runtime.KeepAlive(b)
}

func TestParseMapsLine(t *testing.T) {
	for _, c := range []struct {
		line string
		want Mapping
		ok   bool
	}{
		{"7f12a8000000-7f12a8021000 rw-p 00000000 00:00 0 ", Mapping{Start: 0x7f12a8000000, End: 0x7f12a8021000, Perms: "rw-p"}, true},
		{"561206ddf000-561206e00000 rw-p 00000000 00:00 0                          [heap]", Mapping{Start: 0x561206ddf000, End: 0x561206e00000, Perms: "rw-p", Path: "[heap]"}, true},
		{"7f12b9fd0000-7f12b9fd4000 rw-p 001d0000 08:01 4242                       /usr/lib/my lib.so", Mapping{Start: 0x7f12b9fd0000, End: 0x7f12b9fd4000, Perms: "rw-p", Offset: 0x1d0000, Inode: 4242, Path: "/usr/lib/my lib.so"}, true},
		{"garbage", Mapping{}, false},
		{"7f12a8000000 rw-p 00000000 00:00 0", Mapping{}, false},
		{"7f12a8000000-zz rw-p 00000000 00:00 0", Mapping{}, false},
	} {
		got, ok := ParseMapsLine(c.line)
		if ok != c.ok || got != c.want {
			t.Errorf("ParseMapsLine(%q) = %+v, %v; want %+v, %v", c.line, got, ok, c.want, c.ok)
		}
	}
}

// Maps lists a mapping made here, and pagemap tells its touched page from its untouched one.
func TestMapsAndPagemap(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("pagemap's present bit is readable without root, its frame numbers are not; root keeps it simple")
	}
	mem, err := unix.Mmap(-1, 0, 2*PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	mem[0] = 1
	addr := uint64(uintptr(unsafe.Pointer(&mem[0])))
	var found bool
	if err := Maps(os.Getpid(), func(m Mapping) {
		if m.Start <= addr && addr+2*PageSize <= m.End && m.Perms == "rw-p" && m.Path == "" {
			found = true
		}
	}); err != nil {
		t.Fatal(err)
	}
	if !found {
		t.Fatalf("no anonymous rw-p mapping holds %#x", addr)
	}
	var e [2]uint64
	if err := Pagemap(os.Getpid(), addr, e[:]); err != nil {
		t.Fatal(err)
	}
	if !Present(e[0]) || Present(e[1]) {
		t.Fatalf("pagemap present bits %v, %v; want the touched page present, the other not", Present(e[0]), Present(e[1]))
	}
	if ok, err := PagePresent(os.Getpid(), addr+PageSize); err != nil || ok {
		t.Fatalf("PagePresent of the untouched page: %v, %v", ok, err)
	}
}

func TestThreads(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	tid := unix.Gettid()
	tids, err := Threads(os.Getpid())
	if err != nil || !slices.Contains(tids, tid) {
		t.Fatalf("Threads = %v, %v; want this thread %d among them", tids, err, tid)
	}
	if g, err := Tgid(tid); err != nil || g != os.Getpid() {
		t.Fatalf("Tgid(%d) = %d, %v; want %d", tid, g, err, os.Getpid())
	}
	cpu, err := ThreadCPU(os.Getpid(), tid)
	if err != nil || cpu < 0 || cpu >= runtime.NumCPU() {
		t.Fatalf("ThreadCPU = %d, %v", cpu, err)
	}
	if r, err := UffdRanges(os.Getpid()); err != nil || len(r) != 0 {
		t.Fatalf("UffdRanges of the test = %v, %v; want none", r, err)
	}
}

// Children finds a child whichever thread started it (Go starts it from any).
func TestChildren(t *testing.T) {
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	kids, err := Children(os.Getpid())
	if err != nil || !slices.Contains(kids, cmd.Process.Pid) {
		t.Fatalf("Children = %v, %v; want %d among them", kids, err, cmd.Process.Pid)
	}
}

func TestStatusBytes(t *testing.T) {
	before, err := StatusBytes(0, "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	b, err := unix.Mmap(-1, 0, 32<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(b)
	for i := 0; i < len(b); i += PageSize {
		b[i] = 1
	}
	after, err := StatusBytes(os.Getpid(), "VmRSS")
	if err != nil {
		t.Fatal(err)
	}
	if after-before < 30<<20 {
		t.Errorf("VmRSS grew %d bytes after touching 32 MiB", after-before)
	}
	if hwm, err := StatusBytes(0, "VmHWM"); err != nil || hwm < after {
		t.Errorf("VmHWM %d (%v), below VmRSS %d", hwm, err, after)
	}
	if _, err := StatusBytes(0, "NoSuchField"); err == nil {
		t.Error("a field status does not have was read")
	}
}
