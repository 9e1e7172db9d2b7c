package latency

import (
	"math/rand"
	"sort"
	"testing"
	"time"
)

func TestBucketsCoverValuesInOrder(t *testing.T) {
	prev := -1
	for v := uint64(0); v < 1<<20; v += 1 + v/97 {
		b := bucket(v)
		if b < prev {
			t.Fatalf("bucket(%d)=%d is below the bucket of a smaller value (%d)", v, b, prev)
		}
		if lo, hi := lower(b), lower(b+1); v < lo || v >= hi {
			t.Fatalf("value %d in bucket %d = [%d, %d)", v, b, lo, hi)
		}
		prev = b
	}
	if b := bucket(1 << 62); b != nBuckets-1 {
		t.Fatalf("huge value in bucket %d, want the last (%d)", b, nBuckets-1)
	}
}

// Quantiles must be within the histogram's stated 12.5 % of the exact ones.
func TestQuantilesWithinResolution(t *testing.T) {
	var h Histogram
	r := rand.New(rand.NewSource(1))
	vals := make([]float64, 100000)
	for i := range vals {
		vals[i] = float64(time.Microsecond) * (1 + r.ExpFloat64()*20)
		h.Record(time.Duration(vals[i]))
	}
	sort.Float64s(vals)
	for _, q := range []float64{0.01, 0.5, 0.9, 0.99, 0.999} {
		want := vals[int(q*float64(len(vals)-1))]
		got := float64(h.Quantile(q))
		if got < want*0.875 || got > want*1.125 {
			t.Errorf("q%.3f = %v, exact %v: off by more than 12.5%%", q, time.Duration(got), time.Duration(want))
		}
	}
	if h.Count() != uint64(len(vals)) {
		t.Fatalf("count %d, want %d", h.Count(), len(vals))
	}
}

func TestEmptyAndRecordAllocatesNothing(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 || h.Mean() != 0 {
		t.Fatal("an empty histogram reports a latency")
	}
	if a := testing.AllocsPerRun(1000, func() { h.Record(3 * time.Microsecond) }); a != 0 {
		t.Fatalf("Record allocates %v times", a)
	}
	if got := h.Quantile(0.5); got < 2625*time.Nanosecond || got > 3375*time.Nanosecond {
		t.Fatalf("median of 3us samples = %v", got)
	}
}
