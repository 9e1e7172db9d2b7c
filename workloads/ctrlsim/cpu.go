package main

import (
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// kind is a kind of call into the state machine, or the service's save.
type kind int

const (
	kindServerHeartbeat kind = iota
	kindSessionHeartbeat
	kindOpen
	kindAlloc
	kindFree
	kindSlabs
	kindReady
	kindClose
	kindTick
	kindStatus
	kindSave
	nKinds
)

var kindNames = [nKinds]string{"server heartbeat", "session heartbeat", "open session", "alloc slab", "free slab",
	"slab map", "replica ready", "close session", "tick", "status", "save: State + EtcdSaveTxn"}

// cpuMeter times every call by the CPU time of the thread that runs it (the simulation runs
// on one goroutine locked to its thread, so other processes on the machine do not count): the
// only timing of the simulation, and the only part of its output that differs between runs of
// one seed. The Go runtime's background garbage collection runs on other threads and is not
// in it; run.csv has the process's CPU time in all.
type cpuMeter struct {
	d [nKinds][]time.Duration
}

func threadCPU() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

func (m *cpuMeter) time(k kind, fn func()) {
	if m == nil {
		fn()
		return
	}
	t := threadCPU()
	fn()
	m.d[k] = append(m.d[k], threadCPU()-t)
}

// CPURow sums up one kind of call.
type CPURow struct {
	Kind                 string
	Count                int
	MeanUs, P50Us, P99Us float64
	TotalS               float64
}

func (m *cpuMeter) rows() []CPURow {
	var out []CPURow
	for k := range nKinds {
		d := slices.Clone(m.d[k])
		if len(d) == 0 {
			continue
		}
		slices.Sort(d)
		var sum time.Duration
		for _, v := range d {
			sum += v
		}
		us := func(v time.Duration) float64 { return float64(v) / 1e3 }
		out = append(out, CPURow{Kind: kindNames[k], Count: len(d), MeanUs: us(sum) / float64(len(d)),
			P50Us: us(d[len(d)/2]), P99Us: us(d[len(d)*99/100]), TotalS: sum.Seconds()})
	}
	return out
}
