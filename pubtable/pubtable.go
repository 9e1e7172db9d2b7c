// Package pubtable is the table a served process's agent reads to serve a fault without asking
// farmem: one 64-bit word per page of the process's address space, in a memfd that farmem and
// the agent both map (docs/DESIGN.md, "Where a fault is served"). farmem's page table is the
// truth; a word says only what the agent may do with the page on its own:
//
//	None       0: farmem holds no entry for the page (never touched, or discarded): it reads
//	           as zeros, and the agent may zero-fill it.
//	Published  the page is evicted and its content is the page at byte offset Offset(w) of the
//	           process's store space, which nothing changes while the word is published: the
//	           agent may copy it in.
//	Clean      the page is present, write-protected, and its stored copy is current: the agent
//	           may lift the protection of a write, the page then being dirty.
//	Farmem     farmem is working on the page, or it is present and dirty, or its content is
//	           somewhere the agent cannot read (a fork child's inherited slot, a zero slot):
//	           its faults go to farmem.
//	Claimed    the agent took the page from None, Published or Clean and is acting on it; what
//	           it did reaches farmem, which then writes the word again.
//
// Who writes a word: farmem moves it between any two kinds but Claimed, with a compare and swap
// from None, Published and Clean (the agent may claim those at any moment) and a plain store from
// Farmem (which the agent never changes); the agent moves it from None, Published or Clean to
// Claimed (to serve the fault) or to Farmem (to send the fault on to farmem). A word farmem finds
// Claimed is the agent's until farmem has read what the agent did.
//
// The table covers the lower half of a 48-bit address space (addresses below 1<<47, where Linux
// maps a process's memory unless it asks for more): a sparse memfd of 256 GiB, of which only the
// pages holding written words are memory. A page above it has no word: its faults are farmem's.
//
// farmem maps the table chunk by chunk (a chunk covers 1 GiB of the program's addresses) as it
// writes words; the agent maps all of it. The word of page 0, which no program maps, is the
// table's state instead: nonzero once farmem could not map a chunk, and so could not keep every
// word true; the agent then sends every fault to farmem. A Table is used under its process's
// page table lock: it has no lock of its own.
package pubtable

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Kind is what a word lets the agent do.
type Kind uint64

const (
	None Kind = iota
	Published
	Clean
	Farmem
	Claimed
)

const (
	kindMask  = 7
	pageShift = 12
	// Limit is the first address the table has no word for.
	Limit = 1 << 47
	// chunkShift: a chunk of words covers 1 GiB of addresses, 2 MiB of table.
	chunkShift = 30
	chunkWords = 1 << (chunkShift - pageShift)
	// Size is the table's length in bytes.
	Size = Limit >> pageShift * 8
)

// Word makes the word of kind k; off, a page-aligned offset in the store space, is for
// Published only.
func Word(k Kind, off int64) uint64 { return uint64(off) | uint64(k) }

// KindOf returns w's kind.
func KindOf(w uint64) Kind { return Kind(w & kindMask) }

// Offset returns the store space offset of a Published word.
func Offset(w uint64) int64 { return int64(w &^ (1<<pageShift - 1)) }

// Table is one process's table of words.
type Table struct {
	fd     int
	chunks map[uint64][]uint64 // address>>chunkShift -> the chunk's words, mapped on first use
	ctl    *Ctl
}

// New makes an empty table: every word None.
func New() (*Table, error) {
	fd, err := unix.MemfdCreate("farmem-table", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("pubtable: %w", err)
	}
	if err := unix.Ftruncate(fd, FileSize); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("pubtable: sizing the table: %w", err)
	}
	t := &Table{fd: fd, chunks: make(map[uint64][]uint64)}
	if t.word(0) == nil { // the chunk of the state word
		t.Close()
		return nil, fmt.Errorf("pubtable: mapping the table: no room in farmem's address space")
	}
	if t.ctl, err = mapCtl(fd); err != nil {
		t.Close()
		return nil, err
	}
	return t, nil
}

// Ctl returns the control page and the posts.
func (t *Table) Ctl() *Ctl { return t.ctl }

// FD is the table's memfd, for the agent to map.
func (t *Table) FD() int { return t.fd }

// word returns page's word, mapping its chunk if need be; nil if page is above Limit, or if
// the chunk cannot be mapped (farmem's address space is full), which breaks the table: page 0's
// word says so to the agent, which from then on reads no other.
func (t *Table) word(page uint64) *atomic.Uint64 {
	if page >= Limit {
		return nil
	}
	c := page >> chunkShift
	words := t.chunks[c]
	if words == nil {
		b, err := unix.Mmap(t.fd, int64(c*chunkWords*8), chunkWords*8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err != nil {
			if c != 0 {
				t.word(0).Store(1)
			}
			return nil
		}
		words = unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), chunkWords)
		t.chunks[c] = words
	}
	return (*atomic.Uint64)(unsafe.Pointer(&words[page>>pageShift&(chunkWords-1)]))
}

// Broken reports whether the table has stopped keeping its words (see word).
func (t *Table) Broken() bool { return t.word(0).Load() != 0 }

// Load returns page's word (Farmem for a page the table does not cover).
func (t *Table) Load(page uint64) uint64 {
	w := t.word(page)
	if w == nil {
		return Word(Farmem, 0)
	}
	return w.Load()
}

// Take makes page's word Farmem, so that the agent leaves the page alone until Set says
// otherwise, and returns true; or returns false, leaving the word as it is, if the agent has
// claimed it: what the agent did must be read first.
func (t *Table) Take(page uint64) bool {
	w := t.word(page)
	if w == nil {
		return true
	}
	for {
		old := w.Load()
		switch KindOf(old) {
		case Farmem:
			return true
		case Claimed:
			return false
		}
		if w.CompareAndSwap(old, Word(Farmem, 0)) {
			return true
		}
	}
}

// Set writes page's word, which Take made farmem's. A page the table does not cover is left
// without a word (Take returns true for it, and the agent sends its faults to farmem).
func (t *Table) Set(page uint64, word uint64) {
	if w := t.word(page); w != nil {
		w.Store(word)
	}
}

// Close unmaps the table and closes its memfd.
func (t *Table) Close() {
	for c, words := range t.chunks {
		unix.Munmap(unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), chunkWords*8))
		delete(t.chunks, c)
	}
	if t.ctl != nil {
		t.ctl.close()
		t.ctl = nil
	}
	if t.fd >= 0 {
		unix.Close(t.fd)
		t.fd = -1
	}
}
