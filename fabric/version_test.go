package fabric

import (
	"fmt"
	"net"
	"strings"
	"testing"
)

// A peer of another protocol version is refused by name, in both directions: one from before
// traced requests (v1) and one from the future (v3).
func TestVersionMismatchSaysSo(t *testing.T) {
	for _, other := range []uint16{Version - 1, Version + 1} {
		t.Run(fmt.Sprintf("v%d", other), func(t *testing.T) { versionMismatch(t, other) })
	}
}

func versionMismatch(t *testing.T, other uint16) {
	// A server of the other version: its challenge carries that version.
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
		payload := []byte{byte(other), 0} // the rest of its challenge is unknown to us
		c.Write(frame(Header{Op: OpChallenge}, payload))
		var b [64]byte
		c.Read(b[:])
	}()
	_, err = DialTCP(ln.Addr().String(), DialConfig{Token: testToken, Session: NewSessionID()})
	want := fmt.Sprintf("speaks fabric protocol v%d, this farmem speaks v%d", other, Version)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("dialing a v%d server: %v, want %q", other, err, want)
	}

	// A client of the other version, against our server.
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
	c.Write(frame(Header{Op: OpHello}, []byte{byte(other), 0}))
	if _, err := readFull(c, hdr); err != nil {
		t.Fatal(err)
	}
	h, err = ParseHeader(hdr)
	if err != nil || h.Status != StatusVersion {
		t.Fatalf("server answered a v%d hello with %+v %v, want StatusVersion", other, h, err)
	}
	msg := make([]byte, h.Len)
	readFull(c, msg)
	want = fmt.Sprintf("speaks fabric protocol v%d, the client v%d", Version, other)
	if !strings.Contains(string(msg), want) {
		t.Fatalf("server's refusal does not name the versions: %q, want %q", msg, want)
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
