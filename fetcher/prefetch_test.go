package fetcher

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
	} {
		got := consumedBetween(c.prev, c.window, c.miss, nil)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s: consumedBetween(%d, %v, %d) = %v, want %v", c.name, c.prev, c.window, c.miss, got, c.want)
		}
	}
}
