package remote

import (
	"bytes"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/fabric"
)

// countingTransport counts the read requests made through a real transport.
type countingTransport struct {
	fabric.Transport
	reads *atomic.Int64
}

func (c countingTransport) Read(addrs []fabric.Addr, pages []byte) error {
	c.reads.Add(1)
	return c.Transport.Read(addrs, pages)
}

// openCounting opens a store whose transports count their read requests in reads.
func (c *cluster) openCounting(replicas int, reads *atomic.Int64) *Store {
	c.t.Helper()
	dial := func(addr string, cfg fabric.DialConfig) (fabric.Transport, error) {
		t, err := fabric.DialTCP(addr, cfg)
		if err != nil {
			return nil, err
		}
		return countingTransport{t, reads}, nil
	}
	s, err := Open(Config{Ctrl: c.ctrl, Token: token, Replicas: replicas, Name: c.t.Name(), Logf: c.t.Logf, Dial: dial})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { s.Close() })
	return s
}

// batchAcross returns slots of pages taken by turns from the first slabs slabs, n from each.
func batchAcross(t *testing.T, pages map[backend.Slot][]byte, slabs, n int) []backend.Slot {
	t.Helper()
	var per [][]backend.Slot
	for i := range slabs {
		got := slotsOf(pages, i, n)
		if len(got) < n {
			t.Fatalf("slab %d holds %d of the pages, want %d", i, len(got), n)
		}
		per = append(per, got)
	}
	var out []backend.Slot
	for j := range n {
		for i := range slabs {
			out = append(out, per[i][j])
		}
	}
	return out
}

// A batch whose pages lie in several slabs with their copies on one server is one request to
// it, and every page comes back as stored.
func TestLoadBatchAcrossSlabsIsOneRequest(t *testing.T) {
	c := newCluster(t, 1)
	var reads atomic.Int64
	s := c.openCounting(1, &reads)
	pages := storePages(t, s, 51, 700) // 3 slabs of 256 pages
	slots := batchAcross(t, pages, 3, 10)
	dst := make([]byte, len(slots)*backend.PageSize)
	before := reads.Load()
	if err := s.LoadBatch(slots, dst); err != nil {
		t.Fatal(err)
	}
	if n := reads.Load() - before; n != 1 {
		t.Errorf("a batch of %d pages in 3 slabs on one server took %d read requests, want 1", len(slots), n)
	}
	for i, sl := range slots {
		if !bytes.Equal(dst[i*backend.PageSize:(i+1)*backend.PageSize], pages[sl]) {
			t.Fatalf("page %d of the batch (slot %#x) came back with other bytes", i, sl)
		}
	}
}

// A page of a batch that comes back with a wrong checksum fails the batch (the caller then
// loads page by page, which fails over between copies).
func TestLoadBatchChecksEveryPage(t *testing.T) {
	c := newCluster(t, 1)
	s := c.open(1)
	pages := storePages(t, s, 52, 700)
	slots := batchAcross(t, pages, 3, 4)
	sb, pg, err := s.slot(slots[len(slots)-1])
	if err != nil {
		t.Fatal(err)
	}
	evil, err := fabric.DialTCP(c.servers[0].addr, fabric.DialConfig{Token: token, Session: s.Session()})
	if err != nil {
		t.Fatal(err)
	}
	defer evil.Close()
	if err := evil.Write([]fabric.Addr{{Slab: sb.id, Page: pg}}, bytes.Repeat([]byte{0xAB}, backend.PageSize)); err != nil {
		t.Fatal(err)
	}
	err = s.LoadBatch(slots, make([]byte, len(slots)*backend.PageSize))
	if err == nil || !strings.Contains(err.Error(), "wrong checksum") {
		t.Fatalf("a batch with an overwritten page: %v, want a wrong checksum", err)
	}
}

// A server refuses a whole batch when one of its slabs is gone, without saying which: no copy
// is reported bad for it, not even the gone one (the page-by-page loads that follow find that
// one), and the copies of the other slabs stay.
func TestLoadBatchGoneSlabReportsNoCopy(t *testing.T) {
	c := newCluster(t, 1)
	s := c.open(1)
	pages := storePages(t, s, 53, 700)
	slots := batchAcross(t, pages, 2, 4)
	s.mu.Lock()
	a, b := s.slabs[0], s.slabs[1]
	s.mu.Unlock()
	c.servers[0].srv.FreeSlab(a.id)
	if err := s.LoadBatch(slots, make([]byte, len(slots)*backend.PageSize)); err == nil {
		t.Fatal("a batch with a page of a slab gone from its server was read")
	}
	for _, sl := range []*slab{a, b} {
		sl.mu.RLock()
		for _, r := range sl.replicas {
			if r.bad.Load() {
				t.Errorf("slab %d's copy was reported bad by a batch refused as a whole", sl.id)
			}
		}
		sl.mu.RUnlock()
	}
	buf := make([]byte, backend.PageSize)
	for _, sl := range slotsOf(pages, 1, 4) {
		if err := s.Load(sl, buf); err != nil {
			t.Fatalf("slot %#x, of the slab still there: %v", sl, err)
		}
		if !bytes.Equal(buf, pages[sl]) {
			t.Fatalf("slot %#x came back with other bytes", sl)
		}
	}
}
