package pubtable

import (
	"fmt"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Fence is the move fence: a page farmem shares with a process's agent, which orders the agent's
// moves of eviction victims after farmem's reads of the process's uffd (launcher/shim/agent.h,
// move_runs, whose struct fm_fence is its layout). A batch chooses its victims by address; a move
// made after the program changed its layout (an mremap that put another page at a victim's
// address) would take another page for the victim. So farmem reads the uffd under the fence's
// lock and counts there the layout events it read; the agent makes each move under the same lock,
// and only while the count, with the fault thread's (the control page's events read, once the
// agent reads the uffd), is still the one the batch's choice saw. An event raised and not read
// yet the kernel fences itself: the move fails with EAGAIN until it is read.
type Fence struct {
	fd  int
	w   *[fenceWords]atomic.Uint64
	mem []byte
}

const (
	fenceLock   = iota // 0 free; 1 held (by farmem's reader, or by the agent across a move)
	fenceLayout        // farmem: the layout events it read from the uffd
	fenceWords
)

// NewFence makes a fence: a memfd of one page, mapped.
func NewFence() (*Fence, error) {
	fd, err := unix.MemfdCreate("farmem-fence", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("pubtable: fence memfd: %w", err)
	}
	if err := unix.Ftruncate(fd, 4096); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("pubtable: fence memfd: %w", err)
	}
	b, err := unix.Mmap(fd, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("pubtable: mapping the fence: %w", err)
	}
	return &Fence{fd: fd, w: (*[fenceWords]atomic.Uint64)(unsafe.Pointer(&b[0])), mem: b}, nil
}

// Lock takes the fence's lock. The agent holds it across one move of at most 64 pages, and
// never while it waits for anything: Lock spins, then yields, then sleeps a little.
func (f *Fence) Lock() {
	for i := 0; !f.w[fenceLock].CompareAndSwap(0, 1); i++ {
		switch {
		case i < 64:
		case i < 128:
			unix.Syscall(unix.SYS_SCHED_YIELD, 0, 0, 0)
		default:
			time.Sleep(10 * time.Microsecond)
		}
	}
}

// Unlock lets go of the lock.
func (f *Fence) Unlock() { f.w[fenceLock].Store(0) }

// Read counts n layout events read from the uffd; the lock is held.
func (f *Fence) Read(n int) { f.w[fenceLayout].Add(uint64(n)) }

// FD is the fence's memfd, for the agent to map.
func (f *Fence) FD() int { return f.fd }

// Close unmaps the fence and closes its memfd.
func (f *Fence) Close() {
	unix.Munmap(f.mem)
	unix.Close(f.fd)
}
