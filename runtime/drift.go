package runtime

import "time"

// drift decides, at each of the rescan loop's polls once armed, which processes to rescan. It
// does no I/O and reads no clock: the loop gives it each process's anonymous RSS as the kernel
// counts it and the pages its page table tracks, and tells it what each rescan adopted.
//
// A process's memory the page table does not track (its gap) is of two kinds. Memory in
// mappings farmem never registers (a JIT's code cache, written copies of a private file
// mapping, mappings smaller than MinRegister) stays untracked whatever a rescan does. Memory in
// a registrable mapping that neither the shim nor the mapping filter reported is what a rescan
// is for: it registers the mapping and adopts the pages. So the gap a rescan leaves is the
// first kind, the process's baseline, and only growth of the gap beyond it calls for a rescan
// at once. Without the baseline, a program holding more than driftPages of unregistrable memory
// (a JVM does) would be rescanned at every poll, its whole /proc/PID/maps read every
// fastestPoll.
// Otherwise a process is rescanned every rescanEvery.
//
// K is the process's key (the loop's *Process; tests use ints). Only the rescan loop calls it.
type drift[K comparable] struct {
	last map[K]time.Time // when each process was last rescanned
	// base is the gap each process's last rescan left, lowered when the gap falls below it
	// (unregistrable memory freed).
	base map[K]int64
}

// driftPages is how far a process's gap may grow beyond its baseline before it is rescanned
// at once: 2 MiB.
const driftPages = 512

// rescanEvery is how often a process is rescanned when its gap does not call for it.
const rescanEvery = 100 * time.Millisecond

func newDrift[K comparable]() *drift[K] {
	return &drift[K]{last: map[K]time.Time{}, base: map[K]int64{}}
}

// observe takes a process's anonymous pages as the kernel counts them (anon) and those its
// page table tracks, at now, and reports whether to rescan it now, and its gap.
func (d *drift[K]) observe(k K, now time.Time, anon, tracked int64) (rescan bool, gap int64) {
	gap = max(anon-tracked, 0)
	d.base[k] = min(d.base[k], gap)
	if now.Sub(d.last[k]) < rescanEvery && gap-d.base[k] < driftPages {
		return false, gap
	}
	return true, gap
}

// rescanned records that a rescan at now, of a process whose gap was gap, adopted adopted
// pages: what it left untracked is the new baseline.
func (d *drift[K]) rescanned(k K, now time.Time, gap, adopted int64) {
	d.last[k] = now
	d.base[k] = max(gap-adopted, 0)
}

// forget drops a process that is gone.
func (d *drift[K]) forget(k K) {
	delete(d.last, k)
	delete(d.base, k)
}
