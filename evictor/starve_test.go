package evictor

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
)

// noAgent is a process with pages but no agent yet (a fork child before its hello): nothing of
// it can be evicted.
type noAgent struct{ tb *pagetable.PageTable }

func (n *noAgent) Pid() int                                                   { return 1 }
func (n *noAgent) UFFD() int                                                  { return -1 }
func (n *noAgent) Table() *pagetable.PageTable                                { return n.tb }
func (n *noAgent) CanEvict() bool                                             { return false }
func (n *noAgent) Space() backend.Space                                       { return 0 }
func (n *noAgent) Drop(func() []Run) error                                    { return ErrGone }
func (n *noAgent) Staging() uint64                                            { return 0 }
func (n *noAgent) Move(runs []Run, dst uint64, layout uint64, s []byte) error { return ErrGone }
func (n *noAgent) Fenced(op func() error) error                               { return op() }
func (n *noAgent) Fail(error)                                                 {}
func (n *noAgent) WakeIfWaiting()                                             {}
func (n *noAgent) Hold() bool                                                 { return true }
func (n *noAgent) Release()                                                   {}

// Over the cap with nothing it can take, the evictor says it is starved (faults waiting for
// room would wait for ever); below its high watermark again, it is not.
func TestEvictorStarvesWithNothingToTake(t *testing.T) {
	var resident atomic.Int64
	tb := pagetable.New(&resident, pagetable.NewSlots(backend.NewMemory()))
	tb.Lock()
	for i := range 200 {
		tb.Install(uint64(i+1)<<12, pagetable.Written, 0)
	}
	tb.Unlock()
	e := New(Config{CapPages: 128, Resident: &resident, Backend: backend.NewMemory(),
		Targets: func() []Target { return []Target{&noAgent{tb}} }})
	if e.Starved() {
		t.Fatal("starved before it looked")
	}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { e.Loop(stop); close(done) }()
	defer func() { close(stop); <-done }()
	e.Kick()
	waitFor(t, "starved", e.Starved)
	// The program discards most of its memory: below the high watermark, no longer starved.
	tb.Lock()
	tb.DiscardRange(1<<12, 151<<12)
	tb.Unlock()
	e.Kick()
	waitFor(t, "not starved", func() bool { return !e.Starved() })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within 10 s", what)
		}
		time.Sleep(time.Millisecond)
	}
}
