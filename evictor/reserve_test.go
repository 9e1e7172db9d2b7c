package evictor

import (
	"testing"
	"time"
)

func TestBurstReserve(t *testing.T) {
	t0 := time.Unix(1000, 0)
	b := &BurstReserve{Max: 1000, HalfLife: time.Second}
	steps := []struct {
		at     time.Duration
		unseen int64
		want   int64
	}{
		{0, 0, 0},                        // nothing seen: no reserve
		{0, 400, 400},                    // a burst reserves its size
		{time.Second, 0, 200},            // halves every HalfLife
		{time.Second, 300, 300},          // a larger burst raises it at once
		{time.Second + 1, 100, 299},      // a smaller one does not lower it
		{3 * time.Second, 5000, 1000},    // never above Max
		{2 * time.Second, 0, 1000},       // a clock going back does not grow it
		{4 * time.Second, 0, 1000},       // level 5000 -> 2500, still clamped
		{10 * time.Second, 0, 2500 >> 6}, // forgotten in time
		{100 * time.Second, 0, 0},
	}
	for i, s := range steps {
		if got := b.Observe(t0.Add(s.at), s.unseen); got != s.want {
			t.Fatalf("step %d (t=%v, unseen %d): reserve %d, want %d", i, s.at, s.unseen, got, s.want)
		}
	}
}

func TestNewBurstReserveKeepsHalfTheCap(t *testing.T) {
	b := NewBurstReserve(4096)
	if got := b.Observe(time.Unix(1, 0), 1<<20); got != 2048 {
		t.Fatalf("reserve of a huge burst at a 4096-page cap: %d, want 2048", got)
	}
}
