package runtime

import (
	"errors"

	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/procevents"
	"github.com/farmem/farmem/procfs"
)

// Images nothing told farmem of. An exec ends a served process's control connection
// (ControlEnded), and the mapping filter hands over a vfork child's exec (vforkexec.go); but a
// process has no filter before it installs one (a dynamic process does when the run arms), and an
// image a vfork child of it exec'd before that, posix_spawn's or a shell's, would run unknown for
// good: uncapped, unnamed, and, without a memory cgroup, not even counted towards arming. Such an
// image is a child of a served process that is none of theirs: not served, not sharing its
// parent's memory (a vfork child before its exec), not a fork child that has not exec'd (its
// vDSO is where its forker's is: it says hello, or a fork server is entering it, or it is served
// on its FORK event alone). It is served
// as any exec'd image (serveImage), found two ways: the kernel's process events tell of each
// exec as it happens (watchEvents), where farmem may listen to them (CAP_NET_ADMIN, the initial
// namespaces); and the rescan loop looks among the served processes' children every forkSweep
// (lookAmongChildren), which finds those the events did not tell of, but not an image that lived
// less than that.

// lookAmongChildren serves the images among procs' children that nothing else told of, and
// guards the fork children among them that may have no lifeline (guardIfSilent). Images not in a
// run that enters none (farmem attach, where children the process had before are none of
// farmem's).
func (rt *Runtime) lookAmongChildren(procs []evictor.Target) {
	for _, tg := range procs {
		p := tg.(*Process)
		pid := p.Pid()
		if pid == 0 {
			continue
		}
		kids, err := procfs.Children(pid)
		if err != nil {
			continue
		}
		for _, c := range kids {
			if rt.cfg.Images != nil {
				rt.serveIfUnseen(c, p)
			}
			rt.guardIfSilent(c)
		}
	}
}

// watchEvents acts on the kernel's process events until Close closes them: it serves each image
// a child of a served process exec's as the exec happens (serveIfUnseen; not in a run that enters
// no image), and guards each child a served process forks that turns out to be a fork child with
// no lifeline (guardForked). Events the socket lost are left to the rescan loop's look.
func (rt *Runtime) watchEvents(evs *procevents.Events) {
	for {
		ev, err := evs.Next()
		if errors.Is(err, procevents.ErrLost) {
			continue
		}
		if err != nil {
			return
		}
		switch ev.Kind {
		case procevents.Exec:
			if rt.cfg.Images == nil {
				continue
			}
			ppid, err := procfs.PPid(ev.Pid)
			if err != nil {
				continue // gone already
			}
			if p := rt.Lookup(ppid); p != nil {
				rt.serveIfUnseen(ev.Pid, p)
			}
		case procevents.Fork:
			if rt.servedOfLate(ev.Parent) {
				go rt.guardForked(ev.Pid)
			}
		}
	}
}

// serveIfUnseen serves process c, a child of served process p, if it runs an image nothing else
// told of. Not while p's own vDSO is unknown: a fork child could not be told from an image.
func (rt *Runtime) serveIfUnseen(c int, p *Process) {
	if p.probe == 0 || rt.Lookup(c) != nil {
		return
	}
	if same, err := sameMemory(c, p.Pid()); err != nil || same {
		return // gone, or a vfork child before its exec (the filter, or a later look)
	}
	// A child whose vDSO is where a served process has its own is that process's fork child,
	// whoever its parent is: a clone made with CLONE_PARENT is a child of its forker's parent.
	// An exec places the vDSO anew, at random: an image's meets a served process's by chance.
	if v, err := vdso(c); err != nil || v == p.probe || rt.anyServed(func(q *Process) bool { return q.probe == v }) || rt.imageTaken(c, v) || !execComplete(c) {
		return // gone, a fork child, taken on already, or an exec not done yet
	}
	go rt.serveImage(c, nil, func() bool { return true })
}

// imageTaken reports whether serveImage took on the image of process pid whose vDSO is at v.
func (rt *Runtime) imageTaken(pid int, v uint64) bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.images[pid] == v
}

// claimImage takes on the image process pid runs now for serveImage, unless it was already.
func (rt *Runtime) claimImage(pid int) bool {
	v, err := vdso(pid)
	if err != nil {
		return true // gone: serveImage finds out
	}
	rt.mu.Lock()
	defer rt.mu.Unlock()
	if rt.images[pid] == v {
		return false
	}
	rt.images[pid] = v
	return true
}

// releaseImage drops serveImage's claim on process pid's image.
func (rt *Runtime) releaseImage(pid int) {
	rt.mu.Lock()
	delete(rt.images, pid)
	rt.mu.Unlock()
}
