package evictor

import (
	"errors"
	"fmt"
	"hash/crc32"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/uffd"
)

// copyOut reads the pages to store into buf, in one process_vm_readv: the staged pages that
// need writing, then the dirty victims still in the program. Both are present and cannot
// change (a staging page is nobody's; a victim is write-protected), so reading them cannot
// fault and no write can slip in between the copy and the drop.
//
// A read that stops short in the program's victims (part of them was unmapped meanwhile) gives
// up the drop way (abort) and keeps the staged pages; one that stops short in the staging area
// is an error: nothing of the program's can unmap it.
func (e *Evictor) copyOut(b *batch) error {
	remote := b.remote[:0]
	for _, k := range b.stagedDirty {
		a := b.base + uint64(b.staged[k])*uffd.PageSize
		if j := len(remote) - 1; j >= 0 && uint64(remote[j].Base)+uint64(remote[j].Len) == a {
			remote[j].Len += uffd.PageSize
		} else {
			remote = append(remote, unix.RemoteIovec{Base: uintptr(a), Len: uffd.PageSize})
		}
	}
	b.nStaged = len(b.stagedDirty)
	for _, r := range b.dirtyRuns {
		remote = append(remote, unix.RemoteIovec{Base: uintptr(r.Addr), Len: int(r.Len)})
	}
	b.remote = remote
	b.n = b.nStaged + len(b.dirty)
	if b.n == 0 {
		return nil
	}
	b.local[0] = unix.Iovec{Base: &b.buf[0]}
	b.local[0].SetLen(b.n * uffd.PageSize)
	got, err := unix.ProcessVMReadv(b.t.Pid(), b.local[:], remote, 0)
	if errors.Is(err, unix.ESRCH) {
		return ErrGone
	}
	if err != nil {
		got = max(got, 0) // -1 when the very first page faulted: nothing was read
	}
	if got < b.nStaged*uffd.PageSize {
		return fmt.Errorf("evict: process_vm_readv of %d staged pages read %d bytes: %v", b.nStaged, got, err)
	}
	if errors.Is(err, unix.EFAULT) || (err == nil && got < b.n*uffd.PageSize) {
		e.abort(b) // part of it was unmapped meanwhile
		b.n = b.nStaged
	} else if err != nil || got != b.n*uffd.PageSize {
		return fmt.Errorf("evict: process_vm_readv of %d pages read %d bytes: %v", b.n, got, err)
	}
	return nil
}

// castagnoli is CRC-32C's table: the checksum the CPU computes in hardware.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// checksum takes the CRC-32C of every page copied out: the page table learns from it whether
// a page installed writable on a guess was written (pagetable's Copied).
func (b *batch) checksum() {
	for i := range b.sums[:b.n] {
		b.sums[i] = crc32.Checksum(b.page(i), castagnoli)
	}
}

// page is the i-th page copied out, in buf.
func (b *batch) page(i int) []byte { return b.buf[i*uffd.PageSize : (i+1)*uffd.PageSize] }
