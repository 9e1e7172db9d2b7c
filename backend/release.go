package backend

import (
	"sync"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// trimmer gives the pages of a store's freed blobs back to the kernel on a goroutine of its
// own, so that neither the fault thread nor the evictor, whose Frees make a trim due, makes
// its system calls, and so that the store's lock, which faults wait on, is not held across
// them: trim takes the due arenas' pages under the lock, gives them back without it, and ends
// the trims under it again. The goroutine starts at the first wake: a store that never trims
// (a replay's, most tests') has none, and needs no Close to be collected.
type trimmer struct {
	trim  func() // one round: take, give back, end; the store's own
	kick  chan struct{}
	stop  chan struct{}
	done  chan struct{}
	start sync.Once // runs the goroutine at the first wake, or marks it done at a close before
	halt  sync.Once
}

func newTrimmer(trim func()) *trimmer {
	return &trimmer{trim: trim, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

func (t *trimmer) loop() {
	defer close(t.done)
	for {
		select {
		case <-t.kick:
			t.trim()
		case <-t.stop:
			return
		}
	}
}

// wake asks for a round; it never blocks, and allocates nothing once the goroutine runs.
func (t *trimmer) wake() {
	t.start.Do(func() { go t.loop() })
	select {
	case t.kick <- struct{}{}:
	default: // a round is asked for already
	}
}

// close stops the trimmer, after the round in progress: the store may then unmap its chunks.
// A wake after close starts nothing.
func (t *trimmer) close() {
	t.start.Do(func() { close(t.done) })
	t.halt.Do(func() { close(t.stop) })
	<-t.done
}

// releaser gives ranges of the store's memory back to the kernel (MADV_DONTNEED, or MADV_REMOVE
// for a file arena's, which punches them out of the file), many ranges to one process_madvise
// call: a trim after a program freed memory here and there gives back thousands of single
// pages, and a madvise each costs a system call and a TLB flush on every CPU farmem runs on per
// page. Linux allows process_madvise on the caller itself, named by PIDFD_SELF, since 6.15;
// before that, or for an advice it does not take that way, the first call says so and every
// range then gets a madvise of its own.
type releaser struct {
	iov    []unix.Iovec // ranges waiting for flush
	remove bool         // MADV_REMOVE rather than MADV_DONTNEED; set at construction
}

// maxIovecs is UIO_MAXIOV, the most ranges one process_madvise takes.
const maxIovecs = 1024

// pidfdSelf is PIDFD_SELF as the system call's argument: a negative int's bits.
var pidfdSelf = func() uintptr { fd := unix.PIDFD_SELF; return uintptr(fd) }()

// selfMadviseFails[remove] is set once process_madvise on PIDFD_SELF has failed with that
// advice (see releaser.remove): this kernel has no PIDFD_SELF, or does not take the advice
// through process_madvise.
var selfMadviseFails [2]atomic.Bool

// add queues b (page aligned; its length is rounded up to a page) to be given back.
func (r *releaser) add(b []byte) {
	r.iov = append(r.iov, unix.Iovec{Base: &b[0], Len: uint64(len(b))})
}

// flush gives back every queued range. An error only leaves pages resident: the data on them
// is free either way, so it is not reported.
func (r *releaser) flush() {
	iov := r.iov
	advice, fails := unix.MADV_DONTNEED, &selfMadviseFails[0]
	if r.remove {
		advice, fails = unix.MADV_REMOVE, &selfMadviseFails[1]
	}
	for len(iov) > 0 && !fails.Load() {
		n, _, errno := unix.Syscall6(unix.SYS_PROCESS_MADVISE, pidfdSelf,
			uintptr(unsafe.Pointer(&iov[0])), uintptr(min(len(iov), maxIovecs)), uintptr(advice), 0, 0)
		if errno != 0 {
			if errno == unix.EBADF || errno == unix.EINVAL || errno == unix.ENOSYS || errno == unix.EPERM {
				fails.Store(true)
			}
			break // the loop below takes what is left
		}
		// n is the bytes advised: skip the ranges it covers, all of them unless one failed,
		// which the next call reports.
		done := 0
		for done < len(iov) && uint64(n) >= iov[done].Len {
			n -= uintptr(iov[done].Len)
			done++
		}
		if done == 0 {
			break
		}
		iov = iov[done:]
	}
	for _, v := range iov {
		_ = unix.Madvise(unsafe.Slice(v.Base, v.Len), advice)
	}
	clear(r.iov)
	r.iov = r.iov[:0]
}
