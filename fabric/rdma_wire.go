package fabric

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// This file is the rdma transport's part that every build has: its error for builds without
// it, and the payloads of RDMAConnect and RDMARegister (wire.go documents them). The transport
// itself (rdma.go, rdma_verbs.go, rdma_server.go) needs libibverbs and the build tag rdma;
// rdma_stub.go stands in for it otherwise.

// ErrNoRDMA is what asking for the rdma transport gets from a farmem built without it.
var ErrNoRDMA = errors.New("rdma transport not compiled into this farmem (build with -tags rdma)")

// RDMA device selection, the same for memory servers and clients: the device named by
// FARMEM_RDMA_DEVICE (default: the first with an active port) and the GID at index
// FARMEM_RDMA_GID_INDEX of its port (default 0) for RoCE.
const (
	envRDMADevice   = "FARMEM_RDMA_DEVICE"
	envRDMAGIDIndex = "FARMEM_RDMA_GID_INDEX"
)

// rdmaQPInfo is one side's queue pair, as RDMAConnect carries it.
type rdmaQPInfo struct {
	QPN      uint32
	PSN      uint32
	LID      uint16
	MTU      uint8 // enum ibv_mtu
	RDAtomic uint8 // RDMA READs outstanding: initiator depth (client), responder resources (server)
	GID      [16]byte
	Retire   uint32 // a server queue pair the client gave up; zero: none
}

const rdmaQPInfoSize = 32

func (q *rdmaQPInfo) encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint32(b, q.QPN)
	b = binary.LittleEndian.AppendUint32(b, q.PSN)
	b = binary.LittleEndian.AppendUint16(b, q.LID)
	b = append(b, q.MTU, q.RDAtomic)
	b = append(b, q.GID[:]...)
	return binary.LittleEndian.AppendUint32(b, q.Retire)
}

func decodeRDMAQPInfo(b []byte) (rdmaQPInfo, error) {
	var q rdmaQPInfo
	if len(b) != rdmaQPInfoSize {
		return q, fmt.Errorf("%w: %d-byte rdma queue pair", ErrMalformed, len(b))
	}
	q.QPN = binary.LittleEndian.Uint32(b)
	q.PSN = binary.LittleEndian.Uint32(b[4:])
	q.LID = binary.LittleEndian.Uint16(b[8:])
	q.MTU, q.RDAtomic = b[10], b[11]
	copy(q.GID[:], b[12:28])
	q.Retire = binary.LittleEndian.Uint32(b[28:])
	if q.QPN == 0 || q.QPN >= 1<<24 || q.PSN >= 1<<24 || q.MTU < 1 || q.MTU > 5 || q.RDAtomic == 0 {
		return q, fmt.Errorf("%w: rdma queue pair qpn %d psn %d mtu %d rd_atomic %d", ErrMalformed, q.QPN, q.PSN, q.MTU, q.RDAtomic)
	}
	return q, nil
}

// rdmaRegion is RDMARegister's answer: where a slab is in the server's address space, the key
// that opens it, and its size.
type rdmaRegion struct {
	Addr  uint64
	RKey  uint32
	Pages uint32
}

const rdmaRegionSize = 16

func (r *rdmaRegion) encode(b []byte) []byte {
	b = binary.LittleEndian.AppendUint64(b, r.Addr)
	b = binary.LittleEndian.AppendUint32(b, r.RKey)
	return binary.LittleEndian.AppendUint32(b, r.Pages)
}

func decodeRDMARegion(b []byte) rdmaRegion {
	return rdmaRegion{Addr: binary.LittleEndian.Uint64(b), RKey: binary.LittleEndian.Uint32(b[8:]),
		Pages: binary.LittleEndian.Uint32(b[12:])}
}
