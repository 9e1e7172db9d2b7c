package runtime

import (
	"testing"
	"time"
)

func TestDriftRescansOnGrowthBeyondWhatARescanLeft(t *testing.T) {
	d := newDrift[int]()
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }

	// The first poll rescans (never rescanned); the rescan adopts nothing of a 3000-page gap:
	// a JIT's code cache, say.
	if rescan, gap := d.observe(1, ms(0), 10000, 7000); !rescan || gap != 3000 {
		t.Fatalf("first poll: rescan %v gap %d, want true 3000", rescan, gap)
	}
	d.rescanned(1, ms(0), 3000, 0)
	// That gap stays: no rescan at the next polls, until rescanEvery.
	for _, at := range []int{2, 4, 50, 98} {
		if rescan, _ := d.observe(1, ms(at), 10000, 7000); rescan {
			t.Fatalf("poll at %d ms rescanned a process whose gap is its baseline", at)
		}
	}
	if rescan, _ := d.observe(1, ms(100), 10000, 7000); !rescan {
		t.Fatal("no rescan after rescanEvery")
	}
	d.rescanned(1, ms(100), 3000, 0)
	// Growth of driftPages beyond the baseline: at once.
	if rescan, _ := d.observe(1, ms(102), 10000+driftPages-1, 7000); rescan {
		t.Fatal("rescanned on growth below driftPages")
	}
	if rescan, gap := d.observe(1, ms(104), 10000+driftPages, 7000); !rescan || gap != 3000+driftPages {
		t.Fatalf("growth of driftPages: rescan %v gap %d", rescan, gap)
	}
	// The rescan adopts what it found: the baseline stays 3000.
	d.rescanned(1, ms(104), 3000+driftPages, driftPages)
	if rescan, _ := d.observe(1, ms(106), 10000+driftPages, 7000+driftPages); rescan {
		t.Fatal("rescanned again after adopting the growth")
	}
	// Unregistrable memory freed: the baseline follows it down, so growth from there counts.
	if rescan, gap := d.observe(1, ms(108), 8000, 7000); rescan || gap != 1000 {
		t.Fatalf("gap fell: rescan %v gap %d", rescan, gap)
	}
	if rescan, _ := d.observe(1, ms(110), 8000+driftPages, 7000); !rescan {
		t.Fatal("growth of driftPages from a lowered baseline not rescanned")
	}
	// A process tracked beyond the kernel's count (pages in flight) has no gap.
	if _, gap := d.observe(2, ms(0), 100, 120); gap != 0 {
		t.Fatalf("gap %d, want 0", gap)
	}
	// A process forgotten starts over.
	d.forget(1)
	if rescan, _ := d.observe(1, ms(112), 10000, 7000); !rescan {
		t.Fatal("a forgotten process was not rescanned at its first poll")
	}
}
