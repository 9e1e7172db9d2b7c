package ycsb

import (
	"bufio"
	"errors"
	"net"
	"os/exec"
	"testing"
	"time"
)

// corrupting flips one byte of key 7's value as it is read back.
type corrupting struct{ Protocol }

func (c corrupting) ReadGet(r *bufio.Reader, k uint64) ([]byte, error) {
	v, err := c.Protocol.ReadGet(r, k)
	if k == 7 && len(v) > 0 {
		v[len(v)-1] ^= 1
	}
	return v, err
}

// The driver checks every value it reads: against a real server, an intact run is OK, and a
// byte changed on its way back is BAD (ErrBad), for each protocol.
func TestDriverCatchesAWrongValue(t *testing.T) {
	for _, s := range []struct {
		name string
		argv func(port string) []string
		p    func() Protocol
	}{
		{"redis-server", func(port string) []string {
			return []string{"--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"}
		}, func() Protocol { return &RESP{} }},
		{"memcached", func(port string) []string {
			return []string{"-p", port, "-l", "127.0.0.1", "-m", "64", "-U", "0", "-u", "root"}
		}, func() Protocol { return &MemcachedText{} }},
	} {
		t.Run(s.name, func(t *testing.T) {
			bin, err := exec.LookPath(s.name)
			if err != nil {
				t.Skip(s.name, "not installed")
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := ln.Addr().String()
			ln.Close()
			_, port, _ := net.SplitHostPort(addr)
			srv := exec.Command(bin, s.argv(port)...)
			if err := srv.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() { srv.Process.Kill(); srv.Wait() }()
			c := Config{Name: "test", Addr: addr, Keys: 100, ValueBytes: 64, Ops: 1000, GetRatio: 0.9, Theta: 0.99,
				Batch: 16, Seed: 1, VerifyAll: true, Wait: 10 * time.Second}
			if err := Run(c, s.p()); err != nil {
				t.Fatalf("an intact server: %v", err)
			}
			if err := Run(c, corrupting{s.p()}); !errors.Is(err, ErrBad) {
				t.Fatalf("a value changed on its way back: got %v, want %v", err, ErrBad)
			}
		})
	}
}
