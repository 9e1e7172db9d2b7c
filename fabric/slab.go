package fabric

import (
	"fmt"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// slab is one slab's memory on a memory server: a memfd, mapped shared. A memfd rather than
// anonymous memory so that a same-host client can map the very same pages (the shm transport)
// and so that freeing a slab gives its memory back at once (close + munmap), whatever pages
// were touched — unless a shm client still maps it: then the memory lives on until that client
// unmaps it (a memfd's pages belong to the file, which lives while anyone maps it). The
// server's accounting (UsedPages) no longer counts it from the free on.
type slab struct {
	id    uint64
	owner SessionID
	fd    int
	mem   []byte // len = pages * PageSize; valid while refs > 0
	// refs counts the server's map entry (one, until the slab is freed) and every request in
	// flight on it; the last unref unmaps the memory.
	refs atomic.Int32
}

func newSlab(id uint64, owner SessionID, pages uint32) (*slab, error) {
	fd, err := unix.MemfdCreate(fmt.Sprintf("farmem-slab-%d", id), unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	size := int64(pages) * PageSize
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate slab to %d bytes: %w", size, err)
	}
	// Sealed at its size: a client holding the memfd (shm transport) cannot shrink it under the
	// server's mapping (which would turn the server's own accesses into faults).
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_SEAL); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("sealing slab memfd: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap slab: %w", err)
	}
	sl := &slab{id: id, owner: owner, fd: fd, mem: mem}
	sl.refs.Store(1)
	return sl, nil
}

func (s *slab) pages() uint32 { return uint32(len(s.mem) / PageSize) }

func (s *slab) page(i uint32) []byte { return s.mem[int(i)*PageSize : int(i+1)*PageSize] }

// unref drops a reference; the last one gives the memory back.
func (s *slab) unref() {
	if s.refs.Add(-1) == 0 {
		unix.Munmap(s.mem)
		unix.Close(s.fd)
	}
}
