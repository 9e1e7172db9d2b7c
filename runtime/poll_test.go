package runtime

import (
	"testing"
	"time"
)

func TestPollInterval(t *testing.T) {
	mib := int64((1 << 20) / PageSize)
	for _, c := range []struct {
		armed      bool
		total, arm int64
		want       time.Duration
	}{
		{true, 0, 1000 * mib, 2 * time.Millisecond},               // armed: always fast
		{false, 0, 4000 * mib, 50 * time.Millisecond},             // far below: the slowest
		{false, 900 * mib, 1000 * mib, 6103515 * time.Nanosecond}, // 100 MiB at 16 GiB/s
		{false, 999 * mib, 1000 * mib, 2 * time.Millisecond},      // close: the fastest
		{false, 1200 * mib, 1000 * mib, 2 * time.Millisecond},     // past (arming is due): fastest
	} {
		if got := pollInterval(c.armed, c.total, c.arm); got != c.want {
			t.Errorf("pollInterval(%v, %d, %d) = %v, want %v", c.armed, c.total, c.arm, got, c.want)
		}
	}
}
