package pagetable

import (
	"fmt"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pubtable"
)

// The words of the process's agent table (package pubtable), kept true to the entries: every
// change to an entry takes its page's word first (take: from then on the agent leaves the page
// alone) and writes it afterwards (sync). The entry at an address is what a word is made from,
// never a pointer a caller holds: a batch that holds a victim's entry across an mremap syncs the
// old address, which then says what is there now, while the entry's new address keeps the word
// Move gave it, Farmem, until something there syncs again.

// publisher is a table's agent table, and what it needs to tell a slot the agent can read.
type publisher struct {
	words *pubtable.Table
	ctl   *pubtable.Ctl
	space backend.Space                             // the process's own store space
	where func(backend.Slot) (backend.Space, int64) // a slot's space and offset in it
	// granted is the room given the agent (Grant) and not yet used by a post read: pages
	// counted resident ahead of the installs that will use them.
	granted int64
	served  int64 // posts read
	// failed is called with the first post that does not match its page's entry: the agent
	// installed what farmem does not hold for the page, and the process must be stopped.
	failed func(error)
	count  *atomic.Int64 // the run's count of posts read, or nil
}

// Publish has the table keep words (see package pubtable) for a process whose evicted pages
// are stored in space, where says where a slot's page is. It writes the word of every entry. A
// post read that does not match its page's entry is passed to failed; each one read is counted
// in count, if it is not nil.
func (t *PageTable) Publish(words *pubtable.Table, space backend.Space, where func(backend.Slot) (backend.Space, int64), failed func(error), count *atomic.Int64) {
	t.pub = &publisher{words: words, ctl: words.Ctl(), space: space, where: where, failed: failed, count: count}
	for p := range t.pages {
		t.sync(p)
	}
}

// Unpublish stops keeping words and returns the table that held them (nil if none), for the
// caller to close once the agent is gone. The room granted and not used is no longer counted.
func (t *PageTable) Unpublish() *pubtable.Table {
	if t.pub == nil {
		return nil
	}
	w := t.pub.words
	t.resident.Add(-t.pub.granted)
	t.pub = nil
	return w
}

// Grant gives the agent room for n more installs of its own, counted resident from now on.
func (t *PageTable) Grant(n int64) {
	if t.pub == nil || n <= 0 {
		return
	}
	t.pub.granted += n
	t.resident.Add(n)
	t.pub.ctl.AddRoom(n)
}

// Granted is the room given the agent that no post has used yet.
func (t *PageTable) Granted() int64 {
	if t.pub == nil {
		return 0
	}
	return t.pub.granted
}

// Drain reads what the agent installed since the last Drain and records it, as the fault thread
// records its own installs; faulted, if not nil, is called with the thread of each fault. A
// post that does not match its page's entry stops the process (publisher.failed); the rest are
// still read.
func (t *PageTable) Drain(faulted func(tid int32)) {
	if t.pub == nil || !t.pub.ctl.Pending() {
		return
	}
	t.pub.ctl.Drain(func(page uint64, dirt uint8, word uint64, tid int32) error {
		t.installed(page, dirt, word)
		if faulted != nil {
			faulted(tid)
		}
		return nil
	})
}

// installed records the agent's install of page, as post (dirt, word) says. The word is
// Claimed until now: the agent has done with it, and it is farmem's again.
func (t *PageTable) installed(page uint64, dirt uint8, word uint64) {
	p := t.pub
	p.words.Set(page, pubtable.Word(pubtable.Farmem, 0))
	p.granted--
	t.resident.Add(-1) // the grant the install used; Install counts the page
	e := t.pages[page]
	if e == nil || e.State != Evicted || e.Slot == 0 || !t.holds(e.Slot, pubtable.Offset(word)) {
		// What the agent copied in is not what farmem holds for the page.
		p.failed(fmt.Errorf("page %#x: the agent installed the page at offset %#x of the store, which farmem does not hold for it", page, pubtable.Offset(word)))
		t.sync(page)
		return
	}
	d := Clean
	switch dirt {
	case pubtable.PostWritten:
		d = Written
	case pubtable.PostGuessWritten:
		d = GuessWritten
	}
	t.Refaulted(t.Install(page, d, e.Slot))
	t.pub.served++
	if t.pub.count != nil {
		t.pub.count.Add(1)
	}
}

// holds reports whether slot is at offset off of the process's own space.
func (t *PageTable) holds(slot backend.Slot, off int64) bool {
	sp, o := t.pub.where(slot)
	return sp != 0 && sp == t.pub.space && o == off
}

// Served is how many of the process's faults its agent served, as far as the posts read tell.
func (t *PageTable) Served() int64 {
	if t.pub == nil {
		return 0
	}
	return t.pub.served
}

// Words returns the agent table the page table keeps, or nil.
func (t *PageTable) Words() *pubtable.Table {
	if t.pub == nil {
		return nil
	}
	return t.pub.words
}

// take makes page's word farmem's before its entry changes. A word the agent claimed is its own
// until its post is read: that post is read now, ahead of its turn, which records the agent's
// install (the entry is then Resident); the agent writes it right after its install.
func (t *PageTable) take(page uint64) {
	if t.pub == nil {
		return
	}
	var since time.Time
	for i := 0; !t.pub.words.Take(page); i++ {
		if dirt, word, ok := t.pub.ctl.TakePost(page); ok {
			t.installed(page, dirt, word)
			continue
		}
		switch {
		case i < 100:
			runtime.Gosched()
		case since.IsZero():
			since = time.Now()
		case time.Since(since) > claimWait:
			panic(fmt.Sprintf("pagetable: page %#x claimed by the agent, and no post of it after %v", page, claimWait))
		default:
			time.Sleep(10 * time.Microsecond)
		}
	}
}

// claimWait bounds how long take waits for the post of a page the agent claimed: the agent
// writes it once its install returns, and never waits on farmem meanwhile.
const claimWait = 5 * time.Second

// sync writes page's word from its entry.
func (t *PageTable) sync(page uint64) {
	if t.pub == nil {
		return
	}
	t.take(page)
	t.pub.words.Set(page, t.wordOf(t.pages[page]))
}

// wordOf is the word of a page whose entry is e (nil: none).
//
// Published: an Evicted page with a slot in the process's own space that nothing is working on:
// not Fetching (a read or install of it by farmem), not InFlight or Zapping (an eviction's
// drop and its REMOVE event are still to come), not inherited from a staging page (Stage).
// Clean: a Resident page installed write-protected from its current slot.
func (t *PageTable) wordOf(e *Entry) uint64 {
	switch {
	case e == nil:
		return pubtable.Word(pubtable.None, 0)
	case e.State == Resident && !e.Dirty && e.Slot != 0:
		return pubtable.Word(pubtable.Clean, 0)
	case e.State == Evicted && !e.InFlight && !e.Zapping && !e.Fetching && e.Stage == 0 && e.Slot != 0:
		if sp, off := t.pub.where(e.Slot); sp != 0 && sp == t.pub.space {
			w := pubtable.Word(pubtable.Published, off)
			if t.Refetch(e, false) == GuessWritten {
				w |= pubtable.GuessWritable
			}
			return w
		}
	}
	return pubtable.Word(pubtable.Farmem, 0)
}

// Fetch marks page's entry e (Evicted, or Staged) Fetching: farmem reads or installs it.
// False: the agent had just installed the page, which is Resident now, and not marked.
func (t *PageTable) Fetch(page uint64, e *Entry) bool {
	was := e.State
	t.take(page)
	if e.State != was {
		t.sync(page)
		return false
	}
	e.Fetching = true
	return true
}

// Fetched clears Fetching on e, page's entry when Fetch marked it.
func (t *PageTable) Fetched(page uint64, e *Entry) {
	e.Fetching = false
	t.sync(page)
}

// FirstWrite records the first write to page, whose resident entry is e: its slot is stale.
func (t *PageTable) FirstWrite(page uint64, e *Entry) {
	t.take(page)
	e.Dirty = true
	t.sync(page)
}

// Protect marks page's resident entry e Evicting: the evictor copies it out write-protected.
func (t *PageTable) Protect(page uint64, e *Entry) {
	t.take(page)
	e.State = Evicting
}

// Unprotect puts page's Evicting entry e back Resident: its eviction was given up.
func (t *PageTable) Unprotect(page uint64, e *Entry) {
	e.State = Resident
	t.sync(page)
}

// Zapped clears Zapping on page's evicted entry e: the agent's drop of it returned.
func (t *PageTable) Zapped(page uint64, e *Entry) {
	e.Zapping = false
	t.sync(page)
}
