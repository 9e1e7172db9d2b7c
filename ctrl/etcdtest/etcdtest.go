// Package etcdtest runs real etcd servers for tests, on loopback (or any address the test owns)
// and free ports, each with its data in the test's temporary directory. The binary is etcd's
// own server, built from the pinned module by scripts/test-deps.sh (workloads/etcd).
package etcdtest

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Version is the etcd the tests run, the one go.mod's client is pinned to.
const Version = "v3.7.3"

// Binary is the etcd server: $FARMEM_ETCD, else where scripts/test-deps.sh builds it. With
// FARMEM_SKIP_ETCD=1 the test is skipped when it is missing; otherwise it fails saying how to
// build it.
func Binary(t testing.TB) string {
	t.Helper()
	p := os.Getenv("FARMEM_ETCD")
	if p == "" {
		p = "/var/cache/farmem-etcd/etcd-" + Version
	}
	if _, err := os.Stat(p); err != nil {
		if os.Getenv("FARMEM_SKIP_ETCD") == "1" {
			t.Skipf("no etcd at %s (FARMEM_SKIP_ETCD=1)", p)
		}
		t.Fatalf("no etcd binary at %s: scripts/test-deps.sh builds it (cd workloads/etcd && go build -o %s .); set FARMEM_ETCD to its path, or FARMEM_SKIP_ETCD=1 to skip the tests that need it", p, p)
	}
	return p
}

// Cluster is a running etcd cluster.
type Cluster struct {
	Members []*Member
}

// Member is one etcd server.
type Member struct {
	Name      string
	ClientURL string // http://HOST:PORT
	cmd       *exec.Cmd
	log       *syncBuf
	done      chan struct{} // closed when the process has exited
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// Start runs an n-member etcd cluster on host (an address of this machine, 127.0.0.1 when
// empty) and waits until every member reports healthy. Extra flags go to every member (say
// --max-txn-ops). The members are killed when the test ends; a failed test logs their output.
func Start(t testing.TB, n int, host string, extra ...string) *Cluster {
	t.Helper()
	return start(t, n, host, nil, extra)
}

// TLSFiles are a member's certificate and key and the CA it trusts clients by.
type TLSFiles struct{ Cert, Key, CA string }

// StartTLS is Start with the client URLs served over TLS, and a client certificate signed by
// files.CA required of every client (--client-cert-auth). Peers talk in clear.
func StartTLS(t testing.TB, n int, host string, files TLSFiles) *Cluster {
	t.Helper()
	return start(t, n, host, &files, []string{"--cert-file", files.Cert, "--key-file", files.Key,
		"--trusted-ca-file", files.CA, "--client-cert-auth"})
}

func start(t testing.TB, n int, host string, files *TLSFiles, extra []string) *Cluster {
	t.Helper()
	// A port free when chosen can be taken before etcd binds it (by another test's listener):
	// the member then exits at once, and the whole cluster is started again on other ports.
	for attempt := 1; ; attempt++ {
		c, err := tryStart(t, n, host, files, extra)
		if err == nil {
			return c
		}
		if attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("%v; starting the cluster again on other ports", err)
	}
}

// errPortTaken is a member's exit before it was healthy because a port it was given was taken.
var errPortTaken = errors.New("an etcd member's port was taken before it could bind it")

func tryStart(t testing.TB, n int, host string, files *TLSFiles, extra []string) (*Cluster, error) {
	t.Helper()
	bin := Binary(t)
	if host == "" {
		host = "127.0.0.1"
	}
	dir := t.TempDir()
	c := &Cluster{}
	scheme, hc := "http://", &http.Client{Timeout: 2 * time.Second}
	if files != nil {
		scheme = "https://"
		pair, err := tls.LoadX509KeyPair(files.Cert, files.Key)
		if err != nil {
			t.Fatal(err)
		}
		ca, err := os.ReadFile(files.CA)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(ca)
		hc.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{pair}}}
	}
	var peers []string
	peerURLs := make([]string, n)
	for i := range n {
		m := &Member{Name: fmt.Sprintf("m%d", i+1), ClientURL: scheme + net.JoinHostPort(host, freePort(t, host)), done: make(chan struct{})}
		peerURLs[i] = "http://" + net.JoinHostPort(host, freePort(t, host))
		peers = append(peers, m.Name+"="+peerURLs[i])
		c.Members = append(c.Members, m)
	}
	for i, m := range c.Members {
		args := append([]string{
			"--name", m.Name, "--data-dir", filepath.Join(dir, m.Name),
			"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", peerURLs[i], "--initial-advertise-peer-urls", peerURLs[i],
			"--initial-cluster", strings.Join(peers, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "farmem-test", "--log-level", "error",
		}, extra...)
		m.cmd = exec.Command(bin, args...)
		m.log = &syncBuf{}
		m.cmd.Stdout, m.cmd.Stderr = m.log, m.log
		m.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlives a crashed test
		if err := m.cmd.Start(); err != nil {
			t.Fatalf("starting etcd: %v", err)
		}
		go func() { m.cmd.Wait(); close(m.done) }()
		t.Cleanup(func() {
			m.Kill()
			if t.Failed() {
				t.Logf("etcd %s log:\n%s", m.Name, m.log.String())
			}
		})
	}
	for _, m := range c.Members {
		if err := m.awaitHealthy(t, hc); err != nil {
			for _, m := range c.Members {
				m.Kill()
			}
			return nil, err
		}
	}
	return c, nil
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

// Kill stops the member at once (SIGKILL) and waits for it to exit.
func (m *Member) Kill() {
	m.cmd.Process.Kill()
	<-m.done
}

// awaitHealthy waits for /health to say so; 60 s is a hang, not a timing assertion. A member
// that exits because its port was taken is errPortTaken, to be started again elsewhere.
func (m *Member) awaitHealthy(t testing.TB, hc *http.Client) error {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get(m.ClientURL + "/health")
		if err == nil {
			var b bytes.Buffer
			b.ReadFrom(resp.Body)
			resp.Body.Close()
			if strings.Contains(b.String(), `"health":"true"`) {
				return nil
			}
		}
		select {
		case <-m.done:
			if strings.Contains(m.log.String(), "address already in use") {
				return fmt.Errorf("%w (%s)", errPortTaken, m.Name)
			}
			t.Fatalf("etcd %s exited before it was healthy:\n%s", m.Name, m.log.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("etcd %s not healthy after 60s (%v):\n%s", m.Name, err, m.log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freePort returns a port nothing listens on at host, chosen below the kernel's ephemeral range:
// a port from that range, free when asked, is what the next outgoing connection of any process
// here may be given before etcd binds it.
func freePort(t testing.TB, host string) string {
	t.Helper()
	hi := 32768 // the kernel's default first ephemeral port
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 0 {
			if v, err := strconv.Atoi(f[0]); err == nil && v > 11000 {
				hi = v
			}
		}
	}
	for range 1000 {
		p := strconv.Itoa(10000 + rand.IntN(hi-10000))
		ln, err := net.Listen("tcp", net.JoinHostPort(host, p))
		if err != nil {
			continue
		}
		ln.Close()
		return p
	}
	t.Fatalf("no free port below %d on %s", hi, host)
	return ""
}
