package fabric

import (
	"net"
	"strings"
	"testing"
)

// A peer of another protocol version is refused by name, in both directions.
func TestVersionMismatchSaysSo(t *testing.T) {
	// A server from the future: its challenge carries version 2.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		payload := []byte{2, 0} // version 2; the rest of a v2 challenge is unknown to us
		c.Write(frame(Header{Op: OpChallenge}, payload))
		var b [64]byte
		c.Read(b[:])
	}()
	_, err = DialTCP(ln.Addr().String(), DialConfig{Token: testToken, Session: NewSessionID()})
	if err == nil || !strings.Contains(err.Error(), "speaks fabric protocol v2, this farmem speaks v1") {
		t.Fatalf("dialing a v2 server: %v", err)
	}

	// A client from the future, against our server.
	_, addr := startServer(t, 10)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hdr := make([]byte, HeaderSize)
	if _, err := readFull(c, hdr); err != nil {
		t.Fatal(err)
	}
	h, _ := ParseHeader(hdr)
	if _, err := readFull(c, make([]byte, h.Len)); err != nil {
		t.Fatal(err)
	}
	c.Write(frame(Header{Op: OpHello}, []byte{2, 0}))
	if _, err := readFull(c, hdr); err != nil {
		t.Fatal(err)
	}
	h, err = ParseHeader(hdr)
	if err != nil || h.Status != StatusVersion {
		t.Fatalf("server answered a v2 hello with %+v %v, want StatusVersion", h, err)
	}
	msg := make([]byte, h.Len)
	readFull(c, msg)
	if !strings.Contains(string(msg), "speaks fabric protocol v1, the client v2") {
		t.Fatalf("server's refusal does not name the versions: %q", msg)
	}
}

func readFull(c net.Conn, b []byte) (int, error) {
	n := 0
	for n < len(b) {
		m, err := c.Read(b[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
