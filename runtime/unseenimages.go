package runtime

import (
	"github.com/farmem/farmem/evictor"
	"github.com/farmem/farmem/procfs"
)

// Images nothing told farmem of. An exec ends a served process's control connection
// (ControlEnded), and the mapping filter hands over a vfork child's exec (vforkexec.go); but a
// process has no filter before it installs one (a dynamic process does when the run arms), and an
// image a vfork child of it exec'd before that, posix_spawn's say, would run unknown for good:
// uncapped, unnamed, and, without a memory cgroup, not even counted towards arming. So the rescan
// loop looks among the children of the processes served for one that is none of theirs: not
// served, not sharing its parent's memory (a vfork child before its exec), not a fork child that
// has not exec'd (its vDSO is where its parent's is: it says hello, or a fork server is entering
// it), and serves it as any exec'd image (serveImage).

// findUnseenImages serves the images among procs' children that nothing else told of. Not in a
// run that enters no image (farmem attach, where children the process had before are none of
// farmem's).
func (rt *Runtime) findUnseenImages(procs []evictor.Target) {
	if rt.cfg.Images == nil {
		return
	}
	for _, tg := range procs {
		p := tg.(*Process)
		pid := p.Pid()
		if pid == 0 || p.probe == 0 {
			continue
		}
		kids, err := procfs.Children(pid)
		if err != nil {
			continue
		}
		for _, c := range kids {
			if rt.Lookup(c) != nil {
				continue
			}
			if same, err := sameMemory(c, pid); err != nil || same {
				continue // gone, or a vfork child before its exec (the filter, or a later look)
			}
			if v, err := vdso(c); err != nil || v == p.probe || rt.imageTaken(c, v) || !execComplete(c) {
				continue // gone, a fork child, taken on already, or an exec not done yet
			}
			go rt.serveImage(c, nil, func() bool { return true })
		}
	}
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
