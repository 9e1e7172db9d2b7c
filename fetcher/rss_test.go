package fetcher

import (
	"os"
	"testing"
	"time"
)

func TestStatmReadsOwnRSS(t *testing.T) {
	s, err := openStatm(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	before := s.anonPages()
	b := make([]byte, 64<<20)
	for i := 0; i < len(b); i += PageSize {
		b[i] = 1
	}
	after := s.anonPages()
	if grew := after - before; grew < (60<<20)/PageSize {
		t.Fatalf("statm saw %d more anonymous pages after touching 16384 (before %d, after %d)", grew, before, after)
	}
	_ = b[len(b)-1]
}

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
