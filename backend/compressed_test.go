package backend

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// newStore returns a Compressed using the named codec, closed when the test ends.
func newStore(t testing.TB, name string) *Compressed {
	t.Helper()
	c, err := CodecByName(name)
	if err != nil {
		t.Fatal(err)
	}
	s := NewCompressed(c)
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Error(err)
		}
	})
	return s
}

// storeAll stores pages in one batch, as the evictor does, and returns their slots.
func storeAll(t testing.TB, s Backend, pages [][]byte) []Slot {
	t.Helper()
	slots := make([]Slot, len(pages))
	if err := s.Store(slices.Concat(pages...), slots); err != nil {
		t.Fatal(err)
	}
	return slots
}

// checkLoads loads every slot and compares it byte for byte with its page.
func checkLoads(t testing.TB, s Backend, slots []Slot, pages [][]byte) {
	t.Helper()
	dst := make([]byte, PageSize)
	for i, sl := range slots {
		clear(dst)
		if err := s.Load(sl, dst); err != nil {
			t.Fatalf("page %d (slot %#x): %v", i, sl, err)
		}
		if !bytes.Equal(dst, pages[i]) {
			t.Fatalf("page %d (slot %#x) came back different", i, sl)
		}
	}
}

func TestCompressedStoreLoadFreeReuse(t *testing.T) {
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, name)
			pages := mixedPages(64)
			slots := storeAll(t, s, pages)
			checkLoads(t, s, slots, pages)
			for i, sl := range slots {
				if sl == 0 {
					t.Fatalf("page %d got slot 0", i)
				}
				raw := sl&classMask == numClasses-1
				switch {
				case name == "none" && !raw:
					t.Fatalf("page %d stored in class %d with no codec", i, sl&classMask)
				case name != "none" && i%8 < 2 && !raw:
					t.Fatalf("random page %d stored compressed, class %d", i, sl&classMask)
				case name != "none" && i%8 >= 6 && sl&classMask > 1:
					t.Fatalf("sparse or pattern page %d in class %d, want at most 512 bytes", i, sl&classMask)
				}
			}

			// Free every other page: those slots must fail to load (never read as zeros),
			// the rest still load, and storing the same pages again reuses the freed slots.
			var freed []Slot
			var freedPages [][]byte
			for i := 0; i < len(slots); i += 2 {
				freed = append(freed, slots[i])
				freedPages = append(freedPages, pages[i])
			}
			s.Free(freed...)
			dst := make([]byte, PageSize)
			for _, sl := range freed {
				if err := s.Load(sl, dst); !errors.Is(err, ErrUnknownSlot) {
					t.Fatalf("load of freed slot %#x: %v, want ErrUnknownSlot", sl, err)
				}
			}
			if got, want := s.Stored(), len(slots)-len(freed); got != want {
				t.Fatalf("stored %d, want %d", got, want)
			}
			again := storeAll(t, s, freedPages)
			for i := range again {
				// Which freed slot of its class a page lands in is the free list's business.
				slots[2*i] = again[i]
			}
			checkLoads(t, s, slots, pages)
			again = slices.Sorted(slices.Values(again))
			slices.Sort(freed)
			if !slices.Equal(again, freed) {
				t.Fatalf("freed slots not reused: freed %x, got %x", freed, again)
			}
			if s.Stored() != len(slots) {
				t.Fatalf("stored %d, want %d", s.Stored(), len(slots))
			}
		})
	}
}

func TestCompressedUnknownSlotsAndDoubleFree(t *testing.T) {
	s := newStore(t, "lz4")
	slots := storeAll(t, s, mixedPages(8))
	dst := make([]byte, PageSize)
	// 0; an index past the end in a used class; a class never used; a slot too big for int.
	for _, sl := range []Slot{0, slots[2] + 100<<classBits, 1<<classBits | 14, ^Slot(0)} {
		if err := s.Load(sl, dst); !errors.Is(err, ErrUnknownSlot) {
			t.Errorf("load of slot %#x: %v, want ErrUnknownSlot", sl, err)
		}
	}
	if err := s.Store(make([]byte, 100), slots); err == nil {
		t.Error("a partial page was accepted")
	}
	if err := s.Store(make([]byte, 2*PageSize), slots[:1]); err == nil {
		t.Error("two pages into one slot were accepted")
	}

	s.Free(slots[3])
	for _, sl := range []Slot{slots[3], 0, slots[2] + 100<<classBits} {
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), "double free") {
					t.Errorf("free of slot %#x: panic %v, want a double free", sl, r)
				}
			}()
			s.Free(sl)
		}()
	}
	// The panics must not have left the lock held or changed the count.
	if s.Stored() != 7 {
		t.Fatalf("stored %d, want 7", s.Stored())
	}
}

func TestCompressedConcurrentLoads(t *testing.T) {
	for _, name := range codecNames[1:] {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, name)
			pages := mixedPages(128)
			slots := storeAll(t, s, pages)
			stop := make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for g := range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 0))
					dst := make([]byte, PageSize)
					for {
						select {
						case <-stop:
							return
						default:
						}
						i := r.IntN(len(slots))
						if err := s.Load(slots[i], dst); err != nil {
							errs <- err
							return
						}
						if !bytes.Equal(dst, pages[i]) {
							errs <- errors.New("a page came back different")
							return
						}
					}
				}()
			}
			// Meanwhile the evictor stores and other threads free, through the same locks.
			churn := mixedPages(16)
			deadline := time.Now().Add(300 * time.Millisecond)
			for time.Now().Before(deadline) {
				cs := storeAll(t, s, churn)
				var wg2 sync.WaitGroup
				wg2.Add(1)
				go func() { defer wg2.Done(); s.Free(cs...) }()
				wg2.Wait()
			}
			close(stop)
			wg.Wait()
			select {
			case err := <-errs:
				t.Fatal(err)
			default:
			}
		})
	}
}

func TestStoredBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var pages [][]byte
	for range 64 {
		pages = append(pages, textPage(r), heapPage(r), sparsePage(r), patternPage(r))
	}
	raw := int64(len(pages)) * PageSize
	for _, name := range codecNames {
		s := newStore(t, name)
		slots := storeAll(t, s, pages)
		got := s.StoredBytes()
		t.Logf("%s: %d pages in %d bytes (ratio %.2f)", name, len(pages), got, float64(raw)/float64(got))
		if name == "none" && got != raw {
			t.Errorf("none: StoredBytes %d, want %d", got, raw)
		}
		if name != "none" && got > raw/2 {
			t.Errorf("%s: StoredBytes %d for %d compressible pages, want at most half of %d", name, got, len(pages), raw)
		}
		s.Free(slots...)
		if s.StoredBytes() != 0 {
			t.Errorf("%s: StoredBytes %d after freeing everything", name, s.StoredBytes())
		}
	}

	m := NewMemory()
	storeAll(t, m, pages[:3])
	if m.StoredBytes() != 3*PageSize {
		t.Errorf("Memory: StoredBytes %d, want %d", m.StoredBytes(), 3*PageSize)
	}
}

// Store and Load run on every eviction and fault: once the chunks exist they must not
// allocate, or the store would feed the garbage collector in proportion to paging.
func TestCompressedNoAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("sync.Pool drops items at random under the race detector")
	}
	for _, name := range codecNames {
		t.Run(name, func(t *testing.T) {
			s := newStore(t, name)
			r := rand.New(rand.NewPCG(5, 6))
			dst := make([]byte, PageSize)
			slot := make([]Slot, 1)
			for _, gen := range []func(*rand.Rand) []byte{randomPage, textPage, heapPage, sparsePage, patternPage} {
				page := gen(r)
				cycle := func() {
					if err := s.Store(page, slot); err != nil {
						t.Fatal(err)
					}
					if err := s.Load(slot[0], dst); err != nil {
						t.Fatal(err)
					}
					s.Free(slot[0])
				}
				cycle() // the class's first chunk, the free list's first growth
				if n := testing.AllocsPerRun(100, cycle); n != 0 {
					t.Errorf("%d allocations per Store+Load+Free", int(n))
				}
				if !bytes.Equal(dst, page) {
					t.Fatal("page came back different")
				}
			}
		})
	}
}

func TestCodecByName(t *testing.T) {
	for _, name := range codecNames {
		c, err := CodecByName(name)
		if err != nil {
			t.Fatal(err)
		}
		if name == "none" {
			if c != nil {
				t.Errorf("none gave %v, want a nil codec", c.Name())
			}
			continue
		}
		if c.Name() != name {
			t.Errorf("CodecByName(%q).Name() = %q", name, c.Name())
		}
		c.Close()
	}
	_, err := CodecByName("gzip")
	if err == nil || !strings.Contains(err.Error(), "none, lz4, zstd") {
		t.Errorf("unknown codec: %v, want an error listing the valid names", err)
	}
}

// A blob that is damaged, or decodes to other than one page, must fail its Load.
func TestCodecRejectsBadBlobs(t *testing.T) {
	for _, name := range codecNames[1:] {
		t.Run(name, func(t *testing.T) {
			c, err := CodecByName(name)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			r := rand.New(rand.NewPCG(7, 8))
			buf := make([]byte, CompressBound)
			n := c.Compress(buf, textPage(r))
			if n == 0 {
				t.Fatal("a text page did not compress")
			}
			good := slices.Clone(buf[:n])
			dst := make([]byte, PageSize)
			if err := c.Decompress(dst, good); err != nil {
				t.Fatal(err)
			}
			// A short page: the first half of a pattern page, compressed alone.
			half := make([]byte, 2*CompressBound)
			var short []byte
			switch name {
			case "lz4":
				var lc lz4Codec
				k, err := lc.c.CompressBlock(patternPage(r)[:PageSize/2], half)
				if err != nil {
					t.Fatal(err)
				}
				short = half[:k]
			case "zstd":
				short = c.(*zstdCodec).enc.EncodeAll(patternPage(r)[:PageSize/2], nil)
			}
			for what, blob := range map[string][]byte{
				"truncated": good[:n/2],
				"garbage":   randomPage(r)[:n],
				"half page": short,
				"empty":     nil,
			} {
				if err := c.Decompress(dst, blob); !errors.Is(err, errCorruptPage) {
					t.Errorf("%s blob: %v, want errCorruptPage", what, err)
				}
			}
		})
	}
}

func TestCompressedClose(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, name := range codecNames {
		c, err := CodecByName(name)
		if err != nil {
			t.Fatal(err)
		}
		s := NewCompressed(c)
		pages := mixedPages(16)
		slots := storeAll(t, s, pages)
		checkLoads(t, s, slots, pages)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := s.Load(slots[0], make([]byte, PageSize)); !errors.Is(err, ErrUnknownSlot) {
			t.Errorf("%s: load after Close: %v, want ErrUnknownSlot", name, err)
		}
		if err := s.Store(pages[0], slots); err == nil {
			t.Errorf("%s: Store after Close succeeded", name)
		}
		func() {
			defer func() {
				if r := recover(); r == nil || !strings.Contains(r.(string), "after Close") {
					t.Errorf("%s: Free after Close: panic %v, want one naming the Close", name, r)
				}
			}()
			s.Free(slots[0])
		}()
		if err := s.Close(); err != nil {
			t.Errorf("%s: second Close: %v", name, err)
		}
	}
	if after := runtime.NumGoroutine(); after > before {
		t.Errorf("%d goroutines before, %d after closing the stores", before, after)
	}
}
