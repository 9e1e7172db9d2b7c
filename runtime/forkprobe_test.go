package runtime

import (
	"os"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/uffd"
)

// forkPaused forks this process with a raw fork(2); the child pauses until killed, running no Go
// code. The fork copies this process's memory, so it raises the FORK event of any uffd with
// EVENT_FORK and registered ranges.
//
//go:norace
//go:nosplit
func forkPaused() (int, syscall.Errno) {
	pid, _, errno := syscall.RawSyscall(syscall.SYS_FORK, 0, 0, 0)
	if pid == 0 {
		for {
			syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
		}
	}
	return int(pid), errno
}

// A FORK event's uffd answers the probe "alive" while its child lives and "gone" once the child
// is gone, and the probe installs nothing in a live child.
func TestForkMemoryGone(t *testing.T) {
	mem, err := unix.Mmap(-1, 0, PageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	fd, err := uffd.Open(unix.O_CLOEXEC) // blocking: the reader below waits in read(2)
	if err != nil {
		t.Skipf("userfaultfd: %v", err)
	}
	defer unix.Close(fd)
	if _, _, err := uffd.API(fd, uffd.FeatureEventFork); err != nil {
		t.Skipf("EVENT_FORK: %v", err)
	}
	addr := uint64(uintptr(unsafe.Pointer(&mem[0])))
	if _, err := uffd.Register(fd, addr, PageSize, uffd.ModeMissing); err != nil {
		t.Fatal(err)
	}
	// The fork waits until its event is read: read it on a thread of its own, in the kernel
	// before the fork starts.
	events := make(chan int, 1)
	go func() {
		msgs := make([]uffd.Msg, 1)
		for {
			n, err := uffd.ReadMsgs(fd, msgs)
			if err == unix.EINTR {
				continue
			}
			if err != nil || n != 1 || msgs[0].Event() != uffd.EventFork {
				events <- -1
				return
			}
			events <- msgs[0].ForkUFD()
			return
		}
	}()
	time.Sleep(20 * time.Millisecond)
	pid, errno := forkPaused()
	if errno != 0 {
		t.Fatalf("fork: %v", errno)
	}
	defer func() {
		unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, 0, nil)
	}()
	var child int
	select {
	case child = <-events:
	case <-time.After(10 * time.Second):
		t.Fatal("no FORK event")
	}
	if child < 0 {
		t.Fatal("the uffd gave something other than a FORK event")
	}
	defer unix.Close(child)

	probe, err := vdso(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if memoryGone(child, probe) {
		t.Fatal("a live child's memory reported gone")
	}
	if _, err := vdso(pid); err != nil {
		t.Fatalf("the live child: %v", err)
	}
	unix.Kill(pid, unix.SIGKILL)
	var ws unix.WaitStatus
	if _, err := unix.Wait4(pid, &ws, 0, nil); err != nil {
		t.Fatal(err)
	}
	if !memoryGone(child, probe) {
		t.Fatal("a dead child's memory reported alive")
	}
}
