package backend

// arena keeps fixed-size blobs in large chunks, indexed from 1 so that index 0 never names a
// blob (slots are never 0), with a free list of released indices that are reused first.
// Storing and loading copy into and out of a chunk and allocate nothing once the chunks
// exist. Memory is one arena of whole pages; Compressed has one per size class.
//
// An arena has no lock of its own: its owner's lock protects every field.
type arena struct {
	size     int     // bytes per blob; at most PageSize, so a length fits a uint16
	perChunk int     // blobs per chunk
	chunks   []chunk // chunk i holds indices [i*perChunk+1, (i+1)*perChunk]; nil once closed
	free     []int   // released indices, reused first so the chunks stay dense
	next     int     // next never-used index
	inUse    int     // blobs currently holding data
}

// chunk is one allocation of perChunk blobs. The lengths live beside the data, allocated with
// it, so a new blob never grows a slice of its own.
type chunk struct {
	data []byte   // perChunk blobs of size bytes each
	lens []uint16 // stored length of each blob; 0 marks a free index, so it doubles as the guard against loading one
}

// newArena returns an empty arena of size-byte blobs that grows chunkBytes at a time.
func newArena(size, chunkBytes int) arena {
	return arena{size: size, perChunk: max(chunkBytes/size, 1), next: 1}
}

// put copies b (1 to size bytes) into a free blob and returns its index.
func (a *arena) put(b []byte) int {
	var i int
	if k := len(a.free); k > 0 {
		i = a.free[k-1]
		a.free = a.free[:k-1]
	} else {
		i = a.next
		a.next++
		if (i-1)/a.perChunk >= len(a.chunks) {
			a.chunks = append(a.chunks, chunk{data: make([]byte, a.perChunk*a.size), lens: make([]uint16, a.perChunk)})
		}
	}
	c, j := a.locate(i)
	copy(c.data[j*a.size:(j+1)*a.size], b)
	c.lens[j] = uint16(len(b))
	a.inUse++
	return i
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
// double free.
func (a *arena) release(i int) bool {
	if a.get(i) == nil {
		return false
	}
	c, j := a.locate(i)
	c.lens[j] = 0
	a.free = append(a.free, i)
	a.inUse--
	return true
}

// close drops the chunks; every index then reads as holding nothing. next is kept so that a
// stale index is never mistaken for a live one.
func (a *arena) close() {
	a.chunks, a.free, a.inUse = nil, nil, 0
}

func (a *arena) locate(i int) (*chunk, int) {
	return &a.chunks[(i-1)/a.perChunk], (i - 1) % a.perChunk
}
