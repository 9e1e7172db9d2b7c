//go:build !rdma

package fabric

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// A memory server built without the rdma transport refuses its requests by name, and the
// connection stays usable.
func TestRDMANotCompiledIn(t *testing.T) {
	srv, addr := startServer(t, 100)
	s := NewSessionID()
	c, err := DialTCP(addr, DialConfig{Token: testToken, Session: s})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Create(grant(srv, 1, s, 8)); err != nil {
		t.Fatal(err)
	}
	qp := rdmaQPInfo{QPN: 17, PSN: 5, MTU: 3, RDAtomic: 1}
	var slab [8]byte
	binary.LittleEndian.PutUint64(slab[:], 1)
	for _, req := range []struct {
		op      Op
		payload []byte
		answer  int
	}{{OpRDMAConnect, qp.encode(nil), rdmaQPInfoSize}, {OpRDMARegister, slab[:], rdmaRegionSize}} {
		err := c.do(func(cc *clientConn) error {
			return cc.call(req.op, 0, [][]byte{req.payload}, make([]byte, req.answer))
		})
		wantRefused(t, err, StatusUnsupported)
		if !bytes.Contains([]byte(err.Error()), []byte("without the rdma transport")) {
			t.Fatalf("%v: %v", req.op, err)
		}
	}
	data := fill(1, 1)
	got := make([]byte, PageSize)
	if err := c.Write([]Addr{{Slab: 1, Page: 2}}, data); err != nil {
		t.Fatal(err)
	}
	if err := c.Read([]Addr{{Slab: 1, Page: 2}}, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("read after the refusals: %v", err)
	}
	if ErrNoRDMA.Error() != "rdma transport not compiled into this farmem (build with -tags rdma)" || RDMACompiled {
		t.Fatal(ErrNoRDMA, RDMACompiled)
	}
}
