package backend

import (
	"bytes"
	"errors"
	"testing"
	"time"
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
