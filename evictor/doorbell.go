package evictor

import (
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// doorbell wakes the evictor's locked thread straight from the thread that rings it: one futex
// wake, and only when the evictor sleeps. A Go channel does the same with two scheduler
// hand-offs, for the receiving goroutine is locked to its thread: the ringing thread readies
// it, an idle thread is started to run it, and that one hands its P to the locked thread and
// sleeps again (results/floor/perf-farmem-micro-random.md).
//
// word is 0 while the evictor is awake, rung once anyone rang since it last woke, and asleep
// while it waits on the futex. Rings that come while one is pending are one.
type doorbell struct{ word atomic.Uint32 }

const (
	bellQuiet  = 0
	bellRung   = 1
	bellAsleep = 2
)

// ring wakes the evictor, or has its next wait return at once. It never blocks.
func (d *doorbell) ring() {
	// Already rung: nothing to write. The fault path rings at every fault above the high
	// watermark, while a round of eviction runs, so most rings find one pending.
	if d.word.Load() == bellRung {
		return
	}
	if d.word.Swap(bellRung) == bellAsleep {
		futex(&d.word, futexWakePrivate, 1, nil)
	}
}

// wait returns once the bell was rung since the last wait returned, or after timeout (0: none).
// Only the evictor's goroutine calls it.
func (d *doorbell) wait(timeout time.Duration) {
	if d.word.CompareAndSwap(bellQuiet, bellAsleep) {
		var ts *unix.Timespec
		if timeout > 0 {
			t := unix.NsecToTimespec(int64(timeout))
			ts = &t
		}
		// The kernel sleeps only while word is still bellAsleep: a ring between the swap and
		// here makes it return at once. EINTR and spurious wakes return early, which costs one
		// look at the watermarks.
		futex(&d.word, futexWaitPrivate, bellAsleep, ts)
	}
	d.word.Store(bellQuiet)
}

// futex(2)'s operations, from linux/futex.h (x/sys/unix does not define them): WAIT and WAKE,
// private to this process's memory.
const (
	futexWaitPrivate = 0 | 128
	futexWakePrivate = 1 | 128
)

// futex is futex(2) on a word of ours; its errors (EAGAIN: the word changed, ETIMEDOUT, EINTR)
// all mean "look again", which the doorbell's callers do.
func futex(addr *atomic.Uint32, op int, val uint32, ts *unix.Timespec) {
	unix.Syscall6(unix.SYS_FUTEX, uintptr(unsafe.Pointer(addr)), uintptr(op), uintptr(val),
		uintptr(unsafe.Pointer(ts)), 0, 0)
}
