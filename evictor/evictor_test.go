package evictor

import (
	"sync/atomic"
	"testing"
)

// The evictor leaves a program at most two batches below its cap, whatever the cap: a footprint
// that fits under the cap with 2 MiB to spare is never evicted from, and small caps keep 1/16.
func TestWatermarksStayNearTheCap(t *testing.T) {
	var resident atomic.Int64
	for _, c := range []struct{ capPages, high, low int64 }{
		{4096, 4096 - 128, 4096 - 256},                      // 16 MiB: 1/16
		{16896, 16896 - 256, 16896 - 512},                   // 66 MiB: two batches, not 1/16 (1056)
		{262144, 262144 - 256, 262144 - 512},                // 1 GiB
		{8 << 20, 8<<20 - BatchPages, 8<<20 - 2*BatchPages}, // 32 GiB
		{512, 512 - 32, 512 - 64},                           // the smallest head: 64 pages
	} {
		e := New(c.capPages, &resident, nil, nil)
		if e.High != c.high || e.Low != c.low {
			t.Errorf("cap %d pages: High %d, Low %d; want %d, %d", c.capPages, e.High, e.Low, c.high, c.low)
		}
		if e.HighWater() != e.High || e.Limit() != c.capPages {
			t.Errorf("cap %d pages: with no reserve, HighWater %d (want High %d), Limit %d (want the cap)", c.capPages, e.HighWater(), e.High, e.Limit())
		}
	}
}
