package fetcher

import (
	"bytes"
	"sync/atomic"
	"testing"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
)

// cachePut caches page addr of p as entry e (slot 1) holding the byte fill.
func cachePut(c *PrefetchCache, p *Fetcher, addr uint64, e *pagetable.Entry, fill byte) {
	w := &prefetchWork{n: 1}
	w.addr[0], w.entry[0], w.seq[0], w.slot[0] = addr, e, e.Seq, e.Slot
	c.put(p, w, 0, bytes.Repeat([]byte{fill}, ps))
}

func evicted(seq uint32) *pagetable.Entry {
	return &pagetable.Entry{State: pagetable.Evicted, Seq: seq, Slot: backend.Slot(1)}
}

func TestPrefetchCache(t *testing.T) {
	var held atomic.Int64
	c := NewPrefetchCache(2, &held)
	p, q := &Fetcher{}, &Fetcher{}
	dst := make([]byte, ps)
	a, b, d := evicted(1), evicted(1), evicted(1)

	cachePut(c, p, 0x1000, a, 'a')
	cachePut(c, q, 0x1000, b, 'b') // another process's page at the same address
	if held.Load() != 2 {
		t.Fatalf("held %d, want 2", held.Load())
	}
	if !c.take(q, 0x1000, b, dst) || dst[0] != 'b' {
		t.Fatalf("q's page not served, or served from p's copy (%q)", dst[0])
	}
	if c.take(q, 0x1000, b, dst) || held.Load() != 1 {
		t.Fatalf("a hit must free its buffer at once (held %d)", held.Load())
	}
	// Full: the oldest prediction goes first, and only when there is no free buffer.
	cachePut(c, p, 0x2000, d, 'd')
	cachePut(c, p, 0x3000, evicted(1), 'e')
	if c.Evicted.Load() != 1 || c.cached(p, 0x1000) || !c.cached(p, 0x2000) {
		t.Fatalf("FIFO: evicted %d, oldest still cached %v", c.Evicted.Load(), c.cached(p, 0x1000))
	}
	// A copy of a page that changed since it was read is never served, and is dropped.
	d.Seq++ // installed and evicted again meanwhile: the copy is of an older content
	if c.take(p, 0x2000, d, dst) || c.cached(p, 0x2000) {
		t.Fatalf("a stale copy was served or kept")
	}
	e := evicted(1)
	cachePut(c, p, 0x4000, e, 'f')
	e.State = pagetable.Resident // the program got it back meanwhile
	if c.take(p, 0x4000, e, dst) {
		t.Fatalf("a copy of a resident page was served")
	}
	c.forget(p)
	if held.Load() != 0 || c.cached(p, 0x3000) {
		t.Fatalf("forget left %d pages", held.Load())
	}
}
