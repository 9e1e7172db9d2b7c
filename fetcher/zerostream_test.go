package fetcher

import "testing"

// Two regions filled in turn, page by page, each as far as the last fill reached: both
// windows grow as if each were alone, and a random touch in between does not reset them.
func TestZeroStreamsInterleaved(t *testing.T) {
	var z zeroStreams
	next := map[uint64]uint64{0x10000000: 0x10000000, 0x20000000: 0x20000000}
	wins := map[uint64][]int{}
	for round := 0; round < 8; round++ {
		for _, base := range []uint64{0x10000000, 0x20000000} {
			pg := next[base]
			s, w := z.window(pg, 64)
			wins[base] = append(wins[base], w)
			next[base] = pg + uint64(w)*ps
			z.filled(s, next[base])
		}
		z.window(0x30000000+uint64(round)*100*ps, 64) // an unrelated first touch
	}
	want := []int{1, 2, 4, 8, 16, 32, 64, 64}
	for base, got := range wins {
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("stream %#x windows %v, want %v", base, got, want)
			}
		}
	}
}

// A fault away from every stream's next page starts over at one page; more streams than
// slots evict the least recently used, never the busy one.
func TestZeroStreamsRestartAndLRU(t *testing.T) {
	var z zeroStreams
	s, w := z.window(0x1000, 64)
	z.filled(s, 0x2000)
	if _, w = z.window(0x2000, 64); w != 2 {
		t.Fatalf("sequential fault window %d, want 2", w)
	}
	for i := 0; i < zeroStreamCount*2; i++ {
		if _, w := z.window(0x100000+uint64(i)*0x10000, 64); w != 1 {
			t.Fatalf("new stream window %d, want 1", w)
		}
		s, w = z.window(0x2000, 64) // keep the first stream busy (it never advanced: same page)
	}
	if w != 64 {
		t.Fatalf("busy stream lost (window %d)", w)
	}
	if _, w := z.window(0x5000000, 64); w != 1 {
		t.Fatalf("unrelated fault window %d, want 1", w)
	}
	_ = s
}
