package fabric

import "testing"

func TestRDMAWireRoundTrip(t *testing.T) {
	q := rdmaQPInfo{QPN: 0x123456, PSN: 0xabcdef, LID: 7, MTU: 5, RDAtomic: 16, Retire: 99}
	copy(q.GID[:], "fe80::0123456789")
	got, err := decodeRDMAQPInfo(q.encode(nil))
	if err != nil || got != q {
		t.Fatalf("%+v, %v", got, err)
	}
	for _, bad := range []rdmaQPInfo{{QPN: 0, MTU: 1, RDAtomic: 1}, {QPN: 1 << 24, MTU: 1, RDAtomic: 1}, {QPN: 1, MTU: 6, RDAtomic: 1}, {QPN: 1, MTU: 1}} {
		if _, err := decodeRDMAQPInfo(bad.encode(nil)); err == nil {
			t.Fatalf("%+v decoded", bad)
		}
	}
	if _, err := decodeRDMAQPInfo(make([]byte, rdmaQPInfoSize-1)); err == nil {
		t.Fatal("a short queue pair decoded")
	}
	r := rdmaRegion{Addr: 1 << 40, RKey: 0xdead, Pages: 16384}
	if decodeRDMARegion(r.encode(nil)) != r {
		t.Fatal("region round trip")
	}
}
