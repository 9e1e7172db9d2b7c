package backend

import (
	"errors"
	"fmt"
	"slices"
	"sync/atomic"

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
// can also be given back to the kernel, which the store's trimmer does once they add up to more
// than a trimShare-th of what it holds (see trimmer), so that farmem's memory follows what its
// store holds rather than the most it ever held.
//
// A file arena (newFileArena) maps its chunks from a memfd instead, one after another, so that the
// memory can also be mapped by another process: Memory keeps each served process's pages in one
// (see Space). Its trims punch the freed pages out of the file (MADV_REMOVE): dropping a shared
// mapping's pages would leave them in the file. The file is mapped, not written and read with
// pwrite and pread, though on a PVM guest a page's first write through a mapping costs more
// than a pwrite: that saves only while the store grows, and every load would pay a system call
// on the fault's path instead (results/storefile.md).
//
// An arena has no lock of its own: its owner's lock protects every field, except rel between
// takeTrim and endTrim, which belongs to the owner's trimmer alone.
type arena struct {
	size     int     // bytes per blob; at most PageSize, so a length fits a uint16
	perChunk int     // blobs per chunk
	chunks   []chunk // chunk i holds indices [i*perChunk+1, (i+1)*perChunk]; nil once closed
	// free holds released indices whose memory may still be resident: reused first, last in
	// first out, so a page freed and stored again in the next eviction batch costs no fault.
	free []int
	// cold holds released indices whose pages a trim gave back (or tried to: a page that also
	// holds a live blob stays), reused once free is empty.
	cold []int
	next int // next never-used index
	// fillChunk, filledTo: bytes [0, filledTo) of chunk fillChunk, a page boundary or the
	// chunk's end, have been handed to a caller to fill in ahead of their first write (see
	// fillAhead); nothing past them has.
	fillChunk, filledTo int
	inUse               int // blobs currently holding data
	// due: free has grown past the trim threshold, and the owner's trimmer should take it.
	due bool
	// trimming: rel's pages are being given back outside the lock. Until endTrim, put must
	// not reuse a cold blob: it may lie on one of those pages, whose data the kernel would
	// then discard.
	trimming bool
	rel      releaser
	// file is the memfd chunk i maps at offset i*perChunk*size, or -1: the chunks are anonymous
	// memory. Set at construction; closed by close.
	file int
	// trimLeast is the least a trim gives back: trimMin, or less for a file arena.
	trimLeast int
}

// chunk is one mapping of perChunk blobs. The lengths live beside the data, allocated with it,
// so a new blob never grows a slice of its own.
type chunk struct {
	data []byte   // perChunk blobs of size bytes each, mapped anonymous and private
	lens []uint16 // stored length of each blob; 0 marks a free index, so it doubles as the guard against loading one
}

const (
	// trimShare: free blobs are given back once the pages they may keep resident (one each)
	// come to more than 1/trimShare of the bytes in use, so farmem holds little beyond what
	// its store holds, and each trim gives back at least that much: its system calls are
	// amortized over that many frees.
	trimShare = 16
	// trimMin is the least a trim gives back, so a nearly empty store does not trim on every
	// free. Small, as Compressed's sixteen classes may each keep this much resident.
	trimMin = 1 << 20
)

// newArena returns an empty arena of size-byte blobs that grows chunkBytes at a time.
func newArena(size, chunkBytes int) arena {
	return arena{size: size, perChunk: max(chunkBytes/size, 1), next: 1, file: -1, trimLeast: trimMin}
}

// newFileArena returns an empty arena of size-byte blobs whose chunks of chunkBytes (whole
// pages of whole blobs) map memfd file, which the arena owns from now on. It trims from
// least bytes free on (an arena a process: see Space).
func newFileArena(file, size, chunkBytes, least int) arena {
	a := newArena(size, chunkBytes)
	a.file, a.trimLeast, a.rel.remove = file, least, true
	return a
}

// mapChunk maps the memory of the next chunk.
func (a *arena) mapChunk() ([]byte, error) {
	n := a.perChunk * a.size
	if a.file < 0 {
		// MAP_NORESERVE: a chunk's pages are only promised once written, as the Go heap's
		// would be, so an arena that never fills its last chunk is not charged for it under
		// strict overcommit.
		return unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	}
	off := int64(len(a.chunks)) * int64(n)
	if err := unix.Ftruncate(a.file, off+int64(n)); err != nil {
		return nil, err
	}
	return unix.Mmap(a.file, off, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
}

// take makes a free blob hold n bytes (1 to size), and returns its index and those bytes, for
// the caller to fill. The blob counts as live from now on: a trim leaves its page alone, so it
// may be filled after the owner's lock is released. It fails only if a new chunk cannot be
// mapped.
//
// When the blob is never-used memory not yet handed out to be filled in, take also returns a
// stretch of such memory from the blob on (fillFor) for the caller to give to prefault once
// the lock is released; otherwise ahead is nil.
func (a *arena) take(n int) (i int, blob, ahead []byte, err error) {
	if k := len(a.free); k > 0 {
		i = a.free[k-1]
		a.free = a.free[:k-1]
	} else if k := len(a.cold); k > 0 && !a.trimming {
		i = a.cold[k-1]
		a.cold = a.cold[:k-1]
	} else {
		if (a.next-1)/a.perChunk >= len(a.chunks) {
			data, err := a.mapChunk()
			if err != nil {
				return 0, nil, nil, fmt.Errorf("backend: cannot map %d more bytes for the store: %w", a.perChunk*a.size, err)
			}
			a.chunks = append(a.chunks, chunk{data: data, lens: make([]uint16, a.perChunk)})
		}
		i = a.next
		a.next++
		ahead = a.fillFor(i)
	}
	c, j := a.locate(i)
	c.lens[j] = uint16(n)
	a.inUse++
	return i, c.data[j*a.size : j*a.size+n], ahead, nil
}

// fillAhead is how much never-used memory a take hands out to be filled in at once. A first
// write to a page of a fresh mapping faults it in, one fault a page; filled in by the kernel
// with the others of a range first, the same writes cost half as much on a VM guest, where every
// first touch is the host's work too, and the eviction batches of a random walk whose store
// grows all run long took half as long (results/prefault.md). A quarter of a MiB is 64 pages
// to a call, and at most that much filled in before it is used; no more than the arena holds
// already, and at least fillAheadMin, so that a process's space (Memory) that stores a few pages
// keeps little memory for more.
const (
	fillAhead    = 256 << 10
	fillAheadMin = 64 << 10
)

// fillFor returns the never-used memory to fill in for blob i, a blob never used before:
// nothing if its bytes were handed out already, else from the first page not yet handed out
// to at least fillAhead bytes past it (fewer while the arena holds less), or to the end of i's
// chunk, and always past the blob's last byte. The pages past next are live to a trim
// (pageFree), so none of them is given back while it is filled in.
func (a *arena) fillFor(i int) []byte {
	c, j := a.locate(i)
	if ci := (i - 1) / a.perChunk; ci != a.fillChunk {
		a.fillChunk, a.filledTo = ci, 0
	}
	blobEnd := (j + 1) * a.size
	if blobEnd <= a.filledTo {
		return nil
	}
	start := max(a.filledTo, j*a.size&^(PageSize-1))
	ahead := min(fillAhead, max(fillAheadMin, a.inUse*a.size))
	end := min((max(start+ahead, blobEnd)+PageSize-1)&^(PageSize-1), len(c.data))
	a.filledTo = end
	return c.data[start:end]
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
// double free. Once enough is free it sets due: the owner then wakes its trimmer.
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
	if len(a.free)*PageSize > max(a.trimLeast, a.inUse*a.size/trimShare) {
		a.due = true
	}
	return true
}

// takeTrim starts a trim if one is due and none is running: it queues on rel every page of
// the chunks that holds only free blobs among the blobs of free, moves those blobs to cold,
// and sets trimming. It reports whether it queued any page; the trimmer then calls rel.flush
// without the owner's lock, and endTrim with it. Sorting first makes neighbouring blobs one
// range. A page shared with a live blob (a size class's blob across a page boundary) stays.
func (a *arena) takeTrim() bool {
	if !a.due || a.trimming {
		return false
	}
	a.due = false
	slices.Sort(a.free)
	run := pageRun{chunk: -1}
	for _, i := range a.free {
		ci, j := (i-1)/a.perChunk, (i-1)%a.perChunk
		for p := j * a.size / PageSize; p <= ((j+1)*a.size-1)/PageSize; p++ {
			if ci == run.chunk && p < run.end || !a.pageFree(ci, p) {
				continue // already in the run, or a live blob shares the page
			}
			if ci != run.chunk || p != run.end {
				a.queue(run)
				run = pageRun{chunk: ci, start: p, end: p}
			}
			run.end++
		}
	}
	a.queue(run)
	a.cold = append(a.cold, a.free...)
	a.free = a.free[:0]
	a.trimming = len(a.rel.iov) > 0
	return a.trimming
}

// endTrim ends the trim takeTrim started, once rel's pages are given back.
func (a *arena) endTrim() { a.trimming = false }

// pageFree reports whether every blob on page p of chunk ci is free. A blob never used counts
// as live: put takes it from next even while a trim runs, so its page must not be in one.
func (a *arena) pageFree(ci, p int) bool {
	c := &a.chunks[ci]
	last := min(((p+1)*PageSize-1)/a.size, a.perChunk-1)
	if ci*a.perChunk+last+1 >= a.next {
		return false
	}
	for j := p * PageSize / a.size; j <= last; j++ {
		if c.lens[j] != 0 {
			return false
		}
	}
	return true
}

// pageRun is pages [start, end) of chunk chunk, to be given back as one range.
type pageRun struct{ chunk, start, end int }

// queue adds run to rel.
func (a *arena) queue(r pageRun) {
	if r.chunk < 0 || r.start == r.end {
		return
	}
	data := a.chunks[r.chunk].data
	// The slice ends at the last blob, which may end inside a page; the kernel rounds the
	// length up to the page, which is free too (pageFree checked every blob on it).
	a.rel.add(data[r.start*PageSize : min(r.end*PageSize, len(data))])
}

// close unmaps the chunks, and closes the file; every index then reads as holding nothing. next
// is kept so that a stale index is never mistaken for a live one. The owner's trimmer must have
// stopped, or be done with this arena.
func (a *arena) close() {
	for _, c := range a.chunks {
		_ = unix.Munmap(c.data)
	}
	if a.file >= 0 {
		_ = unix.Close(a.file)
		a.file = -1
	}
	a.chunks, a.free, a.cold, a.inUse, a.due = nil, nil, nil, 0, false
}

func (a *arena) locate(i int) (*chunk, int) {
	return &a.chunks[(i-1)/a.perChunk], (i - 1) % a.perChunk
}

// prefault has the kernel fill in b's pages (a page-aligned stretch of a chunk) for writing,
// in one call, before the store writes them one by one. It changes no page already present,
// so a page written meanwhile keeps what was written. Where the kernel has no
// MADV_POPULATE_WRITE (before Linux 5.14) it stops trying, and the first writes fault the
// pages in one by one; any other failure leaves the same to them.
func prefault(b []byte) {
	if len(b) == 0 || noPrefault.Load() {
		return
	}
	if err := unix.Madvise(b, unix.MADV_POPULATE_WRITE); errors.Is(err, unix.EINVAL) {
		noPrefault.Store(true)
	}
}

// noPrefault: the kernel refused MADV_POPULATE_WRITE as unknown.
var noPrefault atomic.Bool
