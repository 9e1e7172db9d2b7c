package backend

import (
	"errors"
	"fmt"
	"sync"
)

// chunkPages is how many pages one Memory chunk holds (64 MiB): big enough that the store grows
// rarely, small enough that a short run does not reserve much.
const chunkPages = 16384

// errClosed is returned by a Store after Close: the chunks are gone.
var errClosed = errors.New("backend: store is closed")

// Memory is the embedded backend: pages kept in the farmem process itself, in one arena of
// 4 KiB blobs whose index is the slot. Storing and loading are a memcpy and allocate nothing
// once the chunks exist; the pages of freed slots go back to the kernel once they add up (see
// arena). It makes `farmem run` work with no cluster; it does not reduce the machine's total
// memory use (that is what memory servers are for, or Compressed shrinks it).
//
// No page is copied under mu: it guards the arena's bookkeeping only, so a fault's Load never
// waits for an eviction batch's Store to copy its pages, nor a Store for a Load. The copies
// hold copying for reading instead, which keeps the chunks mapped until Close.
type Memory struct {
	mu      sync.Mutex
	pages   arena        // protected by mu; blob i is slot i
	closed  bool         // protected by mu
	copying sync.RWMutex // read-held across each copy in or out of pages' chunks; Close write-holds it
	trim    *trimmer     // set at construction; gives back freed slots' pages
}

// NewMemory returns an empty embedded store.
func NewMemory() *Memory {
	m := &Memory{pages: newArena(PageSize, chunkPages*PageSize)}
	m.trim = newTrimmer(m.trimRound)
	return m
}

// trimRound gives back the pages of the freed slots, if a trim is due: the store's lock is
// not held while the kernel takes them.
func (m *Memory) trimRound() {
	m.mu.Lock()
	if m.closed || !m.pages.takeTrim() {
		m.mu.Unlock()
		return
	}
	m.mu.Unlock()
	m.pages.rel.flush()
	m.mu.Lock()
	m.pages.endTrim()
	m.mu.Unlock()
}

// Store implements Backend.
func (m *Memory) Store(src []byte, slots []Slot) error {
	n := len(src) / PageSize
	if n*PageSize != len(src) || len(slots) < n {
		return fmt.Errorf("backend: Store of %d bytes into %d slots", len(src), len(slots))
	}
	m.copying.RLock()
	defer m.copying.RUnlock()
	for i := 0; i < n; i++ {
		j, blob, ahead, err := m.take()
		if err != nil {
			m.unput(slots[:i]) // a failed Store keeps nothing: the caller frees no slot of it
			return err
		}
		prefault(ahead) // under copying, which Close waits for: the chunks stay mapped
		copy(blob, src[i*PageSize:(i+1)*PageSize])
		slots[i] = Slot(j)
	}
	return nil
}

// take takes a free slot for a page and returns its blob, to be filled outside mu, and the
// memory to fill in ahead (arena.take).
func (m *Memory) take() (int, []byte, []byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, nil, nil, errClosed
	}
	return m.pages.take(PageSize)
}

// unput releases the slots a failed Store had filled; after Close they are gone already.
func (m *Memory) unput(slots []Slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	for _, s := range slots {
		m.pages.release(int(s))
	}
}

// Load implements Backend.
func (m *Memory) Load(s Slot, dst []byte) error {
	m.copying.RLock()
	defer m.copying.RUnlock()
	m.mu.Lock()
	// A slot beyond int's range turns negative here, which get rejects like any unknown one.
	p := m.pages.get(int(s))
	m.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%w %d", ErrUnknownSlot, s)
	}
	// Outside mu: a stored slot's blob changes only once its owner frees it, which it does not
	// while it loads it.
	copy(dst[:PageSize], p)
	return nil
}

// Free implements Backend.
func (m *Memory) Free(slots ...Slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed && len(slots) > 0 {
		// Every slot's owner must release it before the store closes: one that has not is a
		// shutdown-order bug in the runtime, not a double free.
		panic(fmt.Sprintf("backend: free of slot %d after Close", slots[0]))
	}
	for _, s := range slots {
		if !m.pages.release(int(s)) {
			panic(fmt.Sprintf("backend: double free of slot %d", s))
		}
	}
	if m.pages.due {
		m.trim.wake()
	}
}

// Stored implements Backend.
func (m *Memory) Stored() int { m.mu.Lock(); defer m.mu.Unlock(); return m.pages.inUse }

// StoredBytes implements Backend.
func (m *Memory) StoredBytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(m.pages.inUse) * PageSize
}

// Close implements Backend.
func (m *Memory) Close() error {
	m.trim.close() // first: it takes mu, and gives back pages of the chunks
	m.copying.Lock()
	defer m.copying.Unlock()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.pages.close()
	return nil
}
