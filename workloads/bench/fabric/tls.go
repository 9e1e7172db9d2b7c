package main

// What TLS on the page path would cost. fabric's tcp data path is blocking syscalls on a raw
// descriptor, out of Go's netpoller; crypto/tls runs over a net.Conn, so a TLS page path would
// pay two things on top of the raw round trip: the netpoller's park and wakeup of the reading
// goroutine, and the record layer's AES-GCM. The kernel's TLS (kTLS), which would keep the raw
// descriptor and move the record layer into the kernel, is not in every kernel (not in this
// machine's: no "tls" in /proc/sys/net/ipv4/tcp_available_ulp). So the benchmark measures the
// raw protocol three ways over loopback, in the same run: raw descriptor (the floor, rawClient),
// a plain net.Conn (the netpoller alone), and a TLS 1.3 net.Conn (netpoller plus record layer).

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"io"
	"math/big"
	"net"
	"time"

	"github.com/farmem/farmem/fabric"
)

// selfSigned is a throwaway certificate for the TLS echo server. The client does not verify it:
// verification is the handshake's cost, paid once a connection, and this measures records.
func selfSigned() tls.Certificate {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check(err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		DNSNames: []string{"localhost"}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check(err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// listenConnEcho starts the raw protocol's echo (reads only: 1 page or a batch, no stream) over
// net.Conn, in TLS 1.3 if withTLS, and returns its address.
func listenConnEcho(withTLS bool) string {
	var l net.Listener
	var err error
	if withTLS {
		l, err = tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{selfSigned()}, MinVersion: tls.VersionTLS13})
	} else {
		l, err = net.Listen("tcp", "127.0.0.1:0")
	}
	check(err)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			if tc, ok := c.(*net.TCPConn); ok {
				tc.SetNoDelay(true)
			}
			go connServe(c)
		}
	}()
	return l.Addr().String()
}

// connServe answers read requests as rawServe does, through c.
func connServe(c net.Conn) {
	defer c.Close()
	req := make([]byte, fabric.HeaderSize+fabric.MaxPages*fabric.AddrSize)
	for {
		if _, err := io.ReadFull(c, req[:fabric.HeaderSize]); err != nil {
			return
		}
		h, err := fabric.ParseHeader(req[:fabric.HeaderSize])
		if err != nil {
			return
		}
		if _, err := io.ReadFull(c, req[fabric.HeaderSize:fabric.HeaderSize+int(h.Len)]); err != nil {
			return
		}
		n, p := int(h.Count), int(binary.LittleEndian.Uint32(req[fabric.HeaderSize:]))
		if p+n > slabPages || n == 0 {
			return
		}
		a := max(p*fabric.PageSize-fabric.HeaderSize, 0)
		if _, err := c.Write(rawMem[a : a+fabric.HeaderSize+n*fabric.PageSize]); err != nil {
			return
		}
	}
}

// connClient is one net.Conn (plain or TLS) to a connServe.
type connClient struct {
	c   net.Conn
	req []byte
	raw rawClient // its ans and check, shared with the raw client
}

func dialConn(addr string, withTLS bool) *connClient {
	var c net.Conn
	var err error
	if withTLS {
		c, err = tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13})
	} else {
		c, err = net.Dial("tcp", addr)
	}
	check(err)
	if tc, ok := c.(*tls.Conn); ok {
		check(tc.Handshake())
		c.(*tls.Conn).NetConn().(*net.TCPConn).SetNoDelay(true)
	} else {
		c.(*net.TCPConn).SetNoDelay(true)
	}
	return &connClient{c: c, req: make([]byte, fabric.HeaderSize+fabric.MaxPages*fabric.AddrSize),
		raw: rawClient{ans: make([]byte, fabric.HeaderSize+fabric.MaxPages*fabric.PageSize)}}
}

// read is one request for n pages from page p on, and its answer.
func (c *connClient) read(p, n int) {
	(&fabric.Header{Op: fabric.OpRead, Count: uint32(n), Len: uint32(n * fabric.AddrSize)}).Put(c.req)
	binary.LittleEndian.PutUint32(c.req[fabric.HeaderSize:], uint32(p))
	if _, err := c.c.Write(c.req[:fabric.HeaderSize+n*fabric.AddrSize]); err != nil {
		panic("conn echo failed: " + err.Error())
	}
	if _, err := io.ReadFull(c.c, c.raw.ans[:fabric.HeaderSize+n*fabric.PageSize]); err != nil {
		panic("conn echo failed: " + err.Error())
	}
}

func (c *connClient) check(p, n int) { c.raw.check(p, n) }

// tlsCipher names the cipher suite a TLS client negotiated.
func tlsCipher(c *connClient) string {
	if tc, ok := c.c.(*tls.Conn); ok {
		return tls.CipherSuiteName(tc.ConnectionState().CipherSuite)
	}
	return ""
}
