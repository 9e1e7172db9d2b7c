package backend

import (
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// chunkPages is how many pages one Memory chunk holds (64 MiB): big enough that the store grows
// rarely, small enough that a short run does not reserve much.
const chunkPages = 16384

// errClosed is returned by a Store after Close: the chunks are gone.
var errClosed = errors.New("backend: store is closed")

// Memory is the embedded backend: pages kept in the farmem process itself, in arenas of 4 KiB
// blobs. Storing and loading are a memcpy and allocate nothing once the chunks exist; the pages
// of freed slots go back to the kernel once they add up (see arena). It makes `farmem run` work
// with no cluster; it does not reduce the machine's total memory use (that is what memory
// servers are for, or Compressed shrinks it).
//
// Pages stored with Store share one arena of anonymous memory. Those stored with StoreIn go to
// the arena of a Space: one served process's pages, in a memfd of their own, which can be mapped
// into that process and no other (docs/DESIGN.md, "Where a fault is served").
//
// No page is copied under mu: it guards the arenas' bookkeeping only, so a fault's Load never
// waits for an eviction batch's Store to copy its pages, nor a Store for a Load. The copies
// hold copying for reading instead, which keeps the chunks mapped: Close waits for them. A
// space's chunks are unmapped before Close only once it holds nothing, when no copy can be
// reading them.
type Memory struct {
	mu        sync.Mutex
	pages     arena            // protected by mu; the pages stored with Store: slot i is blob i
	spaces    map[Space]*space // protected by mu
	lastSpace Space            // protected by mu; the last space made (names are never reused)
	stored    int              // protected by mu; blobs held, in every arena
	closed    bool             // protected by mu
	copying   sync.RWMutex     // read-held across each copy in or out of the chunks; Close write-holds it
	trim      *trimmer         // set at construction; gives back freed slots' pages
}

// A slot of a space holds the space's name above spaceShift and its blob's index below.
const (
	spaceShift = 40
	maxSpace   = Space(1<<(64-spaceShift) - 1)
	indexMask  = 1<<spaceShift - 1
)

// space is a Space's arena, and whether it has ended: once it has and holds nothing, it goes.
type space struct {
	pages arena // a file arena: its memfd can be mapped elsewhere
	ended bool
}

// spaceTrimMin is the least a space's trim gives back: there is one space a process, and each
// may keep this much of freed slots resident.
const spaceTrimMin = 128 << 10

// NewMemory returns an empty embedded store.
func NewMemory() *Memory {
	m := &Memory{pages: newArena(PageSize, chunkPages*PageSize), spaces: make(map[Space]*space)}
	m.trim = newTrimmer(m.trimRound)
	return m
}

// NewSpace makes a part of the store for one process's pages (StoreIn), kept in a memfd of its
// own. It fails when no memfd can be made, or when every name has been used (2^24 over the
// store's life: a name is never reused, so a stale slot cannot read another space's page); the
// caller then stores the process's pages with Store.
func (m *Memory) NewSpace() (Space, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, errClosed
	}
	if m.lastSpace == maxSpace {
		return 0, errors.New("backend: every store space name is used")
	}
	fd, err := newStoreFile()
	if err != nil {
		return 0, fmt.Errorf("backend: store space: %w", err)
	}
	m.lastSpace++
	m.spaces[m.lastSpace] = &space{pages: newFileArena(fd, PageSize, chunkPages*PageSize, spaceTrimMin)}
	return m.lastSpace, nil
}

// newStoreFile makes the memfd a space's pages are kept in.
func newStoreFile() (int, error) {
	return unix.MemfdCreate("farmem-store", unix.MFD_CLOEXEC)
}

// EndSpace says that nothing more will be stored in sp. It goes once it holds nothing: at once,
// or when its last slot is freed (by a fork child that shares them).
func (m *Memory) EndSpace(sp Space) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.spaces[sp]; s != nil {
		s.ended = true
		m.dropIfDone(sp, s)
	}
}

// dropIfDone closes space sp if it has ended and holds nothing, unless the trimmer is giving
// back its pages (the trimmer's round drops it after). mu is held.
func (m *Memory) dropIfDone(sp Space, s *space) {
	if s.ended && s.pages.inUse == 0 && !s.pages.trimming {
		s.pages.close()
		delete(m.spaces, sp)
	}
}

// SpaceFile returns the memfd space sp's pages are kept in, or -1: the Memory's, for as long as
// the space lasts.
func (m *Memory) SpaceFile(sp Space) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if s := m.spaces[sp]; s != nil {
		return s.pages.file
	}
	return -1
}

// Where says where slot s's page is kept: in space sp's memfd at offset off (sp 0: in the part
// Store uses, which has no file). It says nothing of whether s holds a page.
func (m *Memory) Where(s Slot) (sp Space, off int64) {
	return Space(s >> spaceShift), int64(s&indexMask-1) * PageSize
}

// arena returns the arena slot is in and its index there; nil if no arena has it. mu is held.
func (m *Memory) arena(slot Slot) (*arena, int) {
	sp, i := Space(slot>>spaceShift), int(slot&indexMask)
	if sp == 0 {
		return &m.pages, i
	}
	if s := m.spaces[sp]; s != nil {
		return &s.pages, i
	}
	return nil, 0
}

// trimRound gives back the pages of the freed slots of each arena a trim is due in: the store's
// lock is not held while the kernel takes them.
func (m *Memory) trimRound() {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	var due []*arena
	if m.pages.takeTrim() {
		due = append(due, &m.pages)
	}
	for _, s := range m.spaces {
		if s.pages.takeTrim() {
			due = append(due, &s.pages)
		}
	}
	m.mu.Unlock()
	for _, a := range due {
		a.rel.flush()
	}
	m.mu.Lock()
	for _, a := range due {
		a.endTrim()
	}
	for sp, s := range m.spaces {
		m.dropIfDone(sp, s)
	}
	m.mu.Unlock()
}

// Store implements Backend.
func (m *Memory) Store(src []byte, slots []Slot) error { return m.StoreIn(0, src, slots) }

// StoreIn is Store into space sp (0: the part Store uses). A space that is gone, or was never
// made, is an error.
func (m *Memory) StoreIn(sp Space, src []byte, slots []Slot) error {
	n := len(src) / PageSize
	if n*PageSize != len(src) || len(slots) < n {
		return fmt.Errorf("backend: Store of %d bytes into %d slots", len(src), len(slots))
	}
	m.copying.RLock()
	defer m.copying.RUnlock()
	for i := 0; i < n; i++ {
		slot, blob, ahead, err := m.take(sp)
		if err != nil {
			m.unput(slots[:i]) // a failed Store keeps nothing: the caller frees no slot of it
			return err
		}
		prefault(ahead) // under copying, which Close waits for: the chunks stay mapped
		copy(blob, src[i*PageSize:(i+1)*PageSize])
		slots[i] = slot
	}
	return nil
}

// take takes a free slot of space sp for a page and returns its blob, to be filled outside mu,
// and the memory to fill in ahead (arena.take).
func (m *Memory) take(sp Space) (Slot, []byte, []byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return 0, nil, nil, errClosed
	}
	a := &m.pages
	if sp != 0 {
		s := m.spaces[sp]
		if s == nil {
			return 0, nil, nil, fmt.Errorf("backend: no store space %d", sp)
		}
		a = &s.pages
	}
	i, blob, ahead, err := a.take(PageSize)
	if err != nil {
		return 0, nil, nil, err
	}
	m.stored++
	return Slot(sp)<<spaceShift | Slot(i), blob, ahead, nil
}

// unput releases the slots a failed Store had filled; after Close they are gone already.
func (m *Memory) unput(slots []Slot) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return
	}
	for _, s := range slots {
		m.release(s)
	}
}

// release frees slot s in its arena, and drops its space if that was its last slot; false if
// s held nothing. mu is held.
func (m *Memory) release(s Slot) bool {
	a, i := m.arena(s)
	if a == nil || !a.release(i) {
		return false
	}
	m.stored--
	if sp := Space(s >> spaceShift); sp != 0 {
		m.dropIfDone(sp, m.spaces[sp])
	}
	if a.due {
		m.trim.wake()
	}
	return true
}

// Load implements Backend.
func (m *Memory) Load(s Slot, dst []byte) error {
	m.copying.RLock()
	defer m.copying.RUnlock()
	m.mu.Lock()
	var p []byte
	if a, i := m.arena(s); a != nil {
		p = a.get(i)
	}
	m.mu.Unlock()
	if p == nil {
		return fmt.Errorf("%w %d", ErrUnknownSlot, s)
	}
	// Outside mu: a stored slot's blob changes only once its owner frees it, which it does not
	// while it loads it; nor can its space go meanwhile, which it does only once it holds
	// nothing.
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
		if !m.release(s) {
			panic(fmt.Sprintf("backend: double free of slot %d", s))
		}
	}
}

// Stored implements Backend.
func (m *Memory) Stored() int { m.mu.Lock(); defer m.mu.Unlock(); return m.stored }

// StoredBytes implements Backend.
func (m *Memory) StoredBytes() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return int64(m.stored) * PageSize
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
	for sp, s := range m.spaces {
		s.pages.close()
		delete(m.spaces, sp)
	}
	return nil
}
