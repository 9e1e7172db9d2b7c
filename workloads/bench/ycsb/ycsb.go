// Package ycsb is the benchmark's key-value driver (redisdrive, memcachedrive): YCSB's zipfian
// key generator, the self-describing values it writes and checks, and the driver itself
// (driver.go: flags, the populate/run/verify phases, pipelining, the check of every value
// read), so that both servers see the same key stream and the same bytes for the same seed,
// and differ only in their wire Protocol.
package ycsb

import (
	"fmt"
	"math"
	"math/rand"
)

// Zipfian is YCSB's ZipfianGenerator over ranks [0, n) with constant theta in (0, 1): rank 0 is
// the hottest.
type Zipfian struct {
	n                        float64
	theta, alpha, zetan, eta float64
	half                     float64 // 1 + 0.5^theta (zeta(2))
}

// NewZipfian computes zeta(n) once (O(n)); Next is then O(1).
func NewZipfian(n uint64, theta float64) *Zipfian {
	zetan := 0.0
	for i := uint64(1); i <= n; i++ {
		zetan += 1 / math.Pow(float64(i), theta)
	}
	z := &Zipfian{n: float64(n), theta: theta, alpha: 1 / (1 - theta), zetan: zetan}
	z.half = 1 + math.Pow(0.5, theta)
	z.eta = (1 - math.Pow(2/z.n, 1-theta)) / (1 - z.half/z.zetan)
	return z
}

// Next draws a rank.
func (z *Zipfian) Next(r *rand.Rand) uint64 {
	u := r.Float64()
	uz := u * z.zetan
	if uz < 1 {
		return 0
	}
	if uz < z.half {
		return 1
	}
	v := uint64(z.n * math.Pow(z.eta*u-z.eta+1, z.alpha))
	return min(v, uint64(z.n)-1)
}

// Value fills buf (to its capacity) with key's value at version: a readable head, then bytes
// derived from both, so a value read back names the key and version it must be.
func Value(buf []byte, key uint64, version uint32) []byte {
	buf = buf[:0]
	buf = fmt.Appendf(buf, "key:%d:v%d:", key, version)
	x := key<<32 | uint64(version) | 1
	for len(buf) < cap(buf) {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		buf = append(buf, byte('a'+x%26))
	}
	return buf
}
