package backend

import (
	"fmt"
	"sync"
)

// Size classes, as in zsmalloc: class i holds blobs of up to (i+1)*classSize bytes, so a
// compressed page wastes less than classSize bytes to rounding, and each class is an arena of
// equal blobs that packs densely and reuses freed blobs without fragmenting.
const (
	classSize  = 256
	numClasses = PageSize / classSize // 16
	classBits  = 4                    // low bits of a Slot naming its class: 1<<classBits == numClasses
	classMask  = 1<<classBits - 1
	// classChunkBytes is what a class grows by. Smaller than Memory's chunks: sixteen classes
	// each reserving 64 MiB would dwarf what a lightly used class holds.
	classChunkBytes = 8 << 20
)

// A slot's class bits must name exactly the classes there are: this fails to compile otherwise.
var _ = [1]struct{}{}[numClasses-1<<classBits]

// Compressed is the embedded backend storing each page compressed by a Codec into the smallest
// size class that holds it; a page that does not compress below compressLimit goes raw into
// the last class (PageSize bytes), where its Load is a plain copy. A Slot is the blob's index
// in its class shifted left by classBits, or'ed with the class: never 0, as indices start at 1.
//
// Store (one goroutine, the evictor) compresses under zmu and takes mu only to copy the result
// in, so concurrent Loads (fault threads) and Frees wait behind a memcpy, never a compression.
// Loads share mu, and decompress in parallel when the codec allows it. The trimmer takes mu
// alone, and gives pages back without it.
type Compressed struct {
	// zmu serializes Stores, so the codec's compression state and scratch need no other lock.
	// Lock order: zmu before mu.
	zmu     sync.Mutex
	codec   Codec  // set at construction; nil stores every page raw. Compress under zmu.
	scratch []byte // protected by zmu; CompressBound bytes the codec compresses one page into

	mu      sync.RWMutex
	classes [numClasses]arena // protected by mu (read-locked by Load, which only reads)
	closed  bool              // protected by mu
	trim    *trimmer          // set at construction; gives back freed blobs' pages
}

// NewCompressed returns an empty store compressing with c (nil: store pages uncompressed). The
// store owns c and closes it in Close.
func NewCompressed(c Codec) *Compressed {
	s := &Compressed{codec: c, scratch: make([]byte, CompressBound)}
	for i := range s.classes {
		s.classes[i] = newArena((i+1)*classSize, classChunkBytes)
	}
	s.trim = newTrimmer(s.trimRound)
	return s
}

// trimRound gives back the pages of the freed blobs of every class where a trim is due: the
// store's lock is not held while the kernel takes them.
func (c *Compressed) trimRound() {
	var took [numClasses]bool
	some := false
	c.mu.Lock()
	if !c.closed {
		for i := range c.classes {
			took[i] = c.classes[i].takeTrim()
			some = some || took[i]
		}
	}
	c.mu.Unlock()
	if !some {
		return
	}
	for i := range c.classes {
		if took[i] {
			c.classes[i].rel.flush()
		}
	}
	c.mu.Lock()
	for i := range c.classes {
		if took[i] {
			c.classes[i].endTrim()
		}
	}
	c.mu.Unlock()
}

// Store implements Backend.
func (c *Compressed) Store(src []byte, slots []Slot) error {
	n := len(src) / PageSize
	if n*PageSize != len(src) || len(slots) < n {
		return fmt.Errorf("backend: Store of %d bytes into %d slots", len(src), len(slots))
	}
	c.zmu.Lock()
	defer c.zmu.Unlock()
	for i := 0; i < n; i++ {
		blob := src[i*PageSize : (i+1)*PageSize]
		if c.codec != nil {
			// A length of PageSize means raw to Load, so a codec result that long (it should
			// return 0 well before) stores the page raw instead.
			if k := c.codec.Compress(c.scratch, blob); k > 0 && k < PageSize {
				blob = c.scratch[:k]
			}
		}
		s, ahead, err := c.put(blob)
		if err != nil {
			c.unput(slots[:i]) // a failed Store keeps nothing: the caller frees no slot of it
			return err
		}
		prefault(ahead) // under zmu, which Close takes: the chunks stay mapped
		slots[i] = s
	}
	return nil
}

// put copies one blob into its class, and returns with its slot the memory to fill in ahead
// (arena.take). mu is held per page, not per batch, so a batch of 256 evictions does not hold
// off the faults arriving meanwhile.
func (c *Compressed) put(blob []byte) (Slot, []byte, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, nil, errClosed
	}
	class := (len(blob) - 1) / classSize
	i, dst, ahead, err := c.classes[class].take(len(blob))
	if err != nil {
		return 0, nil, err
	}
	copy(dst, blob)
	return Slot(i)<<classBits | Slot(class), ahead, nil
}

// unput releases the slots a failed Store had filled; after Close they are gone already.
func (c *Compressed) unput(slots []Slot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return
	}
	for _, s := range slots {
		c.classes[s&classMask].release(int(s >> classBits))
	}
}

// Load implements Backend.
func (c *Compressed) Load(s Slot, dst []byte) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	blob := c.classes[s&classMask].get(int(s >> classBits))
	if blob == nil {
		return fmt.Errorf("%w %d", ErrUnknownSlot, s)
	}
	if len(blob) == PageSize {
		copy(dst[:PageSize], blob)
		return nil
	}
	if c.codec == nil {
		return fmt.Errorf("%w: slot %d holds %d bytes and there is no codec", errCorruptPage, s, len(blob))
	}
	// Decompressing straight out of the arena under the read lock: Store and Free wait for
	// it, but other Loads do not, and it saves copying the blob out first.
	if err := c.codec.Decompress(dst[:PageSize], blob); err != nil {
		return fmt.Errorf("backend: slot %d: %w", s, err)
	}
	return nil
}

// Free implements Backend.
func (c *Compressed) Free(slots ...Slot) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed && len(slots) > 0 {
		// Every slot's owner must release it before the store closes: one that has not is a
		// shutdown-order bug in the runtime, not a double free.
		panic(fmt.Sprintf("backend: free of slot %d after Close", slots[0]))
	}
	due := false
	for _, s := range slots {
		a := &c.classes[s&classMask]
		if !a.release(int(s >> classBits)) {
			panic(fmt.Sprintf("backend: double free of slot %d", s))
		}
		due = due || a.due
	}
	if due {
		c.trim.wake()
	}
}

// Stored implements Backend.
func (c *Compressed) Stored() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	n := 0
	for i := range c.classes {
		n += c.classes[i].inUse
	}
	return n
}

// StoredBytes implements Backend: the class sizes of the blobs in use, so rounding up to a
// class counts, but the unused tail of the last chunk of each class does not.
func (c *Compressed) StoredBytes() int64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var n int64
	for i := range c.classes {
		n += int64(c.classes[i].inUse) * int64(c.classes[i].size)
	}
	return n
}

// Close implements Backend. It waits for a Store in progress (zmu) and for Loads in progress
// (mu) before closing the codec, so the codec is never used after its Close.
func (c *Compressed) Close() error {
	c.trim.close() // first: it takes mu, and gives back pages of the chunks
	c.zmu.Lock()
	defer c.zmu.Unlock()
	c.mu.Lock()
	was := c.closed
	c.closed = true
	for i := range c.classes {
		c.classes[i].close()
	}
	c.mu.Unlock()
	if was || c.codec == nil {
		return nil
	}
	return c.codec.Close()
}
