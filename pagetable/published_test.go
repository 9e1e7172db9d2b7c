package pagetable

import (
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pubtable"
)

// publishedTable returns a table that keeps words for a process whose pages go to space own of
// m, and a slot of that space and one of another.
func publishedTable(t *testing.T) (tb *PageTable, words *pubtable.Table, mine, other backend.Slot) {
	tb, m, _ := newTable(t)
	own, err := m.NewSpace()
	if err != nil {
		t.Fatal(err)
	}
	another, err := m.NewSpace()
	if err != nil {
		t.Fatal(err)
	}
	words, err = pubtable.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(words.Close)
	s := make([]backend.Slot, 2)
	page := make([]byte, 2*backend.PageSize)
	if err := m.StoreIn(own, page, s); err != nil {
		t.Fatal(err)
	}
	if err := m.StoreIn(another, page[:backend.PageSize], s[1:]); err != nil {
		t.Fatal(err)
	}
	tb.Publish(words, own, m.Where, func(err error) { t.Error(err) }, nil)
	_, off := m.Where(s[0])
	if off == 0 {
		// the second slot of the space: a word with offset 0 would not tell a wrong offset
		s[0] = 0
		if err := m.StoreIn(own, page[:backend.PageSize], s[:1]); err != nil {
			t.Fatal(err)
		}
	}
	return tb, words, s[0], s[1]
}

// A page's word follows its entry through every step of its life: only an Evicted page that
// nothing is working on, with a slot in the process's own space, is Published, at its slot's
// offset; only a clean resident one is Clean; a page with no entry is None.
func TestWordsFollowTheEntries(t *testing.T) {
	tb, words, mine, other := publishedTable(t)
	_, off := tb.pub.where(mine)
	const pg, pg2 = 0x7f0000001000, 0x7f0000002000
	want := func(step string, page uint64, k pubtable.Kind) {
		t.Helper()
		w := words.Load(page)
		if pubtable.KindOf(w) != k {
			t.Fatalf("%s: word %#x, kind %d; want kind %d", step, w, pubtable.KindOf(w), k)
		}
		if k == pubtable.Published && pubtable.Offset(w) != off {
			t.Fatalf("%s: published at offset %#x, want its slot's, %#x", step, pubtable.Offset(w), off)
		}
	}
	want("never touched", pg, pubtable.None)
	tb.Install(pg, Written, 0)
	want("zero-filled", pg, pubtable.Farmem)
	tb.Stage(pg, tb.Get(pg), 0)
	want("staged", pg, pubtable.Farmem)
	tb.CommitStaged(pg, tb.Get(pg), mine)
	want("moved out and stored", pg, pubtable.Published)
	tb.Fetch(pg, tb.Get(pg))
	want("being read", pg, pubtable.Farmem)
	tb.Fetched(pg, tb.Get(pg))
	want("read, not installed", pg, pubtable.Published)
	tb.Install(pg, Clean, mine)
	want("installed write-protected", pg, pubtable.Clean)
	tb.FirstWrite(pg, tb.Get(pg))
	want("written", pg, pubtable.Farmem)
	tb.Protect(pg, tb.Get(pg))
	want("being evicted the drop way", pg, pubtable.Farmem)
	tb.Unprotect(pg, tb.Get(pg))
	want("eviction given up", pg, pubtable.Farmem)
	tb.Protect(pg, tb.Get(pg))
	tb.MarkEvicted(pg, tb.Get(pg), mine)
	want("stored, drop to come", pg, pubtable.Farmem)
	tb.Zapped(pg, tb.Get(pg))
	want("dropped, its REMOVE not read", pg, pubtable.Farmem)
	tb.Removed(pg, pg+backend.PageSize, time.Now())
	want("its REMOVE read", pg, pubtable.Published)
	tb.Move(pg, pg2, backend.PageSize)
	want("the old address after an mremap", pg, pubtable.None)
	want("the new address after an mremap", pg2, pubtable.Farmem)
	tb.Install(pg2, Written, tb.Get(pg2).Slot)
	tb.Stage(pg2, tb.Get(pg2), 0)
	tb.CommitStaged(pg2, tb.Get(pg2), other)
	want("stored in another process's space", pg2, pubtable.Farmem)
	tb.Discard(pg2)
	want("discarded", pg2, pubtable.None)

	// A fork child's table keeps its own words once published, which its parent's slots never are.
	tb.Install(pg, Written, 0)
	tb.Stage(pg, tb.Get(pg), 0)
	tb.CommitStaged(pg, tb.Get(pg), mine)
	child := tb.CloneFor()
	childWords, err := pubtable.New()
	if err != nil {
		t.Fatal(err)
	}
	defer childWords.Close()
	child.Publish(childWords, 0, tb.pub.where, func(err error) { t.Error(err) }, nil)
	if w := childWords.Load(pg); pubtable.KindOf(w) != pubtable.Farmem {
		t.Fatalf("a fork child's page in its parent's slot: word %#x, want Farmem", w)
	}
	want("the parent's page after the fork", pg, pubtable.Published)
}

// A word the agent claimed is the agent's until its post is read: a change to the page reads it
// first, ahead of its turn, and finds the page installed; a claim the agent gave up (its word put
// back) is farmem's to take again.
func TestClaimedWordWaitsForItsPost(t *testing.T) {
	tb, words, mine, _ := publishedTable(t)
	const pg, pg2 = 0x7f0000001000, 0x7f0000002000
	for _, p := range []uint64{pg, pg2} {
		tb.Install(p, Written, 0)
		tb.Stage(p, tb.Get(p), 0)
		tb.CommitStaged(p, tb.Get(p), mine)
	}
	w := words.Load(pg)
	if pubtable.KindOf(w) != pubtable.Published {
		t.Fatalf("word %#x, want Published", w)
	}
	tb.Grant(2)
	// The agent claims pg, installs it write-protected and posts it, a little later.
	words.Set(pg, pubtable.Word(pubtable.Claimed, 0))
	ctl := words.Ctl()
	if ctl.TakeRoom(1) != 1 {
		t.Fatal("no room granted")
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		agentPost(ctl, pg, pubtable.PostClean, w)
	}()
	e := tb.Get(pg)
	if !tb.Fetch(pg, e) == false {
		t.Fatal("Fetch of a page the agent installed meanwhile marked it")
	}
	if e.State != Resident || e.Dirty || e.Slot == 0 || pubtable.KindOf(words.Load(pg)) != pubtable.Clean {
		t.Fatalf("after the agent's post: %+v, word %#x; want Resident, clean, its slot kept, Clean", e, words.Load(pg))
	}
	if tb.Granted() != 1 || tb.Served() != 1 {
		t.Fatalf("granted %d, served %d after one post; want 1, 1", tb.Granted(), tb.Served())
	}
	// The agent claims pg2 and gives it up: its word goes back as it was.
	w2 := words.Load(pg2)
	words.Set(pg2, pubtable.Word(pubtable.Claimed, 0))
	go func() { time.Sleep(20 * time.Millisecond); words.Set(pg2, w2) }()
	tb.Discard(pg2)
	if tb.Get(pg2) != nil || pubtable.KindOf(words.Load(pg2)) != pubtable.None {
		t.Fatal("a page whose claim was given up was not discarded")
	}
	tb.Drain(nil) // the post read ahead is not read again
	if tb.Served() != 1 {
		t.Fatalf("served %d after Drain, want 1: a post was read twice", tb.Served())
	}
}

// agentPost writes a post as the agent does (launcher/shim/agent.h, serve_fault), through a
// mapping of its own of the control page and the posts.
func agentPost(ctl *pubtable.Ctl, page uint64, dirt uint8, word uint64) {
	b, err := unix.Mmap(ctl.FD(), pubtable.CtlOffset, pubtable.FileSize-pubtable.CtlOffset, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		panic(err)
	}
	defer unix.Munmap(b)
	w := unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&b[0])), 8)
	const postTail = 5 // struct fm_ctl's post_tail
	tail := w[postTail].Load()
	post := unsafe.Slice((*atomic.Uint64)(unsafe.Pointer(&b[pubtable.PostsOffset-pubtable.CtlOffset+tail%pubtable.Posts*32])), 4)
	post[0].Store(page | uint64(dirt))
	post[1].Store(word)
	post[2].Store(1) // the faulting thread
	w[postTail].Store(tail + 1)
}
