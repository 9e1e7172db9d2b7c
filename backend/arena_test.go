package backend

import (
	"bytes"
	"encoding/binary"
	"math/rand/v2"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// residentPages is how many of the arena's chunk pages the kernel has in memory (mincore):
// what the arena costs farmem's RSS, counted by the kernel rather than by the arena.
func residentPages(t *testing.T, a *arena) int {
	t.Helper()
	n := 0
	for _, c := range a.chunks {
		vec := make([]byte, (len(c.data)+PageSize-1)/PageSize)
		_, _, e := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&c.data[0])), uintptr(len(c.data)), uintptr(unsafe.Pointer(&vec[0])))
		if e != 0 {
			t.Fatal(e)
		}
		for _, v := range vec {
			n += int(v & 1)
		}
	}
	return n
}

// free releases blob i of a and, if that makes a trim due, runs it as the owner's trimmer would.
func free(t *testing.T, a *arena, i int) {
	t.Helper()
	if !a.release(i) {
		t.Fatalf("release of a held blob %d failed", i)
	}
	if a.takeTrim() {
		a.rel.flush()
		a.endTrim()
	}
}

// blob is blob number i of n bytes, none of them zero, different for every i.
func blob(i, n int) []byte {
	b := make([]byte, n)
	for k := range b {
		b[k] = byte(i*7+k*13) | 1
	}
	return b
}

// A store that filled up and then freed most of what it held gives the pages back: the kernel
// counts no more of it resident than what it still holds and the free share trim allows, and
// every blob still held reads back intact, then and after the freed ones are reused.
func TestArenaTrimGivesFreedPagesBack(t *testing.T) {
	for _, size := range []int{PageSize, 768, 256} {
		a := newArena(size, 4<<20)
		const n = 16384
		idx := make([]int, n)
		for i := range idx {
			var err error
			if idx[i], err = a.put(blob(i, size)); err != nil {
				t.Fatal(err)
			}
		}
		full := residentPages(t, &a)
		if want := n * size / PageSize; full < want {
			t.Fatalf("size %d: %d pages resident after storing %d bytes, want at least %d", size, full, n*size, want)
		}
		// Free all but every 64th blob, in an order that is not the order of the indices.
		for k := range n {
			if i := (k * 40503) % n; i%64 != 0 {
				free(t, &a, idx[i])
			}
		}
		kept := n / 64
		// Every kept blob keeps its page (or two, for a blob across a page boundary); beyond
		// those, only the free blobs not yet trimmed may keep pages, as many each.
		perBlob := 1
		if PageSize%size != 0 {
			perBlob = 2
		}
		allow := (kept + max(trimMin, kept*size/trimShare)/PageSize) * perBlob
		got := residentPages(t, &a)
		t.Logf("size %d: %d pages resident when full, %d holding %d blobs (at most %d allowed)", size, full, got, kept, allow)
		if got > allow {
			t.Errorf("size %d: %d of %d pages still resident holding %d blobs, want at most %d", size, got, full, kept, allow)
		}
		check := func() {
			for i := 0; i < n; i += 64 {
				if got := a.get(idx[i]); !bytes.Equal(got, blob(i, size)) {
					t.Fatalf("size %d: blob %d came back different after trims", size, i)
				}
			}
		}
		check()
		// Reuse the trimmed blobs: they read back what is stored in them, and the kept ones
		// are not touched.
		for k := range n - kept {
			i, err := a.put(blob(n+k, size))
			if err != nil {
				t.Fatal(err)
			}
			if got := a.get(i); !bytes.Equal(got, blob(n+k, size)) {
				t.Fatalf("size %d: a reused blob came back different", size)
			}
		}
		check()
		if a.next != n+1 {
			t.Errorf("size %d: the arena grew to %d blobs for %d held: freed ones were not reused", size, a.next-1, n)
		}
		a.close()
	}
}

// A page shared by a live blob and free ones stays: trimming it would zero the live blob.
func TestArenaTrimKeepsSharedPages(t *testing.T) {
	const size = 768 // five blobs and a third to a page: blobs cross page boundaries
	a := newArena(size, 1<<20)
	n := 2 * (trimMin/size + 1)
	idx := make([]int, n)
	for i := range idx {
		idx[i], _ = a.put(blob(i, size))
	}
	// Keep every 16th blob: each kept one shares its page with free ones.
	for i := range idx {
		if i%16 != 0 {
			free(t, &a, idx[i])
		}
	}
	if len(a.cold) == 0 {
		t.Fatalf("no trim after freeing %d blobs of %d bytes", n-n/16, size)
	}
	for i := 0; i < n; i += 16 {
		if got := a.get(idx[i]); !bytes.Equal(got, blob(i, size)) {
			t.Fatalf("blob %d, which shares its page with trimmed ones, came back different", i)
		}
	}
	a.close()
}

// A store that frees blobs for a batch and stores as many again, as eviction does, trims
// nothing: the freed blobs are reused while still resident.
func TestArenaNoTrimInSteadyState(t *testing.T) {
	a := newArena(PageSize, 4<<20)
	idx := make([]int, 1024)
	for i := range idx {
		idx[i], _ = a.put(blob(i, PageSize))
	}
	for round := range 50 {
		for k := range 256 {
			free(t, &a, idx[(round*256+k)%len(idx)])
		}
		for k := range 256 {
			i := (round*256 + k) % len(idx)
			idx[i], _ = a.put(blob(i, PageSize))
		}
	}
	if len(a.cold) != 0 || a.next != len(idx)+1 {
		t.Errorf("steady rewrites trimmed %d blobs and grew the arena to %d", len(a.cold), a.next-1)
	}
	a.close()
}

// The trimmer gives pages back while the store goes on storing, loading and freeing, as the
// evictor and the fault threads do: no page a trim gives back may hold a blob stored meanwhile.
// Every round fills, frees most of it at random (a trim becomes due, and runs on the trimmer's
// goroutine) and at once stores again into the freed slots, while other goroutines load; every
// live page is checked each round.
func TestTrimWhileStoring(t *testing.T) {
	stores := map[string]Backend{"memory": NewMemory(), "none": NewCompressed(nil)}
	if c, err := CodecByName("lz4"); err == nil {
		stores["lz4"] = NewCompressed(c)
	}
	// page writes page id into p: a compressible page that differs by id.
	base := bytes.Repeat([]byte("farmem trim test "), PageSize/16+1)[:PageSize]
	page := func(p []byte, id uint64) []byte {
		copy(p, base)
		for _, off := range []int{0, 1000, 2048, PageSize - 8} {
			binary.LittleEndian.PutUint64(p[off:], id)
		}
		return p
	}
	for name, s := range stores {
		t.Run(name, func(t *testing.T) {
			defer s.Close()
			r := rand.New(rand.NewPCG(7, 8))
			var mu sync.Mutex // guards live and the order of Frees against the loaders' Loads
			live := map[Slot]uint64{}
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					dst, want := make([]byte, PageSize), make([]byte, PageSize)
					for {
						select {
						case <-stop:
							return
						default:
						}
						mu.Lock()
						for sl, id := range live { // one a turn: the map's order is random
							if err := s.Load(sl, dst); err != nil || !bytes.Equal(dst, page(want, id)) {
								t.Errorf("slot %#x (page %d) came back different or failed (%v) while trims ran", sl, id, err)
							}
							break
						}
						mu.Unlock()
					}
				}()
			}
			next := uint64(1)
			buf := make([]byte, 2048*PageSize)
			slots := make([]Slot, 2048)
			store := func(n int) {
				for i := range n {
					page(buf[i*PageSize:(i+1)*PageSize], next+uint64(i))
				}
				if err := s.Store(buf[:n*PageSize], slots[:n]); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				for i, sl := range slots[:n] {
					live[sl] = next + uint64(i)
				}
				mu.Unlock()
				next += uint64(n)
			}
			dst, want := make([]byte, PageSize), make([]byte, PageSize)
			for range 6 {
				store(2048)
				mu.Lock()
				for sl := range live {
					if r.IntN(8) != 0 {
						delete(live, sl)
						s.Free(sl)
					}
				}
				mu.Unlock()
				store(1024)
				mu.Lock()
				for sl, id := range live {
					if err := s.Load(sl, dst); err != nil || !bytes.Equal(dst, page(want, id)) {
						t.Fatalf("slot %#x (page %d) came back different or failed (%v) after a trim", sl, id, err)
					}
				}
				mu.Unlock()
			}
			close(stop)
			wg.Wait()
		})
	}
}

// put copies b into a free blob of a, as Memory and Compressed do, and returns its index.
func (a *arena) put(b []byte) (int, error) {
	i, blob, _, err := a.take(len(b))
	if err != nil {
		return 0, err
	}
	copy(blob, b)
	return i, nil
}

// Every never-used blob's memory is handed out to be filled in by the time the blob is, each
// page once, in page-aligned stretches of at most fillAhead bytes (a blob across a stretch's
// end takes its stretch a page further); filled in, those pages are resident before anything
// is written to them, and the blobs then read back what was put.
func TestArenaFillsInAhead(t *testing.T) {
	for _, size := range []int{PageSize, 768, 256} {
		const chunkBytes = 1 << 20
		a := newArena(size, chunkBytes)
		n := 3*a.perChunk + 5       // into a fourth chunk
		handed := map[uintptr]int{} // page address: times handed out
		var filledPages int
		for i := range n {
			idx, dst, ahead, err := a.take(size)
			if err != nil {
				t.Fatal(err)
			}
			if idx != i+1 {
				t.Fatalf("size %d: take %d gave index %d", size, i, idx)
			}
			if ahead != nil {
				start := uintptr(unsafe.Pointer(&ahead[0]))
				if start%PageSize != 0 || len(ahead) > fillAhead+PageSize {
					t.Fatalf("size %d: blob %d handed out %d bytes at %#x: not a page-aligned stretch of at most %d", size, idx, len(ahead), start, fillAhead+PageSize)
				}
				before := residentPages(t, &a)
				prefault(ahead)
				pages := (len(ahead) + PageSize - 1) / PageSize
				for p := range pages {
					handed[start+uintptr(p*PageSize)]++
				}
				filledPages += pages
				if got := residentPages(t, &a); got < before+pages-1 { // the blob's own page may be resident already
					t.Fatalf("size %d: %d pages resident after filling in %d more, want at least %d", size, got, pages, before+pages-1)
				}
			}
			// The blob's bytes lie on pages handed out already.
			first := uintptr(unsafe.Pointer(&dst[0])) &^ (PageSize - 1)
			last := (uintptr(unsafe.Pointer(&dst[0])) + uintptr(size) - 1) &^ (PageSize - 1)
			for p := first; p <= last; p += PageSize {
				if handed[p] == 0 {
					t.Fatalf("size %d: blob %d lies on page %#x, which was never handed out to be filled in", size, idx, p)
				}
			}
			copy(dst, blob(idx, size))
		}
		for p, k := range handed {
			if k != 1 {
				t.Fatalf("size %d: page %#x handed out %d times", size, p, k)
			}
		}
		if want := 3*((chunkBytes+PageSize-1)/PageSize) + 1; filledPages > want+fillAhead/PageSize {
			t.Fatalf("size %d: %d pages filled in for %d blobs in 4 chunks, want at most %d", size, filledPages, n, want+fillAhead/PageSize)
		}
		for i := 1; i <= n; i++ {
			if got := a.get(i); !bytes.Equal(got, blob(i, size)) {
				t.Fatalf("size %d: blob %d reads back different", size, i)
			}
		}
		a.close()
	}
}
