package evictor

import (
	"sync/atomic"
	"testing"
	"time"
)

// A ring wakes a waiter that sleeps on the futex, from another goroutine.
func TestDoorbellRingWakesSleeper(t *testing.T) {
	var d doorbell
	done := make(chan struct{})
	go func() {
		d.wait(0) // no timeout: only a ring ends it
		close(done)
	}()
	for d.word.Load() != bellAsleep { // the waiter is on the futex, or about to be
		time.Sleep(time.Millisecond)
	}
	d.ring()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return after a ring")
	}
	if w := d.word.Load(); w != bellQuiet {
		t.Fatalf("word after wait = %d, want quiet", w)
	}
}

// A ring before the wait is not lost: the wait returns at once; rings that pile up are one.
func TestDoorbellRingBeforeWaitIsKept(t *testing.T) {
	var d doorbell
	d.ring()
	d.ring()
	done := make(chan struct{})
	go func() {
		d.wait(0)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("a ring before the wait was lost")
	}
	// Both rings were consumed by that one wait: the next sleeps until its timeout.
	d.wait(time.Millisecond)
	if w := d.word.Load(); w != bellQuiet {
		t.Fatalf("word after a timed-out wait = %d, want quiet", w)
	}
}

// Loop sleeps until kicked or stopped, and returns when stop closes.
func TestLoopReturnsOnStop(t *testing.T) {
	var resident atomic.Int64
	e := New(Config{CapPages: 1024, Resident: &resident, Targets: func() []Target { return nil }})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		e.Loop(stop)
		close(done)
	}()
	e.Kick() // nothing over the watermark: a look, and back to sleep
	close(stop)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Loop did not return after stop")
	}
}
