package fetcher

import "testing"

// A fault kept for several reasons is counted once, under room if it ever waited for room
// (what the evictor could have spared it), else busy, else event.
func TestHeldCategory(t *testing.T) {
	for _, c := range []struct {
		why  []outcome
		want Held
	}{
		{[]outcome{retryRoom}, HeldRoom},
		{[]outcome{retryEvent}, HeldEvent},
		{[]outcome{retryBusy}, HeldBusy},
		{[]outcome{retryEvent, retryRoom}, HeldRoom},
		{[]outcome{retryBusy, retryEvent}, HeldBusy},
		{[]outcome{retryEvent, retryBusy, retryRoom}, HeldRoom},
	} {
		var mask uint8
		for _, o := range c.why {
			mask |= 1 << o
		}
		if got := held(mask); got != c.want {
			t.Errorf("held(%v) = %v, want %v", c.why, got, c.want)
		}
	}
}
