package prefetch

import (
	"slices"
	"testing"
)

func TestConsumedBetween(t *testing.T) {
	for _, c := range []struct {
		name   string
		prev   uint64
		window []uint64
		miss   uint64
		want   []uint64
	}{
		{"sequential ran past the window", 100, []uint64{101, 102, 103, 104}, 105, []uint64{101, 102, 103, 104}},
		{"stride ran past the window", 100, []uint64{110, 120, 130}, 140, []uint64{110, 120, 130}},
		{"descending stride", 100, []uint64{97, 94, 91}, 88, []uint64{97, 94, 91}},
		{"stopped inside the window", 100, []uint64{101, 102, 103, 104}, 103, []uint64{101, 102}},
		{"missed the very next page", 100, []uint64{101, 102}, 101, nil},
		{"jumped far past", 100, []uint64{101, 102, 103, 104}, 5000, nil},
		{"jumped backwards", 100, []uint64{101, 102, 103, 104}, 50, nil},
		{"empty window", 100, nil, 101, nil},
		// The window holds only the pages that were queued: a gap (a page already resident)
		// widens the step the miss may land within.
		{"window with a gap", 100, []uint64{101, 103}, 104, []uint64{101, 103}},
		// Two pages past the window, with a step of one: not the stream going on.
		{"landed a step too far", 100, []uint64{101, 102}, 104, nil},
		// Readahead names pages on both sides of the fault: the run stops at the first page
		// not between the misses, and the miss must land next to the run.
		{"window on both sides", 13, []uint64{14, 12, 15}, 15, []uint64{14}},
		{"near the top of the address space", ^uint64(0) - 4, []uint64{^uint64(0) - 3, ^uint64(0) - 2}, ^uint64(0) - 1, []uint64{^uint64(0) - 3, ^uint64(0) - 2}},
	} {
		got := ConsumedBetween(c.prev, c.window, c.miss, nil)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: ConsumedBetween(%d, %v, %d) = %v, want %v", c.name, c.prev, c.window, c.miss, got, c.want)
		}
	}
}

// The inferred pages are appended after what out holds, and window is left alone.
func TestConsumedBetweenAppends(t *testing.T) {
	window := []uint64{11, 12}
	out := ConsumedBetween(10, window, 13, []uint64{7})
	if !slices.Equal(out, []uint64{7, 11, 12}) || !slices.Equal(window, []uint64{11, 12}) {
		t.Errorf("got out %v, window %v; want [7 11 12], [11 12]", out, window)
	}
	if n := testing.AllocsPerRun(100, func() { out = ConsumedBetween(10, window, 13, out[:0]) }); n != 0 {
		t.Errorf("%v allocations with room in out, want 0", n)
	}
}
