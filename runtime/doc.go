// Package runtime is the life of one `farmem run`: the processes it serves, when it arms, where
// their threads run, and how it learns of memory the program takes without a fault.
//
//   - Processes (procs.go): a program process and each fork child is a Process, attached when
//     the preload shim says hello with its userfaultfd (a fork child is served at its FORK event,
//     before its hello, which names that event by the child's fork probe: forkclaim.go), retired
//     when it exits. An image it exec's that does not load the shim is entered by the launcher
//     (execed.go, ImageServer), and so is one a vfork child of it exec's, which the mapping
//     filter tells of (vforkexec.go), or the kernel's exec events or the rescan loop find
//     (unseenimages.go); a raw fork's child, which no atfork handler of the shim runs in, is
//     entered too (Config.RawForks), or, where no filter hands the fork over, given a lifeline
//     of farmem's making (lifelines.go).
//     A Process is the evictor's Target and its fetcher's Host: package fetcher serves its
//     faults, package evictor takes its pages; the runtime holds what both must agree on (the
//     cap, the uffd's life, the agent).
//   - Arming (arm.go, poll.go, memcg.go): nothing is registered with userfaultfd until the
//     programs' anonymous memory nears the cap, so a program that stays below it runs with no
//     fault at all. A memory cgroup of the run's own says when (usageWatch), or, where there is
//     none, a poll of every process's statm paced by the distance to the threshold. Arming
//     registers every anonymous mapping and adopts the pages already present.
//   - Registration (register.go, mapfilter.go): the shim reports the mappings it sees; a seccomp
//     filter the agent installs once armed hands the runtime the mmap and brk calls glibc makes
//     internally, registered before the program can write to them; a rescan of /proc/PID/maps
//     finds anything else, and the evictor keeps room for what it finds late (BurstReserve).
//   - Placement (placement.go, gather.go): the fault thread follows the faulting thread's CPU,
//     and the program's faulting threads are kept on it while the program pages: the one that
//     faults, or, while the process faults fast, every one.
//
// A Runtime is made by New from a Config, started by Start and ended by Close; nothing of it is
// set from outside in between. Its statistics are atomics anyone may read.
//
// # Lock order
//
// A lock may be taken while holding the ones above it in this list, never the other way:
//
//	Process.mapMu       held from the check that a notified mmap's caller still waits to its
//	                    answer (mapfilter.go); like brkMu, only notification goroutines take it
//	Process.brkMu       held across the agent's two brk calls of one notified brk, so that the
//	                    next brk starts from the break this one left (mapfilter.go); only the
//	                    goroutines serving notifications take it, never the fault thread
//	Process.life        read-held by an eviction batch or a prefetch batch for its whole length,
//	                    and by Register and Rescan (Hold), write-held by retire while it stops
//	                    the fetcher and closes the uffd (taken first: a batch's read may need the
//	                    fault thread to end)
//	agent's own lock    the Agent's (launcher/proto.go): one request at a time, held across its
//	                    round trip to the agent thread; taken by batches (Drop, Move) and mapping
//	                    calls (Syscall)
//	Process.regMu       the ranges registered; held for the registration ioctl only
//	PageTable.mu        the process's page table (package pagetable: then Slots.mu), held for
//	                    in-memory work, and by the fault thread while it installs a page; it
//	                    also guards farmem's writes of the process's agent table (pubtable),
//	                    whose words the agent changes only by compare and swap
//	PrefetchCache.mu    cache mode's prefetch cache, looked up under the page table's lock
//	Process.fence       the move fence's lock (pubtable.Fence), shared with the agent: the fault
//	                    thread holds it under the page table's lock across each read of the uffd;
//	                    the agent, across each move of victims, which waits on nothing
//	lifelines.mu        farmem's own lifelines (lifelines.go), held while one is made, which
//	                    looks at the process registry
//	Runtime.mu          the process registry and the first failure; nothing is taken under it,
//	                    and the fault thread may take it under its table's lock (Fail)
//	Process.agentMu     the agent pointer; held to read or swap it, nothing else
//
// No lock is held across a wait on the program except the agent's own (whose requests the agent
// thread serves at once: its faults are never held for room) and mapMu and brkMu above it; the fault
// thread takes none of those, so it is always free to read the uffd's events, which the
// program's madvise, munmap and fork wait for.
//
// # Goroutines
//
// The evictor (Evictor.Loop, one OS thread), the rescan loop and, where farmem may listen to the
// kernel's process events, their reader (watchEvents) run from Start to Close; each lifeline of
// farmem's making has a goroutine that lets it go (lifelines.go). Each
// process has its fault thread and, with memory servers and a prefetcher, a prefetch worker
// (package fetcher), and an exit watcher that retires it. Each mapping filter has a listener,
// and each notified call a goroutine of its own (an agent round trip must not hold up another
// process's calls).
package runtime
