// Package pagetable is farmem's record of every registered page of one process: where its
// content is (in the program, or in a backend slot) and whether the stored copy is current.
//
// Lock order: PageTable.mu, then Slots.mu. No lock here is held across a wait on the program
// (an agent reply, a fault): the fault thread must always be free to read uffd events. The
// fault thread takes PageTable.mu with LockForFault, everyone else with Lock (lock.go).
//
// States of a page (no entry = never touched, or discarded by the program: reads as zeros):
//
//	Resident  present in the program. Dirty: may have been written since its slot was stored
//	          (or no slot): installed writable, so the evictor must copy it out again.
//	          !Dirty implies Slot != 0 and the page is write-protected, so the first write
//	          arrives as a WP fault before it can change the page.
//	Evicting  write-protected and being copied out by the evictor; present in the program.
//	Staged    chosen by a batch that moves its victims out with the agent's UFFDIO_MOVE: the
//	          page is in the program, or (once moved) absent from it and in staging page
//	          Stage-1 of the process's staging area, where nothing can change it. A fault on it
//	          waits for the batch, which commits it Evicted, or puts it back Resident if it
//	          could not be moved (a page still shared with a fork child: EBUSY).
//	Evicted   absent from the program (or about to be: Zapping); content is Slot (0 = zeros).
//	          InFlight: our own agent's DONTNEED of this page has not yet been seen as a REMOVE
//	          event, so the next REMOVE covering it is ours, not the program's discard.
//	          Zapping: the agent's madvise has not yet returned; the page may still be present.
//	          WasWritten: the page was written in its last stay; the fetcher predicts it will
//	          be written again and installs it writable (Guessed), saving the WP fault. A
//	          Guessed stay sees no WP fault, so the evictor tells instead: if the content it
//	          copies out still has the checksum it was stored with (Sum, see Copied), the stay
//	          did not write it, and the next one starts write-protected. A page written once
//	          is then dropped clean, and one written at every stay never takes a WP fault.
//	          Fetching: being read from its slot, by the prefetch worker (queued in a batch)
//	          or by the fault thread (a demand fault, which reads with the table unlocked):
//	          it is not chosen for a prefetch; a fault on a page the worker reads reads it
//	          too. The reader clears it when done; any install resets it.
//	          The fault thread also sets it on an Evicted or Staged page while it installs
//	          the page with the table unlocked (fetcher's installUnlocked).
//	          Stage != 0 (fork children only): the parent forked while this page was Staged.
//	          If it is absent here, it had moved: its content is this process's copy of the
//	          staging page, which fork copied with the rest (the parent's batch had not
//	          dropped it yet), not any slot.
//
// An entry's pointer stays valid while it is in the table, and the evictor keeps its victims'
// pointers across a batch: Move re-keys the same entry, and Discard sets State to 0, so a batch
// tells a page it still owns from one the program discarded (and maybe touched again) meanwhile.
package pagetable

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/backend"
)

// State is where a page's content is.
type State uint8

const (
	Resident State = iota + 1
	Evicting
	Evicted
	Staged
)

// present reports whether s counts as resident: in the program, or moved out by a batch
// that has not committed it (the staging page is still the program's memory).
func present(s State) bool { return s == Resident || s == Evicting || s == Staged }

// Entry is one page's record.
type Entry struct {
	State State
	Dirty bool
	// Guessed: Dirty on WasWritten's word, not because a write was seen. The page was
	// installed writable, so no WP fault tells whether this stay writes it: evicting it
	// writes it out, and sets WasWritten only if Copied saw its content change.
	Guessed  bool
	InFlight bool
	Zapping  bool
	// WasWritten: Evicted pages only; see the package doc. A prediction, never a correctness bit.
	WasWritten bool
	// Fetching: Evicted pages (and Staged ones while the fault thread installs them); see the
	// package doc. Never a correctness bit either:
	// whoever reads the page re-checks it under the lock before installing it.
	Fetching bool
	// ReadBack: this stay began with the page read back on a read (installed Clean or on the
	// guess): how it ends teaches the table's write guess (writeGuess). Not a correctness bit.
	ReadBack bool
	// Adopted: resident since adopt found it present, and not evicted since: the kernel alone
	// has held its content (see Adopt).
	Adopted bool
	// heat holds Heat and Level, four bits each (MaxHeat is at most 15): the entry stays 32
	// bytes, and the table is most of farmem's own memory beside its store.
	heat uint8
	// Stage is 1 + the page's index in the staging area: Staged pages, and the Evicted pages
	// of a fork child that the parent had Staged (see the package doc).
	Stage uint16
	Seq   uint32 // bumped on each install; victim-queue items with an older Seq are stale
	// EvictedAt is the table's eviction count when the page was last evicted: its re-fault
	// distance is the evictions since (see Refaulted).
	EvictedAt uint32
	// Sum is the CRC-32C of the content the evictor last copied out (see Copied): its slot's,
	// unless that eviction was abandoned. A prediction's input, never a correctness bit.
	Sum  uint32
	Slot backend.Slot
}

// Heat is how many more times Victims passes the page over (see Victims); each pass spends one.
// Level is what a re-fault sets it to: raised by each re-fault that came back within a pass of
// its eviction, cleared by one that came back later (see Refaulted). Both are kept while the
// page is evicted, so they survive the stay they measure. Never correctness bits.
func (e *Entry) Heat() uint8  { return e.heat & 0xf }
func (e *Entry) Level() uint8 { return e.heat >> 4 }

func (e *Entry) setHeat(h uint8)  { e.heat = e.heat&0xf0 | min(h, 15) }
func (e *Entry) setLevel(l uint8) { e.heat = min(l, 15)<<4 | e.heat&0xf }

type victim struct {
	page uint64
	seq  uint32
}

// PageTable maps page addresses of one process to entries. All methods but the lock's
// (lock.go) need mu held by the caller.
type PageTable struct {
	mu       sync.Mutex
	pages    map[uint64]*Entry // protected by mu
	fifo     []victim          // protected by mu; resident pages in install order (FIFO eviction)
	head     int               // protected by mu; fifo[:head] already consumed
	resident *atomic.Int64     // pages in Resident or Evicting, summed over every process of a run
	mine     int               // protected by mu; this table's share of *resident
	slots    *Slots
	pinLo    uint64 // protected by mu; [pinLo, pinHi) is never a victim
	pinHi    uint64
	// VictimBlock: Victims takes each victim's resident block mates too, in aligned blocks of
	// this many pages (a power of two; 0 or 1: the victim alone). Set before use.
	VictimBlock int
	// MaxHeat bounds Entry.Heat: how many extra passes through the victim queue a page in use
	// may earn (0: plain FIFO; at most 15). Set before use.
	MaxHeat uint8
	// LastStayGuess: a page read back is installed writable only if its last stay wrote it,
	// never on the process's share (writeGuess). Set before use.
	LastStayGuess bool
	evictions     uint32          // protected by mu; pages evicted so far, the clock of re-fault distances
	taken         map[uint64]bool // protected by mu; Victims' scratch set, kept between calls
	guess         writeGuess      // protected by mu; whether pages read back are all installed writable
	// staging, stagingEnd: the process's staging area (see Staged), or the one inherited
	// from the parent in a fork child. Never adopted or evicted: its pages are not the
	// program's. Protected by mu.
	staging, stagingEnd uint64
	discards            []discard // protected by mu; the program's REMOVEs of the last ZapLag, oldest first
	// layout counts the layout events (REMOVE, UNMAP, REMAP, FORK) applied to the table, the
	// agent's drops of the staging area aside: an eviction batch's moves are made only while
	// no more were read from the uffd (pubtable.Fence). Protected by mu; 0 in a fork child's.
	layout uint64
	// pub keeps the words of the process's agent table (published.go); nil: no table. Set by
	// Publish and Unpublish; protected by mu, as are the words farmem writes.
	pub *publisher
	// faultWaiting counts fault threads waiting for mu in LockForFault (one at most: a table
	// has one fault thread); read by Victims, which yields to them.
	faultWaiting atomic.Int32
}

// New returns an empty table that counts its resident pages into resident and frees slots
// through slots.
func New(resident *atomic.Int64, slots *Slots) *PageTable {
	return &PageTable{pages: make(map[uint64]*Entry), resident: resident, slots: slots, VictimBlock: DefaultVictimBlock, MaxHeat: DefaultMaxHeat}
}

// Get returns the entry of page, or nil.
func (t *PageTable) Get(page uint64) *Entry { return t.pages[page] }

// Resident returns this table's resident page count.
func (t *PageTable) Resident() int { return t.mine }

// Len returns the number of entries.
func (t *PageTable) Len() int { return len(t.pages) }

func (t *PageTable) addResident(n int) { t.mine += n; t.resident.Add(int64(n)) }

// Dirt is how an install leaves a page: what the evictor must do with its copy.
type Dirt uint8

const (
	// Clean: installed write-protected with a current slot; the first write is a WP fault.
	Clean Dirt = iota
	// Written: installed writable because it is being written, or has no slot (zero-fill,
	// adoption): the evictor copies it out.
	Written
	// GuessWritten: installed writable on WasWritten's prediction, with no write seen: the
	// evictor copies it out, and its checksum tells whether the guess was right (Copied).
	GuessWritten
)

// Refetch is how evicted page e brought back from its slot is installed: Written if this
// fault writes it, GuessWritten if it was written in its last stay (WasWritten: a write would
// otherwise cost a second round trip, the WP fault) or if most stays of this process's pages
// read back write them (writeGuess), else Clean, so that a page only read is later dropped
// without any write.
func (t *PageTable) Refetch(e *Entry, write bool) Dirt {
	switch {
	case write:
		return Written
	case e.WasWritten || t.guess.all && !t.LastStayGuess:
		return GuessWritten
	}
	return Clean
}

// GuessingAll reports whether every page read back is installed writable now (writeGuess).
func (t *PageTable) GuessingAll() bool { return t.guess.all && !t.LastStayGuess }

// Install records page as present in the program as d says (Clean needs its slot), and
// returns its entry. It takes over the entry's slot reference when slot equals it; any other
// old slot is released.
func (t *PageTable) Install(page uint64, d Dirt, slot backend.Slot) *Entry {
	t.take(page)
	defer t.sync(page)
	e := t.pages[page]
	if e == nil {
		e = &Entry{}
		t.pages[page] = e
	}
	if !present(e.State) {
		t.addResident(1)
	}
	if e.Slot != 0 && e.Slot != slot {
		t.slots.Release(e.Slot)
	}
	*e = Entry{State: Resident, Dirty: d != Clean, Guessed: d == GuessWritten, ReadBack: d != Written, Slot: slot, Seq: e.Seq + 1, heat: e.heat, EvictedAt: e.EvictedAt, Sum: e.Sum}
	t.fifo = append(t.fifo, victim{page, e.Seq})
	return e
}

// Adopt records page, which the program touched before it was registered, as resident: it
// was never farmem's, and only the kernel holds its content. If it is later found absent, the
// kernel dropped it, and the kernel drops a private anonymous page only when the program asks
// (a discard whose zap came after adopt read pagemap, a lazily freed page reclaimed), after
// which it reads as zeros. Whatever else takes a page away raises an event about it (UNMAP,
// REMAP), which the fault path applies or waits for.
func (t *PageTable) Adopt(page uint64) {
	t.Install(page, Written, 0).Adopted = true
}

// Refaulted notes that the program faulted e's page back in (a demand fault on an evicted page,
// now installed again: e is what Install returned). It is the only sign of use we get: the kernel gives us no access bits
// for another process's pages cheaply, and a resident page is never seen again until it is
// evicted. A page that comes back within one pass of the queue (fewer evictions since its own
// than pages resident: it would have been hit had it stayed a pass longer) was in use when we
// took it: its Level rises by one, up to MaxHeat, and it stays that many passes more this
// time. One that comes back later was rightly taken, and starts over at 0. This is the
// re-fault distance Linux's workingset code uses to tell a thrashing working set from a cold
// page; a prefetched page, installed without a fault, earns nothing.
func (t *PageTable) Refaulted(e *Entry) {
	if t.evictions-e.EvictedAt <= uint32(t.mine) {
		e.setLevel(min(e.Level()+1, t.MaxHeat))
	} else {
		e.setLevel(0)
	}
	e.setHeat(e.Level())
}

// Discard forgets page: the program dropped it (REMOVE/UNMAP) and it reads as zeros again.
func (t *PageTable) Discard(page uint64) {
	e := t.pages[page]
	if e == nil {
		return
	}
	t.take(page)
	if present(e.State) {
		t.addResident(-1)
	}
	if e.Slot != 0 {
		t.slots.Release(e.Slot)
	}
	e.State = 0 // for whoever holds the pointer: an eviction batch
	delete(t.pages, page)
	t.sync(page)
}

// Copied records the checksum of e's content as the evictor copied it out, just before it
// commits the eviction. A page installed writable on the guess (Guessed) whose content still
// has the sum it was stored with was not written this stay, as far as a checksum can tell, so
// WasWritten will not be set; one whose content changed was written: a write seen, as a WP
// fault would have shown. A collision costs at most one WP fault, never data.
func (t *PageTable) Copied(e *Entry, sum uint32) {
	if e.Guessed && sum != e.Sum {
		e.Guessed = false
	}
	e.Sum = sum
}

// MarkEvicted records that page's content, entry e, now lives in slot (the entry's old slot, if
// different, is released) and that our agent is about to drop it from the program.
func (t *PageTable) MarkEvicted(page uint64, e *Entry, slot backend.Slot) {
	t.take(page)
	t.evicted(e, slot)
	e.InFlight, e.Zapping = true, true
	t.sync(page)
}

// Stage marks page's entry e, a victim of a moving batch, Staged at index i of the staging area.
func (t *PageTable) Stage(page uint64, e *Entry, i int) {
	t.take(page)
	e.State, e.Stage = Staged, uint16(i+1)
}

// Unstage puts back page's Staged entry e, which the agent could not move: it is still in the
// program. The batch goes on to evict it the other way, or requeues it.
func (t *PageTable) Unstage(page uint64, e *Entry) {
	e.State, e.Stage = Resident, 0
	t.sync(page)
}

// CommitStaged records that a moved page's content, entry e, now lives in slot. The page left
// the program when it moved, so no REMOVE of it is to come (the staging area's is not its).
func (t *PageTable) CommitStaged(page uint64, e *Entry, slot backend.Slot) {
	t.take(page)
	t.evicted(e, slot)
	e.InFlight, e.Zapping, e.Stage = false, false, 0
	t.sync(page)
}

func (t *PageTable) evicted(e *Entry, slot backend.Slot) {
	if present(e.State) {
		t.addResident(-1)
	}
	if e.Slot != 0 && e.Slot != slot {
		t.slots.Release(e.Slot)
	}
	e.WasWritten = e.Dirty && !e.Guessed
	if e.ReadBack {
		t.guess.stay(e.WasWritten)
	}
	e.State, e.Slot, e.Dirty, e.Guessed, e.ReadBack, e.Adopted = Evicted, slot, false, false, false, false
	e.setHeat(0) // a block mate may leave with heat left
	t.evictions++
	e.EvictedAt = t.evictions
}

// Move re-keys the entries of [from, from+length) at to (mremap).
func (t *PageTable) Move(from, to, length uint64) {
	moved := make(map[uint64]*Entry)
	for p := range t.pages {
		if p >= from && p < from+length {
			moved[p-from+to] = t.pages[p]
			delete(t.pages, p)
			t.sync(p)
		}
	}
	for p, e := range moved {
		// Farmem's until something at p syncs it: a batch holding e knows only its old address.
		t.take(p)
		t.pages[p] = e
		// An eviction in progress works on the old address: it will find nothing there to
		// commit (Evicting) or drop (Zapping). An Evicting page stays here, present and dirty
		// (only dirty pages are Evicting). An Evicted page the agent had not dropped yet may be
		// present here: no longer ours to expect a REMOVE for, and a write to it finds it
		// present (see the fetcher's wpFault).
		switch e.State {
		case Evicting:
			e.State = Resident
		case Staged:
			// Moved out or not, the batch finds it by its pointer: it commits or unstages it
			// here. A fault here waits for that, as at the old address. Queued below at its
			// new address: the batch, which knows only the old one, cannot requeue it.
		case Evicted:
			// Nor is a prefetch of the old address this page's any more: a fault here must
			// not wait for it.
			e.InFlight, e.Zapping, e.Fetching = false, false, false
		}
		if e.State == Resident || e.State == Staged {
			e.Seq++
			t.fifo = append(t.fifo, victim{p, e.Seq})
		}
	}
}

// DiscardRange discards every page in [start, end).
func (t *PageTable) DiscardRange(start, end uint64) {
	t.each(start, end, func(p uint64, _ *Entry) { t.Discard(p) })
}

// each calls f for every entry in [start, end), walking whichever is smaller: the range or
// the table (a munmap of a huge reservation must not cost a lookup per page).
func (t *PageTable) each(start, end uint64, f func(uint64, *Entry)) {
	if (end-start)/backend.PageSize > uint64(len(t.pages)) {
		for p, e := range t.pages {
			if p >= start && p < end {
				f(p, e)
			}
		}
		return
	}
	for p := start; p < end; p += backend.PageSize {
		if e := t.pages[p]; e != nil {
			f(p, e)
		}
	}
}

// Victims pops up to n resident pages in install order (first in, first out), each with the
// other resident pages of its aligned block of VictimBlock pages, and returns them sorted by
// address, so the caller can evict contiguous runs.
//
// The queue is FIFO with second chances earned from re-faults, because the kernel gives us no
// access bits for another process's pages cheaply, only faults: a page with Heat left goes
// back to the tail for one Heat less (see Refaulted for how it earns it). FIFO alone already
// makes a re-faulted page the last to go again; the heat keeps a page that keeps coming back
// for longer each time, where plain FIFO takes it once a pass: fewer re-faults on redis's
// zipfian GETs (results/eviction.md, "Second chances from re-faults").
//
// The block mates go early, hot or not: every run an eviction takes out of the program costs a
// TLB flush, whoever does it, while a victim set spread at random is nearly a run a page.
// Sparing hot mates doubled the runs of redis's batches and gave the saved faults back (the same
// section).
//
// A batch's choice is the longest hold of the lock; every yieldEvery pages it lets a waiting
// fault thread go first (lock.go).
func (t *PageTable) Victims(n int, out []uint64) []uint64 {
	out = out[:0]
	var taken map[uint64]bool
	if t.VictimBlock > 1 {
		if t.taken == nil {
			t.taken = make(map[uint64]bool, n)
		}
		clear(t.taken) // keeps its buckets: no allocation per batch
		taken = t.taken
	}
	take := func(p uint64) {
		out = append(out, p)
		if taken != nil {
			taken[p] = true
		}
	}
	passed, looked, yielded := 0, 0, false
	for t.head < len(t.fifo) && len(out) < n {
		if looked++; looked%yieldEvery == 0 && t.yieldToFault() {
			yielded = true
		}
		if t.head >= len(t.fifo) { // cleared meanwhile (Clear)
			break
		}
		v := t.fifo[t.head]
		t.head++
		if t.pinned(v.page) || taken[v.page] {
			continue
		}
		e := t.pages[v.page]
		if e == nil || e.State != Resident || e.Seq != v.seq {
			continue
		}
		if e.Heat() > 0 && passed < maxPassOver*n {
			e.setHeat(e.Heat() - 1) // a second chance: back to the tail, for one pass less next time
			t.fifo = append(t.fifo, v)
			passed++
			continue
		}
		take(v.page)
		if t.VictimBlock <= 1 {
			continue
		}
		size := uint64(t.VictimBlock) * backend.PageSize
		for p := v.page &^ (size - 1); p < v.page&^(size-1)+size && len(out) < n; p += backend.PageSize {
			if e := t.pages[p]; e != nil && e.State == Resident && !taken[p] && !t.pinned(p) {
				take(p)
			}
		}
	}
	if t.head > 4096 && t.head*2 > len(t.fifo) {
		t.fifo = append(t.fifo[:0], t.fifo[t.head:]...)
		t.head = 0
	}
	if yielded {
		// While the fault thread held the lock, a page taken may have been discarded, moved
		// by an mremap, or the process's table cleared: only pages still resident are victims.
		out = slices.DeleteFunc(out, func(p uint64) bool {
			e := t.pages[p]
			return e == nil || e.State != Resident || t.pinned(p)
		})
	}
	slices.Sort(out)
	return out
}

// maxPassOver bounds the pages one Victims call passes over, per victim asked for: when every
// resident page has heat left, the queue would otherwise go round up to MaxHeat+1 times under
// the table's lock, which the fault thread needs.
const maxPassOver = 64

// DefaultMaxHeat is MaxHeat for a new table: a page faulted back within a pass, time after
// time, stays up to eight passes. Replayed on zipfian traces (replace_test.go), 1 took more
// faults than 2 and up, which took about the same, and a moved hot set was let go as fast; 7 is
// what was measured live on redis (results/eviction.md, "Second chances from re-faults").
const DefaultMaxHeat = 7

// DefaultVictimBlock is VictimBlock for a new table: 8 pages (32 KiB). Taking a victim's block
// mates with it evicts fewer runs a batch, and redis faulted less, since allocations made
// together are used together (results/eviction.md, "Moving victims out instead of dropping
// them (2737fd9), and victims by block (933d5cb)").
const DefaultVictimBlock = 8

func (t *PageTable) pinned(p uint64) bool { return p >= t.pinLo && p < t.pinHi }

// Requeue puts pages that were chosen but not evicted back at the tail.
func (t *PageTable) Requeue(page uint64) {
	if e := t.pages[page]; e != nil && e.State == Resident {
		t.fifo = append(t.fifo, victim{page, e.Seq})
	}
}

// CloneFor returns the table of a child forked from this one. Pages the parent holds in a
// slot are shared with the child copy-on-write: one more reference each. Pages present in the
// parent are present in the child too (the kernel copied them), still write-protected if they
// were, so a clean parent page is a clean child page.
//
// It runs in the parent's fault thread while the child waits for its table, at every fork: the
// entries are made in one allocation, and the slots retained under one lock.
func (t *PageTable) CloneFor() *PageTable {
	c := New(t.resident, t.slots)
	c.pinLo, c.pinHi, c.VictimBlock, c.MaxHeat = t.pinLo, t.pinHi, t.VictimBlock, t.MaxHeat
	c.staging, c.stagingEnd, c.evictions = t.staging, t.stagingEnd, t.evictions
	c.pages = make(map[uint64]*Entry, len(t.pages))
	c.fifo = make([]victim, 0, t.mine)
	entries := make([]Entry, len(t.pages))
	retained := make([]backend.Slot, 0, len(t.pages)-t.mine)
	for p, e := range t.pages {
		ce := &entries[0]
		entries = entries[1:]
		*ce = Entry{State: e.State, Dirty: e.Dirty, Guessed: e.Guessed, Adopted: e.Adopted, Slot: e.Slot, heat: e.heat, EvictedAt: e.EvictedAt, Sum: e.Sum}
		switch e.State {
		case Evicting:
			ce.State, ce.Dirty = Resident, true // present at fork; the parent's new copy is not the child's
		case Staged:
			// Present in the child if the agent had not moved it yet at the fork, absent if it
			// had. A clean page reads the same either way: its slot. A dirty one's content, when
			// absent, is the child's copy of the staging page (see the package doc).
			ce.State, ce.Dirty = Evicted, false // as evicted() leaves every Evicted page
			if e.Dirty || e.Slot == 0 {
				ce.Slot, ce.Stage = 0, e.Stage
			}
		case Evicted:
			// InFlight/Zapping belong to the parent's eviction; in the child the page may be
			// present (fork copied it before the zap): a WP fault then tells us (see fetcher).
		}
		if ce.Slot != 0 {
			retained = append(retained, ce.Slot)
		}
		c.pages[p] = ce
		if ce.State == Resident {
			c.addResident(1)
			c.fifo = append(c.fifo, victim{p, 0})
		}
	}
	t.slots.RetainAll(retained)
	return c
}

// Clear releases every slot and resident count (the process has exited).
func (t *PageTable) Clear() {
	for p := range t.pages {
		t.Discard(p)
	}
	t.fifo, t.head = nil, 0
}

// Removed applies a REMOVE event for [start, end), read at at: an Evicted page whose agent
// DONTNEED is in flight consumes it (it is our own eviction); every other page was discarded by
// the program. If the program discards a page while we evict it, the page sees two REMOVEs, and
// whichever comes second discards it: either order ends in "reads as zeros", which is what it
// asked for. An event that is not wholly ours is remembered for Discarding.
func (t *PageTable) Removed(start, end uint64, at time.Time) {
	ours := uint64(0)
	t.each(start, end, func(p uint64, e *Entry) {
		if e.State == Evicted && e.InFlight {
			e.InFlight = false
			t.sync(p)
			ours++
		} else {
			t.Discard(p)
		}
	})
	if ours*backend.PageSize != end-start {
		t.noteDiscard(start, end, at)
	}
}

// SetStaging records the process's staging area, [start, end).
func (t *PageTable) SetStaging(start, end uint64) { t.staging, t.stagingEnd = start, end }

// Staging returns the staging area (0, 0: none).
func (t *PageTable) Staging() (start, end uint64) { return t.staging, t.stagingEnd }

// LayoutChanged counts n more layout events applied to the table.
func (t *PageTable) LayoutChanged(n int) { t.layout += uint64(n) }

// Layout is the number of layout events applied to the table.
func (t *PageTable) Layout() uint64 { return t.layout }

// InStaging reports whether page is in the staging area.
func (t *PageTable) InStaging(page uint64) bool { return page >= t.staging && page < t.stagingEnd }

// Pin excludes [lo, hi) from eviction: the agent thread's stack, which must never fault while
// the agent executes an eviction.
func (t *PageTable) Pin(lo, hi uint64) { t.pinLo, t.pinHi = lo, hi }
