// Package evictor keeps the pages counted against a run's cap under it. When the resident pages
// of the run's processes, with the memory they hold unseen (Unmanaged) and farmem's prefetch
// cache (Cached), pass the high watermark, it takes pages out of the process that holds the
// most, stores them in the backend and records them Evicted in that process's page table, for
// the fault path to bring back; it stops at the low watermark.
//
// # Goroutines
//
// One evictor goroutine (Loop, locked to its OS thread: Tid) runs every batch, one at a time,
// for every process. The fault threads (one a process, package fetcher) and the runtime's RSS
// poll only signal it (Kick, Waited) and read its watermarks. A process's fault thread, not the
// evictor, reads its uffd, and so consumes the REMOVE events the batch's drops raise: the
// evictor never reads a uffd.
//
// # Locks
//
// In order: a Target's Hold (the process's life, held across a batch so that its uffd stays
// open and its number ours), then its page table's lock, then Target.Fenced's (in program mode
// the control page's, which the agent holds only while it reads the uffd), then what the page
// table takes under it (pagetable.Slots, the backend's own). The evictor takes a page table's
// lock only for in-memory work: choosing and staging victims, reading the move's statuses,
// marking the victims left in the program, the commit, clearing Zapping, an abort. It never
// holds it across anything that waits on the program or its fault thread: the agent's move and
// drop, the write-protect and wake ioctls, process_vm_readv, the backend's Store, Config.Trace.
// (Under it the commit frees the slot of a page stored for nothing, as the page table frees
// slots under it, and asks the kernel whether the layout is settled, which answers EAGAIN rather
// than wait; neither waits on anyone.) The fault thread must always be free to take that lock
// and read events: the agent's madvise waits until it reads the REMOVE event, and the batch's
// own ioctls fail with EAGAIN until it does. The tests run batches against a fault thread that
// takes the lock for every event it reads, while the program's madvise (during the store) and
// the agent's drop wait for it to read theirs (batch_test.go).
//
// # Who writes and who reads an Evictor
//
//	cfg        New; read-only afterwards
//	marks      the head: the evictor goroutine (grow, in Loop); the fault-waited flag: the fault
//	           threads set it (Waited), the evictor goroutine clears it; read by anyone
//	           (HighWater, LowWater, Limit, MaxHead)
//	bell       rung by the fault threads and the runtime's RSS poll (Kick); Loop waits on it
//	stopping   Loop's stop watcher; read by Loop
//	tid        Loop, as it starts and ends; read by the fault threads (Tid)
//	Unmanaged  the runtime's RSS poll; read by Used
//	Reserve    the runtime's RSS poll, from a BurstReserve; read by the watermarks
//	Cached     the prefetch cache (fetcher.PrefetchCache.Held); read by Used
//	starved    Loop, at the end of each round and batch; read by the fault path (Starved)
//	Stats      the evictor goroutine; read by anyone (the run summary, metrics)
//	b          the evictor goroutine alone: the batch's scratch, reused by every batch
//
// # A batch
//
// A batch takes its victims out of the program one of two ways. The first is tried for every
// victim, the second takes what it leaves:
//
//	move:  page table Staged -> the agent UFFDIO_MOVEs them into the process's staging area ->
//	       process_vm_readv the staging pages -> store -> commit (Evicted) -> the agent
//	       madvise(DONTNEED)s the staging area
//	drop:  write-protect the dirty victims -> process_vm_readv them -> store -> commit
//	       (Evicted, InFlight, Zapping) -> the agent madvise(DONTNEED)s them -> clear Zapping
//	       -> wake the writers held by the protection
//
// Both orders lost no write under concurrent writers, where copying out without the drop way's
// write-protect lost many (docs/DESIGN.md, "Evicting a page"). The drop way pays, per contiguous
// run, a write-protect (a TLB flush) and a REMOVE event that the agent must wait for the fault
// thread to read: a round trip between two processes (results/eviction.md, "What the drop costs, and
// why it is not the probe's 4.5 µs a run"). A random victim set is nearly a run a page. The
// move stays inside the program's process (it still flushes each page from the TLB:
// probes/movecost.c, and results/eviction.md, "Moving victims out instead of dropping them"),
// and needs no protection (a moved page is out of the program's reach: a fault on it is served
// from its staging copy, which nothing changes). It is issued on the program's uffd, where the
// staging area is registered, and is made only while no layout event came after the choice
// (Target.Move, pubtable.Fence): an address chosen may hold another page after the program's
// mremaps. The kernel refuses to move a page still shared with a fork child (EBUSY: redis's
// cold pages after a BGSAVE, until written), and a fork child that inherited its parent's
// staging area moves nothing; those go the drop way.
//
// Clean victims (installed write-protected from a slot and never written) are not copied: their
// slot is still current. All-zero pages are not stored: slot 0 reads as zeros. Between the
// choice and the commit the program may discard a victim (REMOVE, UNMAP), write a clean one, or
// unmap or move a range (munmap, mremap); the commit takes only pages still in the state the
// batch left them in, and frees the slots stored for the others. It finds the drop way's victims
// by address, so it commits them only while the page table holds the layout as it is: with a
// layout event raised and not yet applied (the kernel fails an ioctl on the uffd meanwhile), an
// address may hold another page than the one copied out, and the drop way is given up, its
// victims left in the program. The commit and the drop run under the agent's lock, so no mapping
// call the agent makes for the program comes between them; the program's own mremap and small
// mmaps still can (docs/DESIGN.md, "The drop way and the program's layout changes").
//
// # Files
//
//	evictor.go     Config, New, Loop and the watermarks' accessors; Target
//	watermarks.go  when eviction starts and stops: the head, grown by faults that wait
//	reserve.go     BurstReserve: room kept for memory taken without a fault
//	batch.go       a batch's steps in order, its scratch, the choice of victims
//	move.go        the move protocol's step: the agent's UFFDIO_MOVE into the staging area
//	drop.go        the drop protocol's steps: write-protect, abort, the agent's drop, wake
//	copyout.go     process_vm_readv of the pages to store, and their checksums
//	store.go       the backend store of the non-zero pages
//	commit.go      the page table's record of what the batch evicted
//	stats.go       Stats, the trace record, and their accounting
package evictor
