package pagetable

import (
	"fmt"

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
	space backend.Space                             // the process's own store space
	where func(backend.Slot) (backend.Space, int64) // a slot's space and offset in it
}

// Publish has the table keep words (see package pubtable) for a process whose evicted pages
// are stored in space, where says where a slot's page is. It writes the word of every entry.
func (t *PageTable) Publish(words *pubtable.Table, space backend.Space, where func(backend.Slot) (backend.Space, int64)) {
	t.pub = &publisher{words: words, space: space, where: where}
	for p := range t.pages {
		t.sync(p)
	}
}

// Unpublish stops keeping words and returns the table that held them (nil if none), for the
// caller to close once the agent is gone.
func (t *PageTable) Unpublish() *pubtable.Table {
	if t.pub == nil {
		return nil
	}
	w := t.pub.words
	t.pub = nil
	return w
}

// Words returns the agent table the page table keeps, or nil.
func (t *PageTable) Words() *pubtable.Table {
	if t.pub == nil {
		return nil
	}
	return t.pub.words
}

// take makes page's word farmem's before its entry changes.
func (t *PageTable) take(page uint64) {
	if t.pub != nil && !t.pub.words.Take(page) {
		// Only an agent that serves faults claims a word, and none does yet.
		panic(fmt.Sprintf("pagetable: page %#x claimed, and no agent serves faults", page))
	}
}

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
			return pubtable.Word(pubtable.Published, off)
		}
	}
	return pubtable.Word(pubtable.Farmem, 0)
}

// Fetch marks evicted page's entry e Fetching: farmem reads or installs it.
func (t *PageTable) Fetch(page uint64, e *Entry) {
	t.take(page)
	e.Fetching = true
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
