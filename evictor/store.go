package evictor

import (
	"fmt"
	"hash/crc32"
	"unsafe"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/uffd"
)

// store stores the pages copied out, in one backend Store, and sets each one's slot. An
// all-zero page needs no copy: its slot is 0, which reads as zeros. Only a page whose checksum
// is the zero page's is read again to see whether it is all zeros: the others cannot be.
//
// The non-zero pages are packed at the front of buf first: buf is not read after this.
func (e *Evictor) store(b *batch) error {
	slots := b.slots[:b.n]
	b.nz = b.nz[:0]
	for i := range slots {
		slots[i] = 0
		if b.sums[i] != zeroPageSum || !isZero(b.page(i)) {
			b.nz = append(b.nz, i)
		}
	}
	if len(b.nz) == 0 {
		return nil
	}
	for j, i := range b.nz {
		if j != i { // j < i: page j's own content is zeros, or already packed below j
			copy(b.page(j), b.page(i))
		}
	}
	stored, src := b.stored[:len(b.nz)], b.buf[:len(b.nz)*uffd.PageSize]
	var err error
	if sp := b.t.Space(); sp != 0 {
		err = e.cfg.Backend.(backend.Spaces).StoreIn(sp, src, stored) // only such a backend makes spaces
	} else {
		err = e.cfg.Backend.Store(src, stored)
	}
	if err != nil {
		return fmt.Errorf("evict: backend store: %w", err)
	}
	for j, i := range b.nz {
		slots[i] = stored[j]
	}
	return nil
}

// zeroPageSum is the checksum of a page of zeros.
var zeroPageSum = crc32.Checksum(make([]byte, uffd.PageSize), castagnoli)

// isZero reports whether page b is all zeros.
func isZero(b []byte) bool {
	w := unsafe.Slice((*uint64)(unsafe.Pointer(&b[0])), len(b)/8)
	for _, x := range w {
		if x != 0 {
			return false
		}
	}
	return true
}
