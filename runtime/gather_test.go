package runtime

import (
	"slices"
	"testing"
)

var (
	fastWindow = windowOf(gatherRate) / 2  // paging faster than gatherRate
	slowWindow = windowOf(releaseRate) * 2 // slower than releaseRate
	midWindow  = windowOf(gatherRate) * 3  // between the two
)

func TestGatherOneThreadHeldAtAnyRate(t *testing.T) {
	var g gather
	if hold, release := g.check(7, 0, slowWindow, 0); !hold || release {
		t.Fatalf("the one thread that faults, slowly: hold %v release %v; want it held", hold, release)
	}
	if hold, release := g.check(7, 0, fastWindow, 0); hold || release {
		t.Fatalf("the same thread again: hold %v release %v; want nothing to do", hold, release)
	}
	if g.fault(7) || g.fault(8) {
		t.Fatal("not gathering: a fault alone held a thread")
	}
	if !slices.Equal(g.held, []int{7}) {
		t.Fatalf("held %v, want [7]", g.held)
	}
}

func TestGatherSecondThreadSlowSpreads(t *testing.T) {
	var g gather
	g.check(7, 0, fastWindow, 0)
	if hold, release := g.check(8, 0, slowWindow, 0); hold || !release {
		t.Fatalf("a second thread, slowly: hold %v release %v; want every thread released", hold, release)
	}
	if len(g.held) != 0 || !g.spread {
		t.Fatalf("held %v spread %v; want none held, spread", g.held, g.spread)
	}
	// Spread, the first thread alone again is not held either until the process pages fast.
	if hold, _ := g.check(7, 0, midWindow, 0); hold {
		t.Fatal("spread: a thread was held below gatherRate")
	}
}

func TestGatherFastHoldsEveryFaultingThread(t *testing.T) {
	var g gather
	g.check(7, 0, slowWindow, 0)
	if hold, release := g.check(8, 0, fastWindow, 0); !hold || release {
		t.Fatalf("a second thread, fast: hold %v release %v; want it held too", hold, release)
	}
	if !g.gathering {
		t.Fatal("not gathering")
	}
	if !g.fault(9) || g.fault(9) || g.fault(7) {
		t.Fatal("gathering: a new faulting thread must be held at its first fault, once")
	}
	if !slices.Equal(g.held, []int{7, 8, 9}) {
		t.Fatalf("held %v, want [7 8 9]", g.held)
	}
	// Between the rates: held still (no flapping at every check).
	if hold, release := g.check(9, 0, midWindow, 0); hold || release {
		t.Fatalf("between the rates: hold %v release %v; want nothing to do", hold, release)
	}
	if hold, release := g.check(8, 0, slowWindow, 0); hold || !release {
		t.Fatalf("below releaseRate: hold %v release %v; want every thread released", hold, release)
	}
	if len(g.held) != 0 || g.gathering || !g.spread {
		t.Fatalf("after the release: held %v gathering %v spread %v", g.held, g.gathering, g.spread)
	}
	if g.fault(10) {
		t.Fatal("released: a fault held a thread")
	}
}

func TestGatherSpreadGathersWhenFast(t *testing.T) {
	g := gather{spread: true}
	if hold, _ := g.check(8, 0, fastWindow, 0); !hold || !g.gathering {
		t.Fatalf("spread, then fast: hold %v gathering %v; want gathering", hold, g.gathering)
	}
}

func TestGatherQuietReleases(t *testing.T) {
	var g gather
	g.check(7, 0, fastWindow, 0)
	g.check(8, 0, fastWindow, 0)
	g.quiet()
	if len(g.held) != 0 || g.gathering {
		t.Fatalf("after quiet: held %v gathering %v", g.held, g.gathering)
	}
	if hold, _ := g.check(7, 0, slowWindow, 0); !hold {
		t.Fatal("after quiet, the one thread that faults is held again")
	}
}

func TestGatherBusyReleasesAndBacksOff(t *testing.T) {
	var g gather
	g.check(7, 0, fastWindow, 0)
	g.check(8, 0, fastWindow, 0)
	now := int64(1)
	for range 4 * busyChecks { // held threads that leave most of their CPU to the fault thread
		if hold, release := g.check(8, now, fastWindow, 0.5); hold || release {
			t.Fatalf("held threads on their CPU half the time: hold %v release %v; want nothing to do", hold, release)
		}
		now++
	}
	if hold, release := g.check(8, now, fastWindow, 1); hold || release {
		t.Fatal("one window on the CPU the whole time released the held threads: the average should ride it out")
	}
	released := false
	for range 4 * busyChecks { // computing between their faults
		now++
		if _, release := g.check(8, now, fastWindow, 0.9); release {
			released = true
			break
		}
	}
	if !released || len(g.held) != 0 || g.gathering || !g.spread {
		t.Fatalf("held threads computing on their CPU: released %v, held %v gathering %v spread %v", released, g.held, g.gathering, g.spread)
	}
	if hold, _ := g.check(8, now+int64(crowdBackoff)/2, fastWindow, 0); hold || g.gathering {
		t.Fatal("gathered again within crowdBackoff")
	}
	if hold, _ := g.check(8, now+1+int64(crowdBackoff), fastWindow, 0); !hold || !g.gathering || g.busy != 0 {
		t.Fatalf("after crowdBackoff: gathering %v, busy %v; want gathering afresh", g.gathering, g.busy)
	}
}

func TestGatherForgetsExitedThreads(t *testing.T) {
	var g gather
	g.check(7, 0, fastWindow, 0)
	g.check(8, 0, fastWindow, 0)
	g.fault(9)
	g.forget(func(tid int) bool { return tid == 8 })
	if !slices.Equal(g.held, []int{7, 9}) || !g.gathering {
		t.Fatalf("held %v gathering %v; want [7 9], gathering", g.held, g.gathering)
	}
	if !g.fault(8) {
		t.Fatal("a forgotten thread id (reused) is not held at its next fault")
	}
}
