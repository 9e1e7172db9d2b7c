package backend

import (
	"fmt"
	"sync"
)

// chunkPages is how many pages one arena chunk holds (64 MiB): big enough that the store grows
// rarely, small enough that a short run does not reserve much.
const chunkPages = 16384

// Memory is the embedded backend: pages kept in the farmem process itself, in fixed 64 MiB
// chunks indexed by slot, with a free list. Storing and loading are a memcpy and allocate
// nothing once the chunks exist. It makes `farmem run` work with no cluster; it does not
// reduce the machine's total memory use (that is what memory servers are for).
type Memory struct {
	mu     sync.Mutex
	chunks [][]byte // chunk i holds slots [i*chunkPages+1, (i+1)*chunkPages]
	free   []Slot   // released slots, reused first
	next   Slot     // next never-used slot
	used   []bool   // used[s] reports whether slot s holds a page; guards Load against bugs
	stored int
}

// NewMemory returns an empty embedded store.
func NewMemory() *Memory { return &Memory{next: 1, used: []bool{false}} }

func (m *Memory) page(s Slot) []byte {
	i := uint64(s - 1)
	off := (i % chunkPages) * PageSize
	return m.chunks[i/chunkPages][off : off+PageSize]
}

// Store implements Backend.
func (m *Memory) Store(src []byte, slots []Slot) error {
	n := len(src) / PageSize
	if n*PageSize != len(src) || len(slots) < n {
		return fmt.Errorf("backend: Store of %d bytes into %d slots", len(src), len(slots))
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for i := 0; i < n; i++ {
		var s Slot
		if k := len(m.free); k > 0 {
			s = m.free[k-1]
			m.free = m.free[:k-1]
		} else {
			s = m.next
			m.next++
			if int(uint64(s-1)/chunkPages) >= len(m.chunks) {
				m.chunks = append(m.chunks, make([]byte, chunkPages*PageSize))
			}
			m.used = append(m.used, false)
		}
		copy(m.page(s), src[i*PageSize:(i+1)*PageSize])
		m.used[s] = true
		slots[i] = s
	}
	m.stored += n
	return nil
}

// Load implements Backend.
func (m *Memory) Load(s Slot, dst []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s == 0 || int(s) >= len(m.used) || !m.used[s] {
		return fmt.Errorf("%w %d", ErrUnknownSlot, s)
	}
	copy(dst[:PageSize], m.page(s))
	return nil
}

// Free implements Backend.
func (m *Memory) Free(slots ...Slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, s := range slots {
		if s == 0 || int(s) >= len(m.used) || !m.used[s] {
			panic(fmt.Sprintf("backend: double free of slot %d", s))
		}
		m.used[s] = false
		m.free = append(m.free, s)
		m.stored--
	}
}

// Stored implements Backend.
func (m *Memory) Stored() int { m.mu.Lock(); defer m.mu.Unlock(); return m.stored }

// Close implements Backend.
func (m *Memory) Close() error { m.mu.Lock(); m.chunks = nil; m.mu.Unlock(); return nil }
