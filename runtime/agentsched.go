package runtime

import "golang.org/x/sys/unix"

// prioritizeAgent makes the shim's agent thread tid a real-time thread (SCHED_FIFO, the lowest
// priority), so that it runs as soon as the evictor asks something of it.
//
// The agent shares its CPU with the program's faulting thread (placement). Asked to move or drop
// a batch, it is woken while the program runs there, and an ordinary thread waits for the
// program's slice to end: the batch takes longer, and faults that need its room wait for it
// (results/floor/swap.md, "Faults that waited"). The agent sleeps except for what the runtime
// asks, so it cannot starve the program; the kernel's real-time throttling bounds it anyway.
// RESET_ON_FORK: nothing the agent might start inherits the policy.
//
// It needs CAP_SYS_NICE (or an RLIMIT_RTPRIO above 0). Without it the agent stays an ordinary
// thread: slower batches, nothing else.
func prioritizeAgent(tid int) error {
	return unix.SchedSetAttr(tid, &unix.SchedAttr{
		Policy:   unix.SCHED_FIFO,
		Priority: 1,
		Flags:    unix.SCHED_FLAG_RESET_ON_FORK,
	}, 0)
}
