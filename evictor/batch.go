package evictor

import (
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

// batch is the scratch of one eviction batch, reused by every batch.
type batch struct {
	buf     []byte
	victims []uint64
	ents    []*pagetable.Entry // the victims' entries, by pointer (see pagetable's doc)
	status  []byte             // the agent's move status of each victim
	rest    []uint64           // the victims the agent did not move
	remote  []unix.RemoteIovec
	slots   []backend.Slot
	sums    []uint32 // the copied pages' CRC-32C
}

func (b *batch) init() {
	b.buf = make([]byte, BatchPages*uffd.PageSize)
	b.slots = make([]backend.Slot, BatchPages)
	b.sums = make([]uint32, BatchPages)
	b.status = make([]byte, BatchPages)
}
