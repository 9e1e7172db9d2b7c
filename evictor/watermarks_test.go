package evictor

import (
	"fmt"
	"sync/atomic"
	"testing"
)

// The evictor starts with 64 pages of room below the cap, so a footprint that fits under its cap
// with 256 KiB to spare is never evicted from. Faults that wait at the cap double the room, a
// round at a time, up to two batches (1/16 of a small cap), whatever the cap.
func TestWatermarksStayNearTheCap(t *testing.T) {
	var resident atomic.Int64
	for _, c := range []struct{ capPages, maxHead int64 }{
		{4096, 256},               // 16 MiB: 1/16
		{16896, 512},              // 66 MiB: two batches, not 1/16 (1056)
		{262144, 512},             // 1 GiB
		{8 << 20, 2 * BatchPages}, // 32 GiB
		{512, 64},                 // the smallest head: 64 pages
	} {
		e := New(Config{CapPages: c.capPages, Resident: &resident})
		if e.MaxHead() != c.maxHead {
			t.Errorf("cap %d pages: MaxHead %d, want %d", c.capPages, e.MaxHead(), c.maxHead)
		}
		check := func(when string, head int64) {
			t.Helper()
			if e.HighWater() != c.capPages-head/2 || e.LowWater() != c.capPages-head || e.Limit() != c.capPages {
				t.Errorf("cap %d pages, %s: HighWater %d, LowWater %d, Limit %d; want %d, %d, %d", c.capPages, when,
					e.HighWater(), e.LowWater(), e.Limit(), c.capPages-head/2, c.capPages-head, c.capPages)
			}
		}
		check("at the start", 64)
		e.marks.grow()
		check("no fault waited", 64)
		for head := int64(64); head < c.maxHead; {
			head = min(2*head, c.maxHead)
			e.Waited()
			e.marks.grow()
			check(fmt.Sprintf("after a wait, head %d", head), head)
		}
		e.Waited()
		e.marks.grow()
		check("at the most", c.maxHead)
	}
}

// The head grows only on a round that follows a wait, once per round however many faults
// waited, and the reserve lowers every watermark by itself, head or not.
func TestWatermarksGrowOncePerWaitedRound(t *testing.T) {
	var w watermarks
	w.init(4096) // maxHead 256
	w.waited()
	w.waited()
	w.waited()
	w.grow()
	if got := w.head.Load(); got != 128 {
		t.Fatalf("three waits, one round: head %d, want 128", got)
	}
	w.grow()
	if got := w.head.Load(); got != 128 {
		t.Fatalf("a round with no wait: head %d, want 128 still", got)
	}
	for _, reserve := range []int64{0, 100, 4096} {
		if h, l, m := w.high(reserve), w.low(reserve), w.limit(reserve); h != 4096-64-reserve || l != 4096-128-reserve || m != 4096-reserve {
			t.Errorf("reserve %d: high %d, low %d, limit %d; want %d, %d, %d", reserve, h, l, m, 4096-64-reserve, 4096-128-reserve, 4096-reserve)
		}
	}
	w.waited()
	w.init(4096)
	if got := w.head.Load(); got != minHead {
		t.Fatalf("init: head %d, want %d", got, minHead)
	}
	w.grow()
	if got := w.head.Load(); got != minHead {
		t.Fatalf("init forgets a wait: head %d after a round, want %d", got, minHead)
	}
}
