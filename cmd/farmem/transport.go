package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/fabric"
)

// The shm convention: a memory server started with `--shm DIR` also serves clients on its own
// host through shared memory, on the unix socket DIR/HOST:PORT.sock, HOST:PORT being the address
// it advertises to the ctrl. `farmem run --transport shm --shm DIR` dials that socket for every
// memory server whose advertised address is on this host (a loopback address or one of this
// network namespace's interface addresses), and tcp for the others. The ctrl knows nothing of
// it: the advertised address is the only name a client has for a server, so the socket is named
// after it.

// defaultSHMDir is where `farmem run --transport shm` looks for memory servers' sockets.
const defaultSHMDir = "/run/farmem"

// shmSocket is the socket of the memory server advertised as addr.
func shmSocket(dir, addr string) string { return filepath.Join(dir, addr+".sock") }

// maxSocketPath is the longest path a unix socket address holds (sun_path, with its NUL).
const maxSocketPath = 107

// dialFunc is how the remote store reaches a memory server.
type dialFunc = func(addr string, cfg fabric.DialConfig) (fabric.Transport, error)

// rdmaDial is the rdma transport when it is compiled in (build tag rdma); nil otherwise.
var rdmaDial dialFunc

// transportDial checks --transport and --shm and returns the dial function for them (nil: tcp,
// the remote store's default).
func transportDial(c *cli.Context, logf func(string, ...any)) (dialFunc, error) {
	tr := c.String("transport")
	if c.IsSet("shm") && tr != "shm" {
		return nil, usagef("--shm DIR applies to --transport shm")
	}
	spin, err := checkSpin(c)
	if err != nil {
		return nil, err
	}
	dialTCP := func(addr string, cfg fabric.DialConfig) (fabric.Transport, error) {
		cfg.Spin = spin
		return fabric.DialTCP(addr, cfg)
	}
	switch tr {
	case "tcp":
		if spin == 0 {
			return nil, nil
		}
		return dialTCP, nil
	case "rdma":
		if rdmaDial == nil {
			return nil, usagef("the rdma transport is not compiled into this farmem (build with -tags rdma)")
		}
		if spin == 0 {
			return rdmaDial, nil
		}
		return func(addr string, cfg fabric.DialConfig) (fabric.Transport, error) {
			cfg.Spin = spin
			return rdmaDial(addr, cfg)
		}, nil
	case "shm":
		dir := c.String("shm")
		if !filepath.IsAbs(dir) {
			return nil, usagef("--shm %s: give an absolute directory", dir)
		}
		return func(addr string, cfg fabric.DialConfig) (fabric.Transport, error) {
			if !onThisHost(addr) {
				return dialTCP(addr, cfg)
			}
			path := shmSocket(dir, addr)
			t, err := fabric.DialSHM(path, cfg)
			if err != nil {
				var hint string
				if errors.Is(err, os.ErrNotExist) {
					hint = fmt.Sprintf(" (start it with --shm %s, or run with --transport tcp)", dir)
				}
				return nil, fmt.Errorf("memory server %s is on this host, but its shared memory is out of reach: %w%s", addr, err, hint)
			}
			logf("farmem: memory server %s is on this host: shared memory through %s", addr, path)
			return t, nil
		}, nil
	}
	return nil, usagef("--transport %q: give tcp, shm or rdma", tr)
}

// maxSpin bounds --spin: polling longer than this is burning a CPU, not waiting for an answer.
const maxSpin = time.Millisecond

// The default spins. A fault's read waits for its answer polling: the program is stopped on
// the fault meanwhile, so the CPU would otherwise idle, and an idle vCPU woken by the answer
// costs more than the answer. A memory server polls for a connection's next request a little
// longer than a faulting program's usual gap between faults, so that a program paging
// steadily finds its server's thread awake, and sleeps once the program stops paging.
const (
	defaultRunSpin    = 50 * time.Microsecond
	defaultServerSpin = 200 * time.Microsecond
)

// spinFlag is --spin: fabric's Spin, def by default. Polling avoids the wakeup of a sleeping
// thread, which on a VM without halt-polling costs more than a loopback round trip
// (results/fabric.md); a poll yields the CPU between tries, so a peer or a program sharing it
// runs meanwhile.
func spinFlag(usage string, def time.Duration) cli.Flag {
	return &cli.DurationFlag{Name: "spin", Value: def, Usage: usage + "; 0: sleep at once (results/fabric.md)"}
}

func checkSpin(c *cli.Context) (time.Duration, error) {
	d := c.Duration("spin")
	if d < 0 || d > maxSpin {
		return 0, usagef("--spin %v: give 0 to %v", d, maxSpin)
	}
	return d, nil
}

// onThisHost says whether a HOST:PORT names this host (in this network namespace).
func onThisHost(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	var ips []net.IP
	if ip := net.ParseIP(host); ip != nil {
		ips = []net.IP{ip}
	} else if ips, err = net.LookupIP(host); err != nil {
		return false
	}
	local, _ := net.InterfaceAddrs()
	for _, ip := range ips {
		if ip.IsLoopback() {
			return true
		}
		for _, a := range local {
			if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ip) {
				return true
			}
		}
	}
	return false
}

// listenSHM makes the memory server's shm socket, replacing a stale one a dead server left.
func listenSHM(dir, advertise string) (*net.UnixListener, error) {
	if !filepath.IsAbs(dir) {
		return nil, usagef("--shm %s: give an absolute directory", dir)
	}
	path := shmSocket(dir, advertise)
	if len(path) > maxSocketPath {
		return nil, usagef("--shm %s: the socket path %s is longer than a unix socket allows (%d bytes): give a shorter directory", dir, path, maxSocketPath)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		if c, err := net.Dial("unix", path); err == nil {
			c.Close()
			return nil, fmt.Errorf("another memory server serves %s", path)
		}
		os.Remove(path)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, err
	}
	return ln, nil
}
