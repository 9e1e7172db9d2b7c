package fetcher

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// placement keeps a process's fault thread on the CPU of the thread that faults.
//
// On these machines a wakeup across CPUs costs 60-80 us (the idle CPU halts and must be
// interrupted out of the hypervisor), a uffd round trip on one CPU about 4 us. When the
// faulting thread and the fault thread share a CPU, the fault switches straight to the fault
// thread and back, with no interrupt; measured on a random page walk at a 25 % cap, that
// doubles the fault rate. So every checkEvery faults the fault thread looks up where the last
// faulting thread runs (/proc, ~10 us) and moves itself there. It pins only itself, never the
// program's threads; with several faulting threads it follows the latest, which is the one
// that faults most often.
//
// The shim's agent thread goes to the same CPU. It is ours, not the program's: it only runs
// evictions. Each run a drop madvise(DONTNEED)s blocks in the kernel until the fault thread
// reads the REMOVE event, so a batch of n non-contiguous runs dropped is n round trips between
// the two threads. Across CPUs that was 60 us a run or more (a random walk's batches of ~100
// runs spent 6-13 ms in the drop); on one CPU a round trip is a direct switch. (Most batches
// now move their victims out instead, which needs no round trip a run: evictor's doc.)
type placement struct {
	faults int
	cpu    int   // the CPU the fault thread is pinned to; -1 = not pinned
	agent  int32 // the agent thread last pinned to cpu; 0 = none
}

const checkEvery = 512

func newPlacement() placement { return placement{cpu: -1} }

// fault notes a fault by tid of process pid, whose agent thread is agent (0: none yet); it
// runs on the fault thread.
func (pl *placement) fault(pid, tid int, agent int32) {
	pl.faults++
	if pl.faults%checkEvery != 1 || pid == 0 {
		return
	}
	cpu, err := threadCPU(pid, tid)
	if err != nil {
		return
	}
	var set unix.CPUSet
	set.Set(cpu)
	if cpu != pl.cpu {
		if unix.SchedSetaffinity(0, &set) != nil {
			return
		}
		pl.cpu, pl.agent = cpu, 0
	}
	// A fork child's agent is a new thread; an agent that exited is ESRCH, retried next time.
	if agent != 0 && agent != pl.agent && unix.SchedSetaffinity(int(agent), &set) == nil {
		pl.agent = agent
	}
}

// threadCPU returns the CPU thread tid of pid last ran on (field 39 of its stat).
func threadCPU(pid, tid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/stat", pid, tid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; count fields after its closing paren.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("unparsable stat of %d/%d", pid, tid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 37 {
		return 0, fmt.Errorf("short stat of %d/%d", pid, tid)
	}
	return strconv.Atoi(f[36])
}
