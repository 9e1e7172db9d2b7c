package runtime

import (
	"slices"
	"time"
)

// gather decides which threads of a program placement holds on the fault thread's CPU. It is
// pure: placement tells it each fault and each check, and carries out what it answers.
//
//   - One thread faults: it is held from the second check on, at any rate (holding one thread
//     takes no parallelism away).
//   - Another thread faults while the process pages fast (its last checkEvery faults came at
//     gatherRate or more): gathering. Every thread that faults is held from its first fault on,
//     so that none of them pays a wakeup across CPUs per fault.
//   - Another thread faults while the process pages slowly, or, gathering, the rate falls below
//     releaseRate: every held thread is released, and the threads are left where the kernel puts
//     them (spread) until the process pages fast again. Two rates, so that a rate near either
//     does not hold and release at every check.
//   - Gathering, the held threads take most of their CPU themselves (busy: their time on it over
//     the last checkEvery faults, a moving average above maxBusy): they compute more than they
//     wait for their pages, and would run faster spread over the CPUs than saved wakeups give
//     back. Paging hard, they leave most of it to the fault thread. Every held thread is
//     released, and none is gathered again for crowdBackoff.
//   - No fault for quietSpell (quiet): every held thread is released.
type gather struct {
	held      []int // program threads held, in the order they were; the first is the one thread's
	gathering bool  // the process pages fast, and several threads fault: each is held at its first fault
	spread    bool  // several threads fault, slowly: none is held
	// busy is the moving average of the held threads' share of their CPU, over the checks
	// since gathering began; crowdedUntil (monotonic ns): until then no gathering, since the held
	// threads crowded their CPU.
	busy         float64
	crowdedUntil int64
}

const (
	// gatherRate is the fault rate from which the threads that fault are held together. A wakeup
	// across CPUs costs several times a fault served on one CPU (docs/DESIGN.md, "Latency"): at
	// this rate the wakeups alone would take a large share of a CPU. Sharing one costs threads
	// that mostly wait for their pages little, wherever a wakeup is cheaper: one fault thread
	// serves the process's faults one at a time, so more CPUs would not serve them sooner.
	// Threads that compute between their faults are another matter: maxBusy.
	gatherRate = 10_000 // faults a second
	// releaseRate is the fault rate below which held threads are released.
	releaseRate = 1_000 // faults a second
	// maxBusy is the share of their CPU the held threads may take themselves, on average over
	// the last busyChecks checks or so. Paging hard, the held threads of the JVMs and of node
	// leave more than half of it to the fault thread and the agent, and ran faster held; two
	// threads computing between their faults took most of it, and ran slower held than free
	// (results/gather/README.md).
	maxBusy    = 0.75
	busyChecks = 8
	// crowdBackoff is how long a process whose held threads crowded their CPU is left spread.
	crowdBackoff = 10 * time.Second
)

// windowOf is the time checkEvery faults take at rate faults a second.
func windowOf(rate int) time.Duration {
	return time.Duration(checkEvery) * time.Second / time.Duration(rate)
}

// fault notes a fault by program thread tid and reports whether tid is to be held now.
func (g *gather) fault(tid int) bool {
	if !g.gathering || slices.Contains(g.held, tid) {
		return false
	}
	g.held = append(g.held, tid)
	return true
}

// check is the check at every checkEvery-th fault, made by program thread tid at now (monotonic
// ns); the last checkEvery faults took window, and the held threads were on their CPU for busy
// of it. It reports whether tid is to be held now, and whether every held thread is to be
// released first (its list is then empty).
func (g *gather) check(tid int, now int64, window time.Duration, busy float64) (hold, release bool) {
	fast := window <= windowOf(gatherRate) && now >= g.crowdedUntil
	switch {
	case g.gathering:
		g.busy += (busy - g.busy) / busyChecks
		if g.busy > maxBusy {
			g.crowdedUntil = now + int64(crowdBackoff)
		} else if window <= windowOf(releaseRate) {
			return false, false // tid was held at its first fault
		}
		g.releaseAll()
		g.spread = true
		return false, true
	case fast && (g.spread || len(g.held) > 0 && g.held[0] != tid):
		g.gathering, g.spread = true, false
		g.held = append(g.held, tid)
		return true, false
	case len(g.held) == 0 && !g.spread:
		g.held = append(g.held, tid)
		return true, false
	case len(g.held) > 0 && g.held[0] != tid: // another thread, slowly
		g.releaseAll()
		g.spread = true
		return false, true
	}
	return false, false
}

// forget drops the held threads gone says are gone (exited), so that a process that starts and
// ends threads while it is gathered does not grow the list every fault searches.
func (g *gather) forget(gone func(tid int) bool) { g.held = slices.DeleteFunc(g.held, gone) }

// quiet notes that the process went quietSpell without a fault: every held thread is to be
// released.
func (g *gather) quiet() { g.releaseAll() }

func (g *gather) releaseAll() {
	g.held = g.held[:0]
	g.gathering = false
	g.busy = 0
}
