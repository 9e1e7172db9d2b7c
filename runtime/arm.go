package runtime

import (
	"fmt"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/procfs"
)

// armMargin is how far below the cap arming starts: the memory the program may touch between
// two RSS polls (2 ms) and while arming registers and adopts its mappings. A cap within this
// margin of zero arms at once.
func armMargin(capPages int64) int64 { return max(capPages/4, (32<<20)/PageSize) }

// ContainChildren makes a memory cgroup of the run's own whose usage thresholds say when to arm
// and when the programs near their cap (usageWatch): the program the calling thread, which must
// be locked to its OS thread, starts with attr before it calls started is born in it. Without
// one (no memory controller, no right to make a cgroup) the run polls: the error says why,
// started is still to be called, and nothing else changes.
func (rt *Runtime) ContainChildren(attr *syscall.SysProcAttr) (started func(), err error) {
	w, err := newUsageWatch(attr, rt.armPages*PageSize, rt.nearCapPages()*PageSize)
	if err != nil {
		return func() {}, fmt.Errorf("watching the programs' memory: %w", err)
	}
	tid := unix.Gettid()
	started = func() {
		if err := w.leave(tid); err != nil {
			w.close() // not watched: the rmdir fails while farmem's thread is in it, and the next run sweeps it
			return
		}
		rt.watch.Store(w)
		select {
		case <-rt.stop: // the rescan loop may have ended already
			rt.closeWatch(w)
		default:
		}
	}
	return started, nil
}

// closeWatch closes w unless the rescan loop has (it closes the one it finds as it ends).
func (rt *Runtime) closeWatch(w *usageWatch) {
	if rt.watch.CompareAndSwap(w, nil) {
		w.close()
	}
}

// rescanLoop arms the run when its anonymous memory nears the cap, and from then on finds
// anonymous mappings the shim and the mapping filter could not see and registers them, adopting
// their present pages. Nothing faults in memory we have not registered, so the only sign of it
// is the kernel's count: it reads each process's anonymous RSS (statm, one pread) every
// fastestPoll once armed, less often before (pollInterval), or every slowestPoll while the
// run's memory cgroup is below the threshold that matters (usageWatch); which processes to
// rescan, drift decides.
func (rt *Runtime) rescanLoop() {
	t := time.NewTimer(pollInterval(rt.armed.Load(), 0, rt.armPages))
	defer t.Stop()
	drift := newDrift[*Process]()
	anon := map[*Process]int64{}
	statms := map[*Process]*procfs.Statm{}
	reserve := evictor.NewBurstReserve(rt.cfg.CapPages)
	var lastSweep time.Time // retireSilentForkChildren's and lookAmongChildren's last look
	defer func() {
		for _, s := range statms {
			s.Close()
		}
		if w := rt.watch.Swap(nil); w != nil {
			if b, ok := w.peak(); ok {
				rt.Stats.CgroupPeakBytes.Store(b)
			}
			w.close()
		}
	}()
	for {
		var crossed chan struct{}
		if w := rt.watch.Load(); w != nil {
			crossed = w.crossed
		}
		select {
		case <-rt.stop:
			return
		case <-t.C:
		case <-crossed:
		}
		now := time.Now()
		procs := rt.targets()
		if now.Sub(lastSweep) >= forkSweep {
			rt.retireSilentForkChildren(procs)
			rt.lookAmongChildren(procs)
			lastSweep = now
		}
		var total int64
		clear(anon)
		for _, tg := range procs {
			p := tg.(*Process)
			if p.Pid() == 0 {
				continue
			}
			s := statms[p]
			if s == nil {
				var err error
				if s, err = procfs.OpenStatm(p.Pid()); err != nil {
					continue // it has exited
				}
				statms[p] = s
			}
			anon[p] = s.AnonPages()
			total += anon[p]
		}
		// anon now holds every live process that said hello: whatever else is kept is gone.
		for p, s := range statms {
			if _, ok := anon[p]; !ok {
				s.Close()
				delete(statms, p)
				drift.forget(p)
			}
		}
		if total > rt.Stats.PeakAnonPages.Load() {
			rt.Stats.PeakAnonPages.Store(total)
		}
		if !rt.armed.Load() {
			if total < rt.armPages {
				t.Reset(rt.unarmedInterval(total))
				continue
			}
			rt.arm(total, anon)
			if rt.cfg.OnArm != nil {
				rt.cfg.OnArm(total * PageSize)
			}
			t.Reset(fastestPoll)
			continue
		}
		t.Reset(rt.armedInterval())
		var unmanaged, unseen int64
		for p, a := range anon {
			p.table.Lock()
			tracked := int64(p.table.Resident())
			p.table.Unlock()
			rescan, gap := drift.observe(p, now, a, tracked)
			unmanaged += gap
			if !rescan {
				continue
			}
			n := p.Rescan()
			drift.rescanned(p, now, gap, n)
			unseen += n
		}
		rt.Stats.UnseenPages.Add(unseen)
		rt.evictor.Unmanaged.Store(unmanaged)
		rt.evictor.Reserve.Store(reserve.Observe(now, unseen))
		if rt.evictor.Used() > rt.evictor.HighWater() {
			rt.evictor.Kick()
		}
	}
}

// unarmedInterval is how long the rescan loop may sleep before arming, the programs holding
// total pages: the slowest poll (which only keeps PeakAnonPages current) while the run's
// memory cgroup is below the arming threshold, whose crossing its watch reports; else, or
// with no watch, pollInterval.
func (rt *Runtime) unarmedInterval(total int64) time.Duration {
	if w := rt.watch.Load(); w != nil && w.below(rt.armPages*PageSize) {
		return slowestPoll
	}
	return pollInterval(false, total, rt.armPages)
}

// armedInterval is how long the rescan loop may sleep once armed: the slowest poll while the
// run's memory cgroup is below nearCapPages (the programs' anonymous memory, which the cgroup's
// usage bounds, is then below it too, registered or not: nothing unseen can bring them near the
// cap without crossing it, which the watch reports) and so is what the evictor counts; else the
// fastest.
func (rt *Runtime) armedInterval() time.Duration {
	near := rt.nearCapPages()
	if w := rt.watch.Load(); w != nil && rt.evictor.Used() < near && w.below(near*PageSize) {
		return slowestPoll
	}
	return fastestPoll
}

// nearCapPages is the watch's second threshold: as far below the evictor's lowest low watermark
// as that is below the cap. A paging run stays above it (eviction stops at the low watermark), so
// its crossings, each a wakeup of farmem's, come only when the programs' memory really falls
// or rises, not with every batch; one at the low watermark itself fired twice a batch and cost
// micro's random walk dearly (results/nopaging.md, "Armed but not paging").
func (rt *Runtime) nearCapPages() int64 { return rt.cfg.CapPages - 2*rt.evictor.MaxHead() }

// arm registers every process's mappings. Until the pages already present are adopted,
// Resident undercounts them and the cap cannot hold back new faults, so program faults wait
// (milliseconds, once) rather than let the program grow past the cap meanwhile.
func (rt *Runtime) arm(total int64, procs map[*Process]int64) {
	rt.arming.Store(true)
	rt.armed.Store(true)
	rt.Stats.ArmedAtPages.Store(total)
	for p := range procs {
		rt.filterMappings(p) // first: a mapping made during the rescan is seen either way
		p.Rescan()
	}
	rt.arming.Store(false)
	rt.evictor.Kick()
	for p := range procs {
		p.WakeIfWaiting()
	}
}
