package prefetch

import "testing"

func TestFIFO(t *testing.T) {
	f := NewFIFO[int](3)
	for _, k := range []int{10, 20, 30} {
		if _, pushed := f.Insert(k); pushed {
			t.Fatalf("insert %d pushed a key out of a FIFO with room", k)
		}
	}
	b20, _ := f.Lookup(20)
	f.Remove(b20) // a hit in the middle: eager eviction
	if _, ok := f.Lookup(20); ok || f.Len() != 2 {
		t.Fatalf("removed key still held (len %d)", f.Len())
	}
	if buf, pushed := f.Insert(40); pushed || buf != b20 {
		t.Fatalf("insert into a FIFO with a free buffer: buffer %d pushed %v, want %d false", buf, pushed, b20)
	}
	// Full now (10, 30, 40): the oldest goes first, then the next oldest.
	for _, want := range []int{10, 30} {
		old, _ := f.Lookup(want)
		buf, pushed := f.Insert(want + 100)
		if !pushed || buf != old {
			t.Fatalf("insert into a full FIFO: buffer %d pushed %v, want %d (key %d's) pushed", buf, pushed, old, want)
		}
		if _, ok := f.Lookup(want); ok {
			t.Fatalf("key %d still held after being pushed out", want)
		}
	}
	f.RemoveIf(func(k int) bool { return k > 100 })
	if f.Len() != 1 {
		t.Fatalf("RemoveIf left %d keys, want 1 (40)", f.Len())
	}
	if _, ok := f.Lookup(40); !ok {
		t.Fatalf("RemoveIf dropped a key it should keep")
	}
}
