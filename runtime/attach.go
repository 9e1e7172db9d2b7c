package runtime

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/procfs"
	"github.com/farmem/farmem/uffd"
)

// Attached processes (farmem attach, launcher/attach.go): a process already running when farmem
// enters it, and which farmem may later let go again, running as before.
//
// What differs from a run:
//   - No mapping filter (Config.NoFilter). A seccomp filter stays in a process for good, and one
//     whose user-notification listener is gone fails every call it catches with ENOSYS: after a
//     detach the process's mmap and brk would fail. So the rescan alone finds new mappings (it
//     reads /proc/PID/maps when the process's anonymous memory drifts from what its table
//     tracks, and every 100 ms), and the evictor's burst reserve keeps room for what it finds
//     late. What the process writes in a mapping before the rescan finds it counts against the
//     cap (Unmanaged) but is not held back by a fault.
//   - The run arms at once (ArmNow), whatever the process holds: its existing anonymous memory
//     is registered and its present pages adopted while every thread is stopped, so they count
//     against the cap from the start, and every fork from then on raises a FORK event (a process
//     with nothing registered forks unseen: no filter hands its forks over).
//   - Fork children are found through their FORK events (ForkParents) and entered by the
//     launcher; see launcher/attach.go for the moment between a child's birth and its entry.
//   - Detach (StopEvicting, BringBack, Unregister, Let) gives every page back and leaves the
//     process with nothing of farmem's.

// ArmNow arms the run now, whatever the processes hold, or, armed, rescans every process: the
// mappings of a process farmem just attached to are registered and their present pages adopted.
func (rt *Runtime) ArmNow() {
	anon := map[*Process]int64{}
	var total int64
	for _, t := range rt.targets() {
		p := t.(*Process)
		if p.Pid() == 0 {
			continue
		}
		s, err := procfs.OpenStatm(p.Pid())
		if err != nil {
			continue // it has exited
		}
		anon[p] = s.AnonPages()
		total += anon[p]
		s.Close()
	}
	if rt.armed.Load() {
		for p := range anon {
			p.Rescan()
		}
		rt.evictor.Kick()
		return
	}
	rt.arm(total, anon)
}

// ForkParents returns the pids of the processes with fork children served from their FORK
// events that have not said hello yet: children for the launcher to enter. Events whose child
// is gone (exited, or exec'd: its memory went with it) are passed over and retired first.
func (rt *Runtime) ForkParents() []int {
	var out []int
	var gone []*Process
	rt.mu.Lock()
	for parent, q := range rt.forks {
		if len(q) == 0 || parent.Pid() == 0 {
			continue
		}
		probe, err := vdso(parent.Pid())
		if err != nil {
			continue
		}
		kept := q[:0]
		for _, c := range q {
			if memoryGone(c.fd, probe) {
				gone = append(gone, c)
			} else {
				kept = append(kept, c)
			}
		}
		rt.forks[parent] = kept
		if len(kept) > 0 {
			out = append(out, parent.Pid())
		}
	}
	rt.mu.Unlock()
	for _, c := range gone {
		rt.retireGone(c)
	}
	return out
}

// Processes returns the processes served that said hello (their pid known).
func (rt *Runtime) Processes() []*Process {
	var out []*Process
	for _, t := range rt.targets() {
		if p := t.(*Process); p.Pid() != 0 {
			out = append(out, p)
		}
	}
	return out
}

// StopEvicting is a detach's first step: from now on no batch takes p's pages and its faults
// never wait for room (the cap no longer holds for p); it returns once no batch holds p.
func (p *Process) StopEvicting() {
	p.detaching.Store(true)
	p.life.Lock() // a batch holds life's read side from start to end
	retired := p.retired
	p.life.Unlock()
	if retired {
		return
	}
	// Faults held for room, or for a drop that has finished, go on: the fetcher serves them.
	p.life.RLock()
	if !p.retired {
		p.fetch.Wake()
	}
	p.life.RUnlock()
}

// BringBack faults every page of p that is evicted back in through p's own fault path, by
// reading it from farmem's side (process_vm_readv: the reads fault into the uffd, which p's
// fault thread serves as it serves the program's faults). Call it after StopEvicting. It
// returns how many pages came back.
func (p *Process) BringBack() (int, error) {
	if !p.detaching.Load() {
		return 0, errors.New("runtime: BringBack before StopEvicting")
	}
	pid := p.Pid()
	var total int
	// A second pass finds what the first could not read (a page the program moved or unmapped
	// meanwhile is not evicted any more), and proves that none is left.
	for pass := 0; pass < 3; pass++ {
		runs, err := p.evictedRuns()
		if err != nil {
			return total, err
		}
		if len(runs) == 0 {
			return total, nil
		}
		buf := make([]byte, 64*PageSize)
		for _, r := range runs {
			for addr := r[0]; addr < r[1]; {
				n := min(r[1]-addr, uint64(len(buf)))
				local := []unix.Iovec{{Base: &buf[0]}}
				local[0].SetLen(int(n))
				remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: int(n)}}
				if _, err := unix.ProcessVMReadv(pid, local, remote, 0); err != nil {
					if errors.Is(err, unix.ESRCH) {
						return total, err
					}
					// EFAULT: unmapped meanwhile; the next pass sees what is left.
				}
				total += int(n / PageSize)
				addr += n
			}
		}
	}
	runs, err := p.evictedRuns()
	if err == nil && len(runs) > 0 {
		err = fmt.Errorf("process %d: %d runs of pages still evicted after three passes", pid, len(runs))
	}
	return total, err
}

// evictedRuns returns the runs [start, end) of p's registered memory whose pages are evicted
// (absent from the process, kept by farmem).
func (p *Process) evictedRuns() ([][2]uint64, error) {
	// The kernel's registrations, not ours on record: a registration moves with its mapping
	// (mremap), and its evicted pages with it.
	ranges, err := procfs.UffdRanges(p.Pid())
	if err != nil {
		return nil, err
	}
	var runs [][2]uint64
	buf := make([]uint64, 4096)
	for _, r := range ranges {
		for addr := r[0]; addr < r[1]; {
			n := min((r[1]-addr)/PageSize, uint64(len(buf)))
			if err := procfs.Pagemap(p.Pid(), addr, buf[:n]); err != nil {
				if errors.Is(err, unix.ESRCH) {
					return nil, err
				}
				break // the mapping changed: the next pass reads it again
			}
			p.table.Lock()
			for i := uint64(0); i < n; i++ {
				page := addr + i*PageSize
				if procfs.Present(buf[i]) {
					continue
				}
				if e := p.table.Get(page); e == nil || e.State != pagetable.Evicted {
					continue
				}
				if k := len(runs); k > 0 && runs[k-1][1] == page {
					runs[k-1][1] = page + PageSize
				} else {
					runs = append(runs, [2]uint64{page, page + PageSize})
				}
			}
			p.table.Unlock()
			addr += n * PageSize
		}
	}
	return runs, nil
}

// DetachAgent has p's agent undo what it holds in p (its staging area, its descriptors, p's
// lifeline and copy of the uffd) and end its thread, and waits until the thread is gone, so
// that its memory may be unmapped. Call it after BringBack, with p's threads stopped.
func (p *Process) DetachAgent() error {
	task := fmt.Sprintf("/proc/%d/task/%d", p.Pid(), p.agentTid.Load())
	if err := unix.Access(task, unix.F_OK); errors.Is(err, unix.ENOENT) {
		return nil // gone already: a detach tried before got this far
	}
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	d, ok := a.(interface{ Detach() error })
	if !ok {
		return fmt.Errorf("process %d has no agent to detach", p.Pid())
	}
	if err := d.Detach(); err != nil {
		return fmt.Errorf("process %d: detaching its agent: %w", p.Pid(), err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if err := unix.Access(task, unix.F_OK); errors.Is(err, unix.ENOENT) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d: its agent thread did not exit", p.Pid())
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// Unregister unregisters every range of p registered with its uffd (as /proc/PID/smaps shows
// them: a registration moves and splits with its mapping), which also lifts every page's write
// protection; p's faults are then the kernel's own again. Call it with p's threads stopped,
// after DetachAgent (the staging area, unregistered by the agent, is gone).
func (p *Process) Unregister() error {
	ranges, err := procfs.UffdRanges(p.Pid())
	if err != nil {
		return err
	}
	for _, r := range ranges {
		if err := uffd.Unregister(p.fd, r[0], r[1]-r[0]); err != nil {
			return fmt.Errorf("process %d: unregistering [%#x, %#x): %w", p.Pid(), r[0], r[1], err)
		}
	}
	if left, err := procfs.UffdRanges(p.Pid()); err == nil && len(left) > 0 {
		return fmt.Errorf("process %d: %d ranges still registered with a userfaultfd", p.Pid(), len(left))
	}
	p.regMu.Lock()
	clear(p.registered)
	clear(p.unadopted)
	p.regMu.Unlock()
	return nil
}

// Let stops serving p, which farmem has let go (Unregister): its fault thread ends, farmem's copy
// of its uffd is closed, its slots are freed.
func (rt *Runtime) Let(p *Process) { rt.retire(p) }

// AgentTid is the thread id of p's agent.
func (p *Process) AgentTid() int { return int(p.agentTid.Load()) }
