package fetcher

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// statm reads one process's resident anonymous pages from /proc/PID/statm. The file is opened
// once and re-read with pread: the kernel regenerates it on every read from offset 0, and one
// pread is a fifth of the syscalls of open+read+close (the runtime reads it hundreds of times a
// second while a program runs near its cap).
type statm struct {
	fd  int
	buf [128]byte
}

func openStatm(pid int) (*statm, error) {
	fd, err := unix.Open(fmt.Sprintf("/proc/%d/statm", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &statm{fd: fd}, nil
}

// anonPages returns resident - shared (the second and third fields), or 0 once the process is
// gone.
func (s *statm) anonPages() int64 {
	n, err := unix.Pread(s.fd, s.buf[:], 0)
	if err != nil || n <= 0 {
		return 0
	}
	f := s.buf[:n]
	var fields [3]int64
	for i := range fields {
		for len(f) > 0 && f[0] == ' ' {
			f = f[1:]
		}
		for len(f) > 0 && f[0] >= '0' && f[0] <= '9' {
			fields[i] = fields[i]*10 + int64(f[0]-'0')
			f = f[1:]
		}
	}
	return fields[1] - fields[2]
}

func (s *statm) close() { unix.Close(s.fd) }

// growthBound is the fastest a program's anonymous memory is assumed to grow: two CPUs each
// first-touching a 4 KiB page per ~0.5 us (DESIGN.md: kernel first-touch 0.5-1.2 us/page) with
// room to spare for transparent huge pages.
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
