package backend

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestMemoryStoreLoadFreeReuse(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	src := make([]byte, 3*PageSize)
	for i := range src {
		src[i] = byte(i / PageSize * 7)
	}
	slots := make([]Slot, 3)
	if err := m.Store(src, slots); err != nil {
		t.Fatal(err)
	}
	dst := make([]byte, PageSize)
	for i, s := range slots {
		if err := m.Load(s, dst); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(dst, src[i*PageSize:(i+1)*PageSize]) {
			t.Fatalf("slot %d: page %d came back different", s, i)
		}
	}
	m.Free(slots[1])
	if err := m.Load(slots[1], dst); !errors.Is(err, ErrUnknownSlot) {
		t.Fatalf("load of a freed slot: %v, want ErrUnknownSlot (never zeros)", err)
	}
	again := make([]Slot, 1)
	m.Store(src[:PageSize], again)
	if again[0] != slots[1] {
		t.Fatalf("freed slot %d not reused (got %d)", slots[1], again[0])
	}
	if m.Stored() != 3 {
		t.Fatalf("stored %d, want 3", m.Stored())
	}
	if err := m.Store(src[:100], again); err == nil {
		t.Fatal("a partial page was accepted")
	}
}

// Store and Load run on every eviction and fault: once the chunk exists they must not allocate.
func TestMemoryNoAllocs(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	page, dst, slot := bytes.Repeat([]byte{7}, PageSize), make([]byte, PageSize), make([]Slot, 1)
	cycle := func() {
		if err := m.Store(page, slot); err != nil {
			t.Fatal(err)
		}
		if err := m.Load(slot[0], dst); err != nil {
			t.Fatal(err)
		}
		m.Free(slot[0])
	}
	cycle() // the first chunk, the free list's first growth
	if n := testing.AllocsPerRun(100, cycle); n != 0 {
		t.Errorf("%d allocations per Store+Load+Free", int(n))
	}
}

// Store and Load copy outside the store's lock: a Close meanwhile must wait for them, not unmap
// the chunks under them (a crash), and every Load after it fails rather than read anything.
func TestMemoryCloseWhileCopying(t *testing.T) {
	m := NewMemory()
	page := bytes.Repeat([]byte{9}, PageSize)
	slots := make([]Slot, 64)
	if err := m.Store(bytes.Repeat(page, len(slots)), slots); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	done := make(chan error, 2)
	go func() { // a fault thread
		dst := make([]byte, PageSize)
		for i := 0; ; i++ {
			if err := m.Load(slots[i%len(slots)], dst); err != nil {
				done <- nil // closed
				return
			}
			if !bytes.Equal(dst, page) {
				done <- errors.New("a page came back different")
				return
			}
		}
	}()
	go func() { // an evictor (it frees nothing: a Free after Close is a shutdown-order bug)
		src, s := bytes.Repeat(page, 16), make([]Slot, 16)
		for range 512 {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := m.Store(src, s); err != nil {
				done <- nil // closed
				return
			}
		}
		done <- nil
	}()
	time.Sleep(20 * time.Millisecond)
	m.Close()
	close(stop)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Load(slots[0], make([]byte, PageSize)); err == nil {
		t.Fatal("a Load after Close succeeded")
	}
}

// Each space keeps its pages in a memfd of its own, the file that can be mapped into its
// process: the file holds that space's pages where their slots say, and nothing of any other
// space's or of the shared part's. Every slot loads back from wherever it is, and the counts
// cover every part.
func TestMemorySpacesKeepPagesApart(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	page := func(part, i int) []byte { return bytes.Repeat([]byte{byte(part*16 + i + 1)}, PageSize) }
	a, err := m.NewSpace()
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.NewSpace()
	if err != nil {
		t.Fatal(err)
	}
	if a == 0 || b == 0 || a == b {
		t.Fatalf("spaces %d and %d: want two distinct, neither the shared part", a, b)
	}
	parts := []Space{0, a, b}
	slots := make([][]Slot, len(parts))
	for k, sp := range parts {
		src := append(append(page(k, 0), page(k, 1)...), page(k, 2)...)
		slots[k] = make([]Slot, 3)
		if err := m.StoreIn(sp, src, slots[k]); err != nil {
			t.Fatal(err)
		}
	}
	dst := make([]byte, PageSize)
	for k := range parts {
		for i, s := range slots[k] {
			if err := m.Load(s, dst); err != nil || !bytes.Equal(dst, page(k, i)) {
				t.Fatalf("part %d page %d (slot %#x): %v, or it came back different", k, i, s, err)
			}
		}
	}
	if m.Stored() != 9 || m.StoredBytes() != 9*PageSize {
		t.Fatalf("stored %d pages, %d bytes; want 9 of every part", m.Stored(), m.StoredBytes())
	}
	for k, sp := range parts[1:] {
		file := m.spaces[sp].pages.file
		var st unix.Stat_t
		if err := unix.Fstat(file, &st); err != nil {
			t.Fatal(err)
		}
		want := map[int64][]byte{} // offset in the file: the page there
		for i, s := range slots[k+1] {
			in, off := m.Where(s)
			if in != sp {
				t.Fatalf("slot %#x of space %d is said to be in space %d", s, sp, in)
			}
			want[off] = page(k+1, i)
		}
		zero := make([]byte, PageSize)
		for off := int64(0); off < st.Size; off += PageSize {
			if _, err := unix.Pread(file, dst, off); err != nil {
				t.Fatal(err)
			}
			if w := want[off]; w != nil && !bytes.Equal(dst, w) || w == nil && !bytes.Equal(dst, zero) {
				t.Fatalf("space %d's file at %d: not what its slots say is there", sp, off)
			}
			delete(want, off)
		}
		if len(want) != 0 {
			t.Fatalf("space %d's file (%d bytes) ends before its slots", sp, st.Size)
		}
	}
}

// A space that ended keeps its pages while a slot of it is held (a fork child shares its
// parent's slots), takes no more, and goes, its memfd closed, with its last slot; its slots
// then read as unknown, never as zeros.
func TestMemorySpaceGoesWithItsLastSlot(t *testing.T) {
	m := NewMemory()
	defer m.Close()
	sp, err := m.NewSpace()
	if err != nil {
		t.Fatal(err)
	}
	src := bytes.Repeat([]byte{9}, 2*PageSize)
	slots := make([]Slot, 2)
	if err := m.StoreIn(sp, src, slots); err != nil {
		t.Fatal(err)
	}
	file := m.spaces[sp].pages.file
	m.EndSpace(sp)
	m.Free(slots[0])
	dst := make([]byte, PageSize)
	if err := m.Load(slots[1], dst); err != nil || !bytes.Equal(dst, src[:PageSize]) {
		t.Fatalf("the held slot of an ended space: %v, or it came back different", err)
	}
	m.Free(slots[1])
	if len(m.spaces) != 0 {
		t.Fatalf("%d spaces left after the ended one's last slot was freed", len(m.spaces))
	}
	if _, err := unix.FcntlInt(uintptr(file), unix.F_GETFD, 0); !errors.Is(err, unix.EBADF) {
		t.Errorf("the gone space's memfd is still open (F_GETFD: %v)", err)
	}
	if err := m.Load(slots[1], dst); !errors.Is(err, ErrUnknownSlot) {
		t.Fatalf("load of a gone space's slot: %v, want ErrUnknownSlot", err)
	}
	if err := m.StoreIn(sp, src, slots); err == nil {
		t.Fatal("a store into a gone space was accepted")
	}
	if m.Stored() != 0 {
		t.Fatalf("stored %d, want 0", m.Stored())
	}
	// A space with nothing in it goes when it ends; a new one never takes an old one's name.
	again, err := m.NewSpace()
	if err != nil {
		t.Fatal(err)
	}
	if again == sp {
		t.Fatalf("a new space took the gone space's name %d", sp)
	}
	m.EndSpace(again)
	if len(m.spaces) != 0 {
		t.Fatal("an empty space did not go when it ended")
	}
}
