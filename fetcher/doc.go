// Package fetcher serves one process's page faults: a thread of its own reads the process's
// userfaultfd, serves each fault from the right place (zeros, the backend, the prefetch cache,
// or by lifting a write protection), applies the layout events (REMOVE, UNMAP, REMAP, FORK) to
// the process's page table, and prefetches what the process's prefetcher predicts.
//
// What the fault path must ask of the run but does not decide (whether the cap lets a fault
// install a page now, which CPU the threads run on, what a fork child or an unmap means for the
// process's registrations, stopping the process) it asks of its Host, package runtime's
// Process. A Fetcher is made by New with everything it needs (Config) and runs from Start to
// Stop; nothing of it is set from outside while it runs.
//
// # Threads
//
// The fault thread (serve) runs on a locked OS thread, never the netpoller: a fault is a round
// trip between the program and this thread, and it blocks in ppoll on the uffd, an eventfd that
// stops it and one the evictor writes when a fault waiting for room can go on (Wake). With memory
// servers, a prefetch worker goroutine per process fetches predicted pages in batches, so that
// no demand fault waits for its predictions; with the embedded stores (a load is a memcpy) the
// fault thread prefetches itself, right after waking the faulting thread.
//
// The fault thread never waits on anything that waits on a fault: with EVENT_REMOVE/UNMAP/FORK
// the program's madvise, munmap and fork block until the event is read, and while one is unread
// every COPY and ZEROPAGE returns EAGAIN. A fault hit by EAGAIN is kept and resolved again from
// scratch after the events are read (the page's state may have changed), never dropped. The
// events of a read are applied, under the page table's lock taken before the read, before any
// fault it returned is served: a fork child's table is cloned at its FORK event, and must not
// see an install the child's memory never got (read).
//
// # Lock order
//
//	pagetable.PageTable.mu   the process's page table (its own doc: then Slots.mu); the fault
//	                         thread holds it across each read of the uffd (read), and takes
//	                         it with LockForFault, which spins before it sleeps and makes
//	                         the evictor's choice of victims let it go first (pagetable's
//	                         lock.go)
//	PrefetchCache.mu         taken under the page table's lock, never the other way
//	pubtable.Fence's lock    the move fence's, shared with the agent: taken under the page
//	                         table's lock across each read of the uffd by the fault thread
//	                         (read), and by the agent across each move of victims, which
//	                         waits on nothing of farmem's (agent.h, move_runs)
//	pubtable.Ctl's lock      once the agent reads the uffd, its fault thread holds it across
//	                         each read; farmem, across each of its own installs and Fenced
//	                         ioctls (the evictor's commit, under the page table's lock), and
//	                         never waits for it long (LockInstall gives up: EAGAIN)
//
// Nothing here holds a lock across a wait on the program, nor across the install of a page
// read back, whose wake runs the program on this CPU until its next fault (installUnlocked).
// The page table's lock is held across a backend read in one place only: the prefetch of the embedded stores, inline on the fault
// thread, where the read is a memcpy and the lock keeps the chosen pages from changing under
// it. A demand fault's backend read and the prefetch worker's batch read run unlocked: the
// pages being read are marked Fetching, so the prefetcher does not choose them again (a fault on
// one the worker is reading reads it too, rather than wait for the worker's batch), and only
// the fault thread, which is the one reading, applies the events that could discard or move
// them. Each re-checks the page under the lock before it installs.
//
// # Fields
//
// Config's values are set by New and never change. The fault thread alone touches zero, pf,
// clock and its scratch; the prefetch worker alone its own scratch (prefetchScratch). waiting
// is written by the fault thread and read by whoever makes room (Wake). The stats are atomics
// shared by every process of the run.
package fetcher
