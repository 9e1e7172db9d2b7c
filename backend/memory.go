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
type Memory struct {
	mu     sync.Mutex
	pages  arena    // protected by mu; blob i is slot i
	closed bool     // protected by mu
	trim   *trimmer // set at construction; gives back freed slots' pages
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
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return errClosed
	}
	for i := 0; i < n; i++ {
		j, err := m.pages.put(src[i*PageSize : (i+1)*PageSize])
		if err != nil {
			for _, s := range slots[:i] { // a failed Store keeps nothing: the caller frees no slot of it
				m.pages.release(int(s))
			}
			return err
		}
		slots[i] = Slot(j)
	}
	return nil
}

// Load implements Backend.
func (m *Memory) Load(s Slot, dst []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	// A slot beyond int's range turns negative here, which get rejects like any unknown one.
	p := m.pages.get(int(s))
	if p == nil {
		return fmt.Errorf("%w %d", ErrUnknownSlot, s)
	}
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
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	m.pages.close()
	return nil
}
