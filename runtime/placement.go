package runtime

import (
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/procfs"
)

// placement keeps a process's fault thread on the CPU of the thread that faults, and, while the
// process pages, keeps the threads that fault there too.
//
// A wakeup across CPUs can cost far more than a userfaultfd round trip on one CPU
// (docs/DESIGN.md, "Latency": the idle CPU must be interrupted out of the hypervisor). When the
// faulting thread and the fault thread share a CPU, the fault switches straight to the fault
// thread and back, with no interrupt. Where a switch between processes costs more than that
// interrupt, holding the program with the fault thread still paid (results/machine.md). So
// every checkEvery faults the fault thread looks up where the last faulting thread runs (/proc)
// and moves itself there, unless it holds program threads on its CPU already.
//
// Following is not enough: a program left free still ran on both CPUs by turns, and its faults
// went slow; pinned where it ran, it paged several times as fast (results/eviction.md, "Where
// the program runs"). So from the second check on, the faulting thread is pinned to its CPU as
// well. A program that faults from several threads (a JVM's collector, a server's workers) is
// the same: its threads held on the fault thread's CPU paged faster than its threads free on
// both (results/gather/README.md). But holding several threads on one CPU takes away their
// parallelism, which is worth more than the wakeups saved unless the process pages hard; so
// which threads are held is gather's decision, by the rate at which the process faults and the
// share of their CPU the held threads take.
//
// Pinning is inherited by what the pinned thread starts; farmem undoes that where each is born.
// A new thread gets the program's own affinity from the shim's pthread_create (unless the
// program set an affinity itself). A fork child, and a new image after an exec, get it back
// here when they attach (programAffinity). When the holding ends, release gives every thread
// held to a CPU farmem pinned to the program's affinity again (orig). A program thread that the
// program itself pinned to such a CPU is widened too: the price of not tracking its own calls.
//
// A program that stops paging gets its threads back: pinned, they could not be balanced away
// from a CPU other work needs. After quietSpell with no fault, the held threads get the
// program's affinity again (quiet, called from the fault thread's loop through Process.Idle);
// if the program faults again, the next check holds anew.
//
// Where the agent serves the process's faults (ServeInProgram), its fault thread is the one that
// follows, and the faults it served count as farmem's own do (fetcher's topUp).
//
// The shim's agent thread goes to the same CPU. It is ours, not the program's: it only runs
// evictions, and a drop it makes blocks in the kernel until the fault thread reads the REMOVE
// event it raised, a round trip between the two threads that is a direct switch on one CPU.
type placement struct {
	faults int
	cpu    int   // the CPU the fault thread is pinned to; -1 = not pinned
	agent  int32 // the agent thread last pinned to cpu; 0 = none
	// orig is the program's own affinity, set before the fault thread starts and never
	// changed: fewer than two CPUs (or unknown: empty) means nothing to pin.
	orig      unix.CPUSet
	gather    gather // which program threads are held on cpu
	checkedAt int64  // monotonic ns of the last check
	// ran is each held thread's time on a CPU at the last check (ns; schedstat): how much of
	// their CPU the held threads take themselves.
	ran map[int]int64
	// seen is faults when quiet last saw them change, at quietSince (nanotime): while threads
	// are held, a spell of quietSpell with no new fault releases them.
	seen       int
	quietSince int64
	// used has bit c set once farmem pinned a program thread to CPU c (< 64): what a fork
	// child or a new image may have inherited from us. Read by other goroutines (Attach).
	used  atomic.Uint64
	stats *Stats // the run's: HeldThreadsMax, BusyReleases; nil in a placement of no run
	// server is the thread that serves the process's faults where it is not farmem's fault
	// thread: the agent's fault thread (ServeInProgram); 0: the fault thread, which calls fault.
	// It is what moves to the faulting thread's CPU. Set once, by ServeInProgram.
	server atomic.Int32
}

const checkEvery = 512

// quietSpell is how long a held thread may go without a fault before it is released: long
// enough that a program paging steadily never sees it (its faults come every few
// microseconds to milliseconds), short enough that one done with paging is soon free again.
const quietSpell = 1_000_000_000 // ns

// quiet runs on the fault thread at each turn of its loop with no fault pending while a thread
// is held, and the loop's poll then wakes at least every quietSpell/2 (serve): it releases the
// held threads after quietSpell without a fault.
func (pl *placement) quiet(pid, agent int, now int64) {
	if len(pl.gather.held) == 0 {
		return
	}
	if pl.faults != pl.seen {
		pl.seen, pl.quietSince = pl.faults, now
		return
	}
	if now-pl.quietSince < quietSpell {
		return
	}
	pl.gather.quiet()
	pl.release(pid, agent)
	clear(pl.ran)
}

func newPlacement(stats *Stats) placement {
	return placement{cpu: -1, ran: map[int]int64{}, stats: stats}
}

// monoStart makes checkedAt monotonic nanoseconds: time.Since reads the monotonic clock.
var monoStart = time.Now()

// fault notes a fault by tid of process pid, whose agent thread is agent (0: none yet); it
// runs on the fault thread.
func (pl *placement) fault(pid, tid int, agent int32) {
	pl.faults++
	if tid != int(agent) && pl.gather.fault(tid) {
		pl.hold(tid)
	}
	if pl.faults%checkEvery != 1 || pid == 0 {
		return
	}
	now := int64(time.Since(monoStart))
	window := time.Duration(now - pl.checkedAt)
	pl.checkedAt = now
	if len(pl.gather.held) == 0 { // else the threads that fault are held where the fault thread is
		cpu, err := procfs.ThreadCPU(pid, tid)
		if err != nil {
			return
		}
		if cpu != pl.cpu {
			var set unix.CPUSet
			set.Set(cpu)
			if unix.SchedSetaffinity(int(pl.server.Load()), &set) != nil {
				return
			}
			pl.cpu, pl.agent = cpu, 0
		}
	}
	var set unix.CPUSet
	set.Set(pl.cpu)
	// A fork child's agent is a new thread; an agent that exited is ESRCH, retried next time.
	if agent != 0 && agent != pl.agent && unix.SchedSetaffinity(int(agent), &set) == nil {
		pl.agent = agent
	}
	// Not at the first check: a fork child starts on its parent's CPU, and the kernel should
	// have a moment to place it before it is held there. The agent is ours, pinned above; its
	// rare faults say nothing of the program.
	if pl.faults <= checkEvery || pl.orig.Count() < 2 || tid == int(agent) {
		return
	}
	busy := 0.0
	if pl.gather.gathering {
		busy = pl.busy(pid, window)
	}
	hold, release := pl.gather.check(tid, now, window, busy)
	if release && pl.stats != nil && pl.gather.crowdedUntil > now {
		pl.stats.BusyReleases.Add(1)
	}
	if release {
		pl.release(pid, int(agent))
		clear(pl.ran)
	}
	if hold {
		pl.hold(tid)
	}
}

// busy returns the share of the window since the last check that the held threads of pid were
// on a CPU (theirs: they are held on one). A thread held since then counts from the next; one
// that exited is forgotten.
func (pl *placement) busy(pid int, window time.Duration) float64 {
	var sum int64
	pl.gather.forget(func(tid int) bool {
		ran, err := procfs.ThreadRan(pid, tid)
		if err != nil {
			delete(pl.ran, tid)
			return true
		}
		if last, ok := pl.ran[tid]; ok {
			sum += ran - last
		}
		pl.ran[tid] = ran
		return false
	})
	if window <= 0 {
		return 0
	}
	return float64(sum) / float64(window)
}

// hold pins program thread tid to the fault thread's CPU.
func (pl *placement) hold(tid int) {
	if pl.cpu < 0 {
		return
	}
	var set unix.CPUSet
	set.Set(pl.cpu)
	if unix.SchedSetaffinity(tid, &set) != nil {
		return // exited meanwhile; gather forgets it at the next release
	}
	if pl.cpu < 64 {
		pl.used.Or(1 << pl.cpu)
	}
	if st := pl.stats; st != nil {
		for n := int64(len(pl.gather.held)); ; {
			m := st.HeldThreadsMax.Load()
			if n <= m || st.HeldThreadsMax.CompareAndSwap(m, n) {
				break
			}
		}
	}
}

// release gives every thread of pid but the agent that farmem's pinning holds to one CPU the
// program's own affinity back.
func (pl *placement) release(pid, agent int) {
	tids, err := procfs.Threads(pid)
	if err != nil {
		return
	}
	for _, tid := range tids {
		if tid == agent {
			continue
		}
		var m unix.CPUSet
		if unix.SchedGetaffinity(tid, &m) == nil && heldBy(m, pl.used.Load()) {
			unix.SchedSetaffinity(tid, &pl.orig) // a thread that exited meanwhile: ESRCH
		}
	}
}

// heldBy reports whether m is a single CPU that used (a bit per CPU) has.
func heldBy(m unix.CPUSet, used uint64) bool {
	if m.Count() != 1 {
		return false
	}
	for c := range 64 {
		if m.IsSet(c) {
			return used&(1<<c) != 0
		}
	}
	return false
}

// programAffinity returns the affinity of the program that attaches as pid: its own, unless it
// holds just one CPU that farmem pinned a thread of from to (from: the parent of a fork child,
// or the image an exec replaced; nil for a new program). Then it inherited that pinning, and
// its main thread is given from's affinity back.
func programAffinity(pid int, from *Process) unix.CPUSet {
	var cur unix.CPUSet
	if unix.SchedGetaffinity(pid, &cur) != nil {
		return unix.CPUSet{} // unknown: never pin
	}
	if from == nil || !heldBy(cur, from.place.used.Load()) || from.place.orig.Count() < 2 {
		return cur
	}
	unix.SchedSetaffinity(pid, &from.place.orig) // exited meanwhile: ESRCH, nothing to undo
	return from.place.orig
}
