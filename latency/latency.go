// Package latency records durations into a fixed log-linear histogram: recording is a few
// atomic adds, takes no lock and allocates nothing, so the fault path can record every fault
// rather than a sample.
//
// Buckets are HDR-style: each power of two of nanoseconds is split into 8 equal sub-buckets, so
// a reported quantile is within 12.5 % of the true value, from 1 ns to 2^40 ns (18 minutes).
package latency

import (
	"math/bits"
	"sync/atomic"
	"time"
)

const (
	subBits  = 3
	sub      = 1 << subBits
	maxExp   = 40
	nBuckets = (maxExp + 1) * sub
)

// Histogram counts durations. The zero value is ready to use; copy it with Snapshot.
type Histogram struct {
	counts [nBuckets]atomic.Uint64
	sum    atomic.Uint64 // nanoseconds
	n      atomic.Uint64
}

// bucket maps v nanoseconds to its bucket: values below 2^subBits get one bucket each; above,
// the exponent picks the power of two and the next subBits bits below the top bit pick the
// sub-bucket.
func bucket(v uint64) int {
	if v < sub {
		return int(v)
	}
	e := bits.Len64(v) - 1 // v in [2^e, 2^(e+1))
	if e > maxExp {
		return nBuckets - 1
	}
	return (e-subBits+1)*sub + int(v>>(e-subBits))&(sub-1)
}

// lower returns the smallest value of bucket b.
func lower(b int) uint64 {
	if b < sub {
		return uint64(b)
	}
	e := b/sub + subBits - 1
	return (1 << e) + uint64(b%sub)<<(e-subBits)
}

// Record adds one duration.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(max(d, 0))
	h.counts[bucket(v)].Add(1)
	h.sum.Add(v)
	h.n.Add(1)
}

// Count returns how many durations were recorded.
func (h *Histogram) Count() uint64 { return h.n.Load() }

// Sum returns the total of the recorded durations.
func (h *Histogram) Sum() time.Duration { return time.Duration(h.sum.Load()) }

// Mean returns the mean duration, or 0 if none was recorded.
func (h *Histogram) Mean() time.Duration {
	n := h.n.Load()
	if n == 0 {
		return 0
	}
	return time.Duration(h.sum.Load() / n)
}

// Quantile returns the duration below which a fraction q of the recorded ones fall: the
// midpoint of the bucket holding the q-th value. Concurrent Records may or may not be seen.
func (h *Histogram) Quantile(q float64) time.Duration {
	var total uint64
	for i := range h.counts {
		total += h.counts[i].Load()
	}
	if total == 0 {
		return 0
	}
	rank := uint64(q*float64(total-1)) + 1
	var seen uint64
	for b := range h.counts {
		seen += h.counts[b].Load()
		if seen >= rank {
			lo, hi := lower(b), lower(b+1)
			if b == nBuckets-1 {
				hi = lo
			}
			return time.Duration(lo + (hi-lo)/2)
		}
	}
	return time.Duration(lower(nBuckets - 1))
}

// Snapshot is a Histogram's counts at one moment, for the live view (the difference of two is
// the interval between them) and for exporting as a metric.
type Snapshot struct {
	Counts [nBuckets]uint64
	Sum, N uint64 // nanoseconds; recorded durations
}

// Snapshot copies h's counts into s. Concurrent Records may or may not be seen.
func (h *Histogram) Snapshot(s *Snapshot) {
	s.N, s.Sum = 0, h.sum.Load()
	for i := range h.counts {
		s.Counts[i] = h.counts[i].Load()
		s.N += s.Counts[i]
	}
}

// Sub subtracts an earlier snapshot of the same histogram: s becomes what was recorded between.
func (s *Snapshot) Sub(earlier *Snapshot) {
	for i := range s.Counts {
		s.Counts[i] -= min(earlier.Counts[i], s.Counts[i])
	}
	s.Sum -= min(earlier.Sum, s.Sum)
	s.N -= min(earlier.N, s.N)
}

// Quantile is Histogram.Quantile of the snapshot.
func (s *Snapshot) Quantile(q float64) time.Duration {
	if s.N == 0 {
		return 0
	}
	rank := uint64(q*float64(s.N-1)) + 1
	var seen uint64
	for b, c := range s.Counts {
		if seen += c; seen >= rank {
			lo, hi := lower(b), lower(b+1)
			if b == nBuckets-1 {
				hi = lo
			}
			return time.Duration(lo + (hi-lo)/2)
		}
	}
	return time.Duration(lower(nBuckets - 1))
}

// Buckets calls fn for every bucket that holds a duration, in ascending order: the durations in
// [lo, hi) and how many there were. It is the whole distribution, for a CDF.
func (s *Snapshot) Buckets(fn func(lo, hi time.Duration, count uint64)) {
	for b, c := range s.Counts {
		if c > 0 {
			fn(time.Duration(lower(b)), time.Duration(lower(b+1)), c)
		}
	}
}

// Cumulate counts the snapshot into explicit buckets: out[i] gets the durations at most
// bounds[i] (ascending), out[len(bounds)] the rest, as OpenTelemetry and Prometheus histograms
// count. A log-linear bucket that straddles a bound is counted by its midpoint, so a bound is
// honoured to within the histogram's 12.5 %.
func (s *Snapshot) Cumulate(bounds []time.Duration, out []uint64) {
	clear(out)
	i := 0
	for b, c := range s.Counts {
		if c == 0 {
			continue
		}
		mid := time.Duration(lower(b) + (lower(b+1)-lower(b))/2)
		for i < len(bounds) && mid > bounds[i] {
			i++
		}
		out[i] += c
	}
}
