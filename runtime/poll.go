package runtime

import "time"

// growthBound is the fastest a program's anonymous memory is assumed to grow: two CPUs each
// first-touching a 4 KiB page at the kernel's own first-touch speed (docs/DESIGN.md, "Latency"),
// with room to spare for transparent huge pages.
const growthBound = 16 << 30 // bytes per second

// pollInterval is how long the runtime may go without reading the programs' RSS. Once armed it
// is short (the evictor answers to the kernel's count). Before, it is the time the programs
// would need, growing at growthBound, to cross the arming threshold: a program far below its
// cap costs the runtime a few reads a second, not hundreds. The arming margin (armMargin) is
// what absorbs a program that outruns the bound.
func pollInterval(armed bool, total, armPages int64) time.Duration {
	if armed {
		return fastestPoll
	}
	d := time.Duration(float64(armPages-total) * PageSize / growthBound * float64(time.Second))
	return min(max(d, fastestPoll), slowestPoll)
}

// The bounds of pollInterval. A program far below the cap, or one watched by its memory
// cgroup (usageWatch), is polled at the slowest, which only keeps PeakAnonPages current.
const fastestPoll, slowestPoll = 2 * time.Millisecond, 50 * time.Millisecond
