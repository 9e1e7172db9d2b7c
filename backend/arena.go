package backend

import (
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
)

// arena keeps fixed-size blobs in large chunks, indexed from 1 so that index 0 never names a
// blob (slots are never 0), with free lists of released indices that are reused first.
// Storing and loading copy into and out of a chunk and allocate nothing once the chunks
// exist. Memory is one arena of whole pages; Compressed has one per size class.
//
// The chunks are mapped with mmap, outside the Go heap: a store of a few GiB on the heap would
// set the collector's goal at twice that, so every byte of garbage the rest of farmem makes
// could stay resident up to the store's size again. Outside the heap, the pages of freed blobs
// can also be given back to the kernel (trim), which the store does once they add up to more
// than trimShare of what it holds, so that farmem's memory follows what its store holds
// rather than the most it ever held.
//
// An arena has no lock of its own: its owner's lock protects every field.
type arena struct {
	size     int     // bytes per blob; at most PageSize, so a length fits a uint16
	perChunk int     // blobs per chunk
	chunks   []chunk // chunk i holds indices [i*perChunk+1, (i+1)*perChunk]; nil once closed
	// free holds released indices whose memory may still be resident: reused first, last in
	// first out, so a page freed and stored again in the next eviction batch costs no fault.
	free []int
	// cold holds released indices whose pages trim gave back (or tried to: a page that also
	// holds a live blob stays), reused once free is empty.
	cold  []int
	next  int // next never-used index
	inUse int // blobs currently holding data
}

// chunk is one mapping of perChunk blobs. The lengths live beside the data, allocated with it,
// so a new blob never grows a slice of its own.
type chunk struct {
	data []byte   // perChunk blobs of size bytes each, mapped anonymous and private
	lens []uint16 // stored length of each blob; 0 marks a free index, so it doubles as the guard against loading one
}

const (
	// trimShare: free blobs are given back once the pages they may keep resident (one each)
	// come to more than 1/trimShare of the bytes in use; each trim then gives back up to that
	// much, so its system calls are amortized over that many frees.
	trimShare = 16
	// trimMin is the least a trim gives back, so a nearly empty store does not trim on every
	// free.
	trimMin = 2 << 20
)

// newArena returns an empty arena of size-byte blobs that grows chunkBytes at a time.
func newArena(size, chunkBytes int) arena {
	return arena{size: size, perChunk: max(chunkBytes/size, 1), next: 1}
}

// put copies b (1 to size bytes) into a free blob and returns its index. It fails only if a
// new chunk cannot be mapped.
func (a *arena) put(b []byte) (int, error) {
	var i int
	if k := len(a.free); k > 0 {
		i = a.free[k-1]
		a.free = a.free[:k-1]
	} else if k := len(a.cold); k > 0 {
		i = a.cold[k-1]
		a.cold = a.cold[:k-1]
	} else {
		if (a.next-1)/a.perChunk >= len(a.chunks) {
			// MAP_NORESERVE: a chunk's pages are only promised once written, as the Go
			// heap's would be, so an arena that never fills its last chunk is not charged
			// for it under strict overcommit.
			data, err := unix.Mmap(-1, 0, a.perChunk*a.size, unix.PROT_READ|unix.PROT_WRITE,
				unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
			if err != nil {
				return 0, fmt.Errorf("backend: cannot map %d more bytes for the store: %w", a.perChunk*a.size, err)
			}
			a.chunks = append(a.chunks, chunk{data: data, lens: make([]uint16, a.perChunk)})
		}
		i = a.next
		a.next++
	}
	c, j := a.locate(i)
	copy(c.data[j*a.size:(j+1)*a.size], b)
	c.lens[j] = uint16(len(b))
	a.inUse++
	return i, nil
}

// get returns the stored bytes of blob i, or nil if i holds nothing (never stored, freed, out
// of range, or the arena was closed). The slice aliases the chunk: use it under the owner's lock.
func (a *arena) get(i int) []byte {
	if i < 1 || i >= a.next || (i-1)/a.perChunk >= len(a.chunks) {
		return nil
	}
	c, j := a.locate(i)
	n := int(c.lens[j])
	if n == 0 {
		return nil
	}
	return c.data[j*a.size : j*a.size+n]
}

// release frees blob i for reuse; it reports false if i held nothing, which callers treat as a
// double free. Once enough is free it trims, under the owner's lock like everything else.
func (a *arena) release(i int) bool {
	if a.get(i) == nil {
		return false
	}
	c, j := a.locate(i)
	c.lens[j] = 0
	a.free = append(a.free, i)
	a.inUse--
	// Counted in pages, not blobs' bytes: a free blob of a small class can keep a whole page
	// resident when its neighbours were freed and trimmed before it.
	if len(a.free)*PageSize > max(trimMin, a.inUse*a.size/trimShare) {
		a.trim()
	}
	return true
}

// trim gives back to the kernel every page of the chunks that holds only free blobs among the
// blobs of free, with MADV_DONTNEED: the page reads as zeros and costs nothing until a blob on
// it is stored again. A blob of a size class that shares a page with a live blob keeps the page.
// free's blobs then move to cold. Sorting first makes neighbouring blobs one madvise call.
func (a *arena) trim() {
	slices.Sort(a.free)
	run := pageRun{chunk: -1}
	for _, i := range a.free {
		ci, j := (i-1)/a.perChunk, (i-1)%a.perChunk
		c := &a.chunks[ci]
		for p := j * a.size / PageSize; p <= ((j+1)*a.size-1)/PageSize; p++ {
			if ci == run.chunk && p < run.end || !a.pageFree(c, p) {
				continue // already in the run, or a live blob shares the page
			}
			if ci != run.chunk || p != run.end {
				run.release(a.chunks)
				run = pageRun{chunk: ci, start: p, end: p}
			}
			run.end++
		}
	}
	run.release(a.chunks)
	a.cold = append(a.cold, a.free...)
	a.free = a.free[:0]
}

// pageFree reports whether every blob on page p of chunk c is free.
func (a *arena) pageFree(c *chunk, p int) bool {
	last := min(((p+1)*PageSize-1)/a.size, a.perChunk-1)
	for j := p * PageSize / a.size; j <= last; j++ {
		if c.lens[j] != 0 {
			return false
		}
	}
	return true
}

// pageRun is pages [start, end) of chunk chunk, to be given back in one call.
type pageRun struct{ chunk, start, end int }

func (r pageRun) release(chunks []chunk) {
	if r.chunk < 0 || r.start == r.end {
		return
	}
	data := chunks[r.chunk].data
	// The slice ends at the last blob, which may end inside a page; the kernel rounds the
	// length up to the page, which is free too (pageFree checked every blob on it).
	lo, hi := r.start*PageSize, min(r.end*PageSize, len(data))
	// An error here would only leave the pages resident: the data they held is free either way.
	_ = unix.Madvise(data[lo:hi], unix.MADV_DONTNEED)
}

// close unmaps the chunks; every index then reads as holding nothing. next is kept so that a
// stale index is never mistaken for a live one.
func (a *arena) close() {
	for _, c := range a.chunks {
		_ = unix.Munmap(c.data)
	}
	a.chunks, a.free, a.cold, a.inUse = nil, nil, nil, 0
}

func (a *arena) locate(i int) (*chunk, int) {
	return &a.chunks[(i-1)/a.perChunk], (i - 1) % a.perChunk
}
