package pagetable

import (
	"runtime"
	"time"
)

// The table's lock has two kinds of user. The fault thread holds it for a fault the program
// waits on, and on the program's CPU nothing else runs meanwhile; the evictor, the prefetch
// worker and the runtime hold it for work that can wait. A wait is cheap only if the waiter
// does not sleep: a goroutine blocked on a sync.Mutex parks its thread, its CPU goes idle, and
// the unlock must wake that CPU from another, an interrupt that costs tens of microseconds on
// these machines (docs/DESIGN.md, "Latency"). Choosing a batch of victims holds the lock for
// longer than that (BenchmarkVictims), and a fault thread asleep behind it leaves the program's
// CPU idle for most of it (results/eviction.md, "The fault thread waits for the evictor").
//
// So the fault thread takes the lock with LockForFault, which spins for up to faultSpin before
// it sleeps, and says it waits (faultWaiting); Victims, the one long holder, looks at that
// every yieldEvery pages and lets the fault thread go first (yieldToFault).

// faultSpin is how long LockForFault spins before it sleeps: longer than the evictor's other
// holds (a batch's commit, the end of its choice) mostly take, so that the fault thread seldom
// sleeps at all; at a fifth of it, it still sleeps hundreds of times a run of a random walk
// (results/lockwait/README.md, "The spin's length"). The spinning takes the CPU of the fault
// thread, where the faulting thread waits for it anyway; another program thread held there
// (runtime's placement) waits at most this long.
const faultSpin = 100 * time.Microsecond

// yieldEvery is how many queued pages Victims looks at between looks at faultWaiting: a few
// microseconds of its work.
const yieldEvery = 16

// Lock takes the table's lock for work that can wait: everyone's but the fault thread's.
func (t *PageTable) Lock() { t.mu.Lock() }

// Unlock releases the table's lock, however it was taken.
func (t *PageTable) Unlock() { t.mu.Unlock() }

// LockForFault takes the table's lock for the fault thread: it spins a while before it sleeps,
// and a long holder that sees it waiting lets it go first.
func (t *PageTable) LockForFault() {
	if t.mu.TryLock() {
		return
	}
	t.faultWaiting.Add(1)
	defer t.faultWaiting.Add(-1)
	for start := time.Now(); time.Since(start) < faultSpin; {
		for range 64 {
			if t.mu.TryLock() { // a load of the lock's word while it is held
				return
			}
		}
	}
	t.mu.Lock()
}

// yieldToFault lets a fault thread waiting in LockForFault take the lock first, and takes it
// back after; t.mu is held. It reports whether it let go: whatever the caller read under the
// lock may have changed meanwhile.
func (t *PageTable) yieldToFault() bool {
	if t.faultWaiting.Load() == 0 {
		return false
	}
	t.mu.Unlock()
	for t.faultWaiting.Load() != 0 {
		runtime.Gosched()
	}
	t.mu.Lock()
	return true
}
