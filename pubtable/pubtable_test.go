package pubtable

import (
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// agentView maps t's words of [page, page+n pages) as a second mapping of its memfd, as the
// agent does in the program.
func agentView(t *testing.T, tb *Table, page uint64, n int) []atomic.Uint64 {
	t.Helper()
	off := int64(page>>pageShift) * 8
	b, err := unix.Mmap(tb.FD(), off&^4095, int(off&4095)+n*8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&b[off&4095])), n)
}

// What farmem writes the agent reads through its own mapping, and a word the agent claimed or
// sent on is never taken back by farmem's compare and swap.
func TestTakeAgainstTheAgent(t *testing.T) {
	tb, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	const page = 0x7f12_3456_7000
	agent := agentView(t, tb, page, 1)
	if agent[0].Load() != 0 {
		t.Fatal("a new table's word is not None")
	}
	tb.Set(page, Word(Published, 0x5000))
	if w := agent[0].Load(); KindOf(w) != Published || Offset(w) != 0x5000 {
		t.Fatalf("the agent reads %#x, want Published at 0x5000", w)
	}
	// The agent claims the page: farmem must not take it.
	if !agent[0].CompareAndSwap(Word(Published, 0x5000), Word(Claimed, 0)) {
		t.Fatal("the agent's claim failed")
	}
	if tb.Take(page) {
		t.Fatal("Take took a claimed word")
	}
	if KindOf(agent[0].Load()) != Claimed {
		t.Fatal("Take changed a claimed word")
	}
	// farmem has read what the agent did and writes the word again.
	tb.Set(page, Word(Clean, 0))
	if !tb.Take(page) || KindOf(agent[0].Load()) != Farmem {
		t.Fatalf("Take of a Clean word: %#x, want Farmem", agent[0].Load())
	}
	// The agent sent a fault on to farmem (Farmem): farmem's own.
	tb.Set(page, Word(None, 0))
	agent[0].CompareAndSwap(0, Word(Farmem, 0))
	if !tb.Take(page) {
		t.Fatal("Take of a word the agent sent on failed")
	}
}

// A page the table does not cover has no word: it is farmem's.
func TestAboveTheLimit(t *testing.T) {
	tb, err := New()
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	if !tb.Take(Limit) || KindOf(tb.Load(Limit)) != Farmem {
		t.Fatal("a page above the table's limit is not farmem's")
	}
	tb.Set(Limit, Word(Published, 0x1000)) // nowhere to go
	if KindOf(tb.Load(Limit)) != Farmem || tb.Broken() {
		t.Fatal("a word was kept for a page above the limit")
	}
}
