package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/ctrl/etcdtest"
	"github.com/farmem/farmem/fabric"
)

// netCluster is ctrls and memory servers each in a network namespace of its own, joined by
// veth pairs to a router namespace (the only one that forwards), which is joined to the root
// namespace, where the client, `farmem status` and etcd run: separate hosts as far as the
// network goes, so a link can be cut (`ip link set down`) as well as a process killed, and a
// ctrl can be cut off from etcd alone. Traffic stays inside namespaces the test created:
//
//	root      10.77.0.1 (the client's source), 10.77.0.3 (etcd)  <-> router 10.77.0.2
//	server N  10.77.N.2                                           <-> router 10.77.N.1
//	ctrl N    10.78.N.2                                           <-> router 10.78.N.1
//
// The root routes only 10.77.0.0/16 and 10.78.0.0/16, through the router.
//
// The ctrls serve over TLS with a certificate from `farmem cert` (their addresses are not
// loopback), and keep their state in a file, or in a real etcd. Several ctrls share one etcd.
type netCluster struct {
	t       *testing.T
	tag     string // unique per test: names of namespaces and links
	router  string // the router namespace
	token   string // token file
	ca      string // the cluster CA: every client's --ca
	ctrl    string // the ctrls' addresses, comma-separated: every client's --ctrl
	ctrls   []*exec.Cmd
	ctrlNS  []string     // each ctrl's namespace, in the order of ctrls
	ctrlLog []*lockedBuf // each ctrl's output
	addrs   []string     // of the ctrls, in the order of ctrls
	etcd    *etcdtest.Cluster
	servers []*netServer
}

// etcdHost is where etcd listens, in the root namespace.
const etcdHost = "10.77.0.3"

// netOpts says how a netCluster's ctrls keep their state.
type netOpts struct {
	etcd        bool // in etcd, not a file
	ctrls       int  // this many ctrls (more than one: on etcd)
	etcdMembers int  // members of the etcd cluster (default 1)
}

type netServer struct {
	ns, link, addr string // link: its end in the router namespace
	cmd            *exec.Cmd
}

// lockedBuf collects a process's output while the test reads it.
type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer // guarded by mu
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuf) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// startLogged starts argv with its output collected, and kills it at the end of the test,
// logging that output.
func startLogged(t *testing.T, name string, argv ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(argv[0], argv[1:]...)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		t.Logf("%s log:\n%s", name, log.String())
	})
	return cmd, &log
}

func ip(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// addNS creates a network namespace, removed at the end of the test, with its lo up.
func (c *netCluster) addNS(name string) {
	ip(c.t, "netns", "add", name)
	c.t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	ip(c.t, "-n", name, "link", "set", "lo", "up")
}

// wire links namespace ns to the router: link is the router's end (routerIP/24), eth0 the
// namespace's (hostIP/24, its default route through the router).
func (c *netCluster) wire(ns, link, routerIP, hostIP string) {
	t := c.t
	ip(t, "-n", c.router, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns)
	ip(t, "-n", c.router, "addr", "add", routerIP+"/24", "dev", link)
	ip(t, "-n", c.router, "link", "set", link, "up")
	ip(t, "-n", ns, "addr", "add", hostIP+"/24", "dev", "eth0")
	ip(t, "-n", ns, "link", "set", "eth0", "up")
	ip(t, "-n", ns, "route", "add", "default", "via", routerIP)
}

func newNetCluster(t *testing.T, servers int, opts ...netOpts) *netCluster {
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("the multi-host tests need iproute2's ip (apt-get install iproute2)")
	}
	tag := fmt.Sprintf("fm%d", os.Getpid()%10000)
	c := &netCluster{t: t, tag: tag, router: tag + "r"}
	dir := t.TempDir()
	c.token = filepath.Join(dir, "token")
	os.WriteFile(c.token, []byte("cluster-test-token-0123456789abcdef\n"), 0o600)
	opt := netOpts{ctrls: 1}
	if len(opts) > 0 {
		opt = opts[0]
	}

	// The router, and the root's link to it.
	c.addNS(c.router)
	if out, err := exec.Command("ip", "netns", "exec", c.router, "sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward").CombinedOutput(); err != nil {
		t.Fatalf("turning forwarding on in the router namespace: %v: %s", err, out)
	}
	host := tag + "h"
	ip(t, "link", "add", host, "type", "veth", "peer", "name", "root", "netns", c.router)
	t.Cleanup(func() { exec.Command("ip", "link", "del", host).Run() })
	ip(t, "-n", c.router, "addr", "add", "10.77.0.2/24", "dev", "root")
	ip(t, "-n", c.router, "link", "set", "root", "up")
	ip(t, "addr", "add", "10.77.0.1/24", "dev", host)
	ip(t, "addr", "add", etcdHost+"/24", "dev", host)
	ip(t, "link", "set", host, "up")
	for _, net := range []string{"10.77.0.0/16", "10.78.0.0/16"} {
		ip(t, "route", "add", net, "via", "10.77.0.2", "src", "10.77.0.1")
	}

	var hosts []string
	for i := 1; i <= max(opt.ctrls, 1); i++ {
		ns := fmt.Sprintf("%sc%d", tag, i)
		c.addNS(ns)
		h := fmt.Sprintf("10.78.%d.2", i)
		c.wire(ns, fmt.Sprintf("c%d", i), fmt.Sprintf("10.78.%d.1", i), h)
		hosts = append(hosts, h)
		c.ctrlNS = append(c.ctrlNS, ns)
		c.addrs = append(c.addrs, h+":7000")
	}
	c.ctrl = strings.Join(c.addrs, ",")
	certs := filepath.Join(dir, "tls")
	if out, err := exec.Command(farmemBin(t), "cert", "--dir", certs, "--host", strings.Join(hosts, ",")).CombinedOutput(); err != nil {
		t.Fatalf("farmem cert: %v: %s", err, out)
	}
	c.ca = filepath.Join(certs, "ca.pem")
	store := []string{"--state", filepath.Join(dir, "ctrl")}
	if opt.etcd || opt.ctrls > 1 {
		c.etcd = etcdtest.Start(t, max(opt.etcdMembers, 1), etcdHost)
		store = []string{"--etcd", strings.Join(c.etcd.Endpoints(), ",")}
	}
	for i, addr := range c.addrs {
		c.startCtrl(c.ctrlNS[i], addr, append([]string{"--token-file", c.token, "--slab-size", "4MiB", "--dead-after", "2s",
			"--tls-cert", filepath.Join(certs, "ctrl.pem"), "--tls-key", filepath.Join(certs, "ctrl-key.pem")}, store...))
	}
	for i := 1; i <= servers; i++ {
		c.addServer(i)
	}
	c.waitStatus("every server healthy", func(st ctrl.Status) bool {
		n := 0
		for _, s := range st.Servers {
			if s.Healthy {
				n++
			}
		}
		return n == servers
	})
	return c
}

func (c *netCluster) startCtrl(ns, addr string, args []string) {
	t := c.t
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns, farmemBin(t), "ctrl", "--listen", addr}, args...)...)
	log := &lockedBuf{}
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		t.Logf("ctrl %s log:\n%s", addr, log.String())
	})
	c.ctrls = append(c.ctrls, cmd)
	c.ctrlLog = append(c.ctrlLog, log)
}

func (c *netCluster) addServer(i int) {
	t := c.t
	s := &netServer{ns: fmt.Sprintf("%ss%d", c.tag, i), link: fmt.Sprintf("s%d", i),
		addr: fmt.Sprintf("10.77.%d.2:7070", i)}
	c.addNS(s.ns)
	c.wire(s.ns, s.link, fmt.Sprintf("10.77.%d.1", i), fmt.Sprintf("10.77.%d.2", i))
	s.cmd, _ = startLogged(t, "memserver "+s.addr, "ip", "netns", "exec", s.ns, farmemBin(t), "memserver",
		"--listen", s.addr, "--capacity", "512MiB", "--ctrl", c.ctrl, "--token-file", c.token, "--ca", c.ca)
	c.servers = append(c.servers, s)
}

// kill crashes a memory server (kill -9: its memory and connections go at once).
func (s *netServer) kill() { s.cmd.Process.Signal(syscall.SIGKILL) }

// cut takes the server's link down: the process lives on, unreachable.
func (c *netCluster) cut(s *netServer) { ip(c.t, "-n", c.router, "link", "set", s.link, "down") }

// cutFromEtcd drops, in ctrl i's namespace, what it sends to etcd: it still reaches, and is
// reached by, the memory servers and clients.
func (c *netCluster) cutFromEtcd(i int) {
	ip(c.t, "-n", c.ctrlNS[i], "route", "add", "blackhole", etcdHost+"/32")
}

func (c *netCluster) status() (ctrl.Status, error) {
	st, _, err := c.statusFrom(c.ctrl)
	return st, err
}

// statusFrom asks the ctrl(s) at addr; answeredBy is the ctrl that answered (the leader).
func (c *netCluster) statusFrom(addr string) (st ctrl.Status, answeredBy string, err error) {
	tok, err := fabric.LoadToken(c.token)
	if err != nil {
		return ctrl.Status{}, "", err
	}
	ca, err := ctrl.LoadCA(c.ca)
	if err != nil {
		return ctrl.Status{}, "", err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cl := ctrl.NewClient(addr, tok, ca)
	st, err = cl.Status(ctx)
	return st, cl.Addr(), err
}

func (c *netCluster) waitStatus(what string, ok func(ctrl.Status) bool) ctrl.Status {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, err := c.status()
		if err == nil && ok(st) {
			return st
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("cluster never reached %q: %+v %v", what, st, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// waitRestored waits until the ctrl counts srv dead and the session's every slab has all its
// replicas ready again.
func (c *netCluster) waitRestored(srv *netServer) {
	c.t.Helper()
	c.waitStatus("replicas restored after losing "+srv.addr, func(st ctrl.Status) bool {
		for _, s := range st.Servers {
			if s.Addr == srv.addr && s.Healthy {
				return false
			}
		}
		for _, s := range st.Sessions {
			if s.Degraded > 0 || s.Rebuilding > 0 || s.Lost > 0 {
				return false
			}
		}
		return len(st.Sessions) > 0
	})
}

// Redis at a 24MiB cap with two replicas of every evicted page on four memory servers: one
// server killed, another's link cut, and the data is the same after each, with the replica
// count restored by the ctrl each time.
func TestClusterRedisSurvivesServerLoss(t *testing.T) {
	need(t, "redis-server")
	c := newNetCluster(t, 4)
	port := freePort(t)
	args, summary := summarized(t, []string{"run", "--ctrl", c.ctrl, "--token-file", c.token, "--ca", c.ca, "--replicas", "2",
		"--local-mem", "24MiB", "--", "redis-server", "--port", strconv.Itoa(port), "--save", "",
		"--appendonly", "no", "--enable-debug-command", "yes", "--bind", "127.0.0.1"})
	cmd := exec.Command(farmemBin(t), args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	r := dialRedis(t, port)
	r.must(t, "DEBUG", "POPULATE", "80000", "key", "400")
	d0 := r.must(t, "DEBUG", "DIGEST")
	readAll := func() {
		for i := 0; i < 80000; i += 1000 {
			args := []string{"MGET"}
			for k := i; k < i+1000; k++ {
				args = append(args, fmt.Sprintf("key:%d", k))
			}
			r.must(t, args...)
		}
	}
	c.servers[0].kill()
	readAll() // right away: reads fail over before the ctrl even notices
	d1 := r.must(t, "DEBUG", "DIGEST")
	c.waitRestored(c.servers[0])
	c.cut(c.servers[1])
	readAll()
	d2 := r.must(t, "DEBUG", "DIGEST")
	c.waitRestored(c.servers[1])
	r.must(t, "DEBUG", "POPULATE", "120000", "key", "400") // more evictions onto the survivors
	readAll()
	d3 := r.must(t, "DEBUG", "DIGEST")
	r.must(t, "DEL", "key:80000")
	for i := 80001; i < 120000; i += 1000 {
		args := []string{"DEL"}
		for k := i; k < i+1000; k++ {
			args = append(args, fmt.Sprintf("key:%d", k))
		}
		r.must(t, args...)
	}
	d4 := r.must(t, "DEBUG", "DIGEST")
	r.send("SHUTDOWN", "NOSAVE")
	err := cmd.Wait()
	t.Logf("digests %s %s %s %s %s; farmem: %s", d0, d1, d2, d3, d4, out.String())
	if err != nil {
		t.Fatalf("farmem run ended with %v", err)
	}
	if strings.Trim(d0, "0") == "" || d0 != d1 || d1 != d2 || d2 != d4 {
		t.Fatalf("DEBUG DIGEST changed: before %s, after a kill %s, after a cut %s, after more keys and deleting them %s", d0, d1, d2, d4)
	}
	if summary().Faults["backend"].Count == 0 {
		t.Fatalf("redis never faulted a page back from the memory servers: %s", out.String())
	}
}

// With one copy of each page, losing its server stops the program with a message naming the
// server: never zeros, never a hang.
func TestClusterSingleCopyLossStopsProgram(t *testing.T) {
	c := newNetCluster(t, 1, netOpts{etcd: true})
	cmd := exec.Command(farmemBin(t), "run", "--ctrl", c.ctrl, "--token-file", c.token, "--ca", c.ca,
		"--local-mem", "16MiB", "--", filepath.Join(binDir, "micro"), "--mib", "64", "--pattern", "random", "--passes", "1000000")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	c.waitStatus("pages on the server", func(st ctrl.Status) bool {
		return len(st.Servers) == 1 && st.Servers[0].UsedPages > 0
	})
	time.Sleep(time.Second) // let it page for a while
	c.servers[0].kill()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		// The program was SIGKILLed: farmem exits as the kill left it, 128+9.
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 128+int(syscall.SIGKILL) {
			t.Fatalf("farmem run exited %v after the only copy of its pages died, want status 137: %s", err, out.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the program still runs 60s after its only memory server died: %s", out.String())
	}
	msg := out.String()
	t.Logf("%s", msg)
	if !strings.Contains(msg, c.servers[0].addr) {
		t.Fatalf("the message does not name the lost server %s: %s", c.servers[0].addr, msg)
	}
	if strings.Contains(msg, "verified") && !strings.Contains(msg, "stopped") {
		t.Fatalf("micro finished as if nothing happened: %s", msg)
	}
}

// Bad cluster input from the command line: each gets its message and nothing runs. farmem's
// failures are 125 under farmem run; the other commands' are 125 for bad input, 1 otherwise.
func TestClusterBadInput(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	bad := filepath.Join(dir, "bad")
	os.WriteFile(good, []byte("the-right-cluster-token-0123456789\n"), 0o600)
	os.WriteFile(bad, []byte("some-other-cluster-token-98765432\n"), 0o600)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startLogged(t, "ctrl", farmemBin(t), "ctrl", "--listen", addr, "--state", filepath.Join(dir, "ctrl"), "--token-file", good)
	dialRetry(t, mustPort(t, addr)).Close()
	unreachable := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	for _, c := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"run", "--ctrl", addr, "--token-file", bad, "--local-mem", "64MiB", "--", "true"}, 125, "wrong or missing cluster token"},
		{[]string{"run", "--ctrl", addr, "--local-mem", "64MiB", "--", "true"}, 125, "--token-file is required with --ctrl"},
		{[]string{"run", "--ctrl", addr, "--token-file", "", "--local-mem", "64MiB", "--", "true"}, 125, "--token-file is required with --ctrl"},
		{[]string{"run", "--ctrl", addr, "--token-file", filepath.Join(dir, "nope"), "--local-mem", "64MiB", "--", "true"}, 125, "reading the cluster token"},
		{[]string{"run", "--ctrl", unreachable, "--token-file", good, "--local-mem", "64MiB", "--", "true"}, 125, "cannot reach the farmem ctrl at " + unreachable},
		{[]string{"run", "--replicas", "2", "--local-mem", "64MiB", "--", "true"}, 125, "give --ctrl"},
		{[]string{"run", "--ctrl", "10.0.0.1:7000", "--token-file", good, "--local-mem", "64MiB", "--", "true"}, 125, "refusing to send the cluster token in clear to the ctrl at 10.0.0.1:7000"},
		{[]string{"run", "--ca", good, "--local-mem", "64MiB", "--", "true"}, 125, "give --ctrl"},
		{[]string{"memserver", "--ctrl", "10.0.0.1:7000", "--token-file", good, "--capacity", "64MiB", "--listen", "127.0.0.1:0"}, 125, "refusing to send the cluster token in clear"},
		{[]string{"cert", "--bogus"}, 125, "flag provided but not defined: -bogus"},
		{[]string{"run", "--ctrl", addr, "--token-file", good, "--replicas", "0", "--local-mem", "64MiB", "--", "true"}, 125, "--replicas 0"},
		{[]string{"run", "--ctrl", addr, "--token-file", good, "--compress", "lz4", "--local-mem", "64MiB", "--", "true"}, 125, "--compress applies to the embedded store"},
		{[]string{"memserver", "--ctrl", addr, "--token-file", bad, "--capacity", "64MiB", "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))}, 1, "wrong or missing cluster token"},
		{[]string{"memserver", "--ctrl", addr, "--token-file", good, "--listen", "127.0.0.1:0"}, 125, "--capacity SIZE is required"},
		{[]string{"memserver", "--ctrl", addr, "--token-file", good, "--capacity", "1GiB", "--listen", "0.0.0.0:7070"}, 125, "give --advertise"},
		{[]string{"memserver", "--ctrl", addr, "--token-file", good, "--capacity", "150%", "--listen", "127.0.0.1:0"}, 125, `--capacity: size "150%": give a percentage`},
		{[]string{"memserver", "--ctrl", addr, "--token-file", good, "--capacity", "0.000001%", "--listen", "127.0.0.1:0"}, 125, "is below 1MiB"},
		{[]string{"memserver", "--ctrl", addr, "--token-file", good, "--capacity", "64mb", "--listen", "127.0.0.1:0"}, 125, `"mb" is ambiguous`},
		{[]string{"memserver", "--bogus"}, 125, "flag provided but not defined: -bogus"},
		{[]string{"status", "--bogus"}, 125, "flag provided but not defined: -bogus"},
		{[]string{"ctrl", "--bogus"}, 125, "flag provided but not defined: -bogus"},
		{[]string{"sim", "--bogus"}, 125, "flag provided but not defined: -bogus"},
		{[]string{"status", "--ctrl", unreachable, "--token-file", good}, 1, unreachable},
	} {
		cmd := exec.Command(farmemBin(t), c.args...)
		out, err := cmd.CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != c.code || !strings.Contains(string(out), c.want) {
			t.Errorf("farmem %s: exit %d, output %q; want exit %d and %q", strings.Join(c.args, " "), code, out, c.code, c.want)
		}
	}
}

func mustPort(t *testing.T, addr string) int {
	_, p, _ := strings.Cut(addr, ":")
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// statusCLI is `farmem status --json` asked of the ctrl at addr alone.
func (c *netCluster) statusCLI(addr string) (ctrl.Status, error) {
	out, err := exec.Command(farmemBin(c.t), "status", "--ctrl", addr, "--token-file", c.token, "--ca", c.ca, "--json").CombinedOutput()
	if err != nil {
		return ctrl.Status{}, fmt.Errorf("farmem status --ctrl %s: %v: %s", addr, err, out)
	}
	var st ctrl.Status
	if err := json.Unmarshal(out, &st); err != nil {
		return ctrl.Status{}, fmt.Errorf("farmem status --ctrl %s --json: %v: %s", addr, err, out)
	}
	return st, nil
}

// checkStatusFromEvery runs `farmem status` against each ctrl in addrs alone: each must show
// the same cluster, led by leader, with `healthy` servers, one session and every slab whole.
func (c *netCluster) checkStatusFromEvery(addrs []string, leader string, healthy int) {
	c.t.Helper()
	for _, a := range addrs {
		st, err := c.statusCLI(a)
		if err != nil {
			c.t.Error(err)
			continue
		}
		if t := st.Totals; st.Leader != leader || t.HealthyServers != healthy || t.Sessions != 1 || t.Slabs == 0 || t.Degraded+t.Lost+t.Rebuilding != 0 {
			c.t.Errorf("farmem status --ctrl %s: leader %q, totals %+v; want leader %s, %d healthy servers, one session, every slab whole", a, st.Leader, t, leader, healthy)
		}
	}
}

// waitLeader waits until the ctrls at addrs (tried in turn) answer from want, and it says it
// leads.
func (c *netCluster) waitLeader(addrs []string, want string) {
	c.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		st, by, err := c.statusFrom(strings.Join(addrs, ","))
		if err == nil && by == want && st.Leader == want {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s never led: status answered by %s (leader %q), %v", want, by, st.Leader, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Three ctrls, each in its own network namespace, on a three-member etcd, four memory servers,
// redis at --replicas 2: the leading ctrl is killed (SIGKILL: its lease runs out rather than
// being given up), then an etcd member, then a memory server. Another ctrl takes over: the
// memory servers and the client move to it, it restores the replica count, places the new
// slabs, and `farmem status` asked of each live ctrl shows it leading and the cluster whole.
// Then that leader is cut off from etcd while servers and clients still reach it: it places
// no slab from then on, and the last ctrl takes over and places the next ones. DEBUG DIGEST is
// unchanged throughout.
func TestClusterCtrlFailover(t *testing.T) {
	need(t, "redis-server")
	c := newNetCluster(t, 4, netOpts{ctrls: 3, etcdMembers: 3})
	_, leader, err := c.statusFrom(c.ctrl)
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	cmd := exec.Command(farmemBin(t), "run", "--ctrl", c.ctrl, "--token-file", c.token, "--ca", c.ca, "--replicas", "2",
		"--local-mem", "16MiB", "--", "redis-server", "--port", strconv.Itoa(port), "--save", "",
		"--appendonly", "no", "--enable-debug-command", "yes", "--bind", "127.0.0.1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	defer func() {
		if t.Failed() {
			cmd.Process.Kill()
			cmd.Wait()
			t.Logf("farmem: %s", out.String())
		}
	}()
	r := dialRedis(t, port)
	r.must(t, "DEBUG", "POPULATE", "40000", "key", "400")
	d0 := r.must(t, "DEBUG", "DIGEST")
	readAll := func(n int) {
		for i := 0; i < n; i += 1000 {
			args := []string{"MGET"}
			for k := i; k < i+1000; k++ {
				args = append(args, fmt.Sprintf("key:%d", k))
			}
			r.must(t, args...)
		}
	}
	// addAndDrop stores keys 40000..n (new slabs, placed by the leader of the moment), reads
	// everything, and deletes them again: the digest is d0's once more.
	addAndDrop := func(n int) string {
		r.must(t, "DEBUG", "POPULATE", strconv.Itoa(n), "key", "400")
		readAll(n)
		for i := 40000; i < n; i += 1000 {
			args := []string{"DEL"}
			for k := i; k < i+1000; k++ {
				args = append(args, fmt.Sprintf("key:%d", k))
			}
			r.must(t, args...)
		}
		return r.must(t, "DEBUG", "DIGEST")
	}

	i := slices.Index(c.addrs, leader)
	if i < 0 {
		t.Fatalf("status answered by %s, not one of the ctrls %v", leader, c.addrs)
	}
	c.ctrls[i].Process.Signal(syscall.SIGKILL)
	live := slices.Delete(slices.Clone(c.addrs), i, i+1)
	readAll(40000) // the data path does not wait for the ctrl
	d1 := r.must(t, "DEBUG", "DIGEST")
	c.waitStatus("another ctrl leading, every server and the session on it", func(st ctrl.Status) bool {
		healthy := 0
		for _, s := range st.Servers {
			if s.Healthy && s.MsSinceHeartbeat < 1000 {
				healthy++
			}
		}
		return healthy == 4 && len(st.Sessions) == 1 && st.Sessions[0].MsSinceHeartbeat < 2000
	})
	_, second, err := c.statusFrom(leader + "," + strings.Join(live, ","))
	if err != nil || !slices.Contains(live, second) {
		t.Fatalf("status through the dead leader's address first: answered by %s, %v; want one of %v", second, err, live)
	}

	c.etcd.Members[0].Kill() // two of three still make a quorum
	c.servers[0].kill()
	readAll(40000)
	c.waitRestored(c.servers[0])
	d2 := addAndDrop(60000)
	c.waitRestored(c.servers[0])
	// An etcd member's death can stall etcd for its own election; on a loaded machine that can
	// outlast the leader's lease, and the other live ctrl takes over. Both are right: the data
	// must not notice either way.
	_, now, err := c.statusFrom(strings.Join(live, ","))
	if err != nil || !slices.Contains(live, now) {
		t.Fatalf("status after an etcd member died: answered by %s, %v; want one of %v", now, err, live)
	}
	if now != second {
		t.Logf("the leader %s lost its lease when the etcd member died: %s leads now", second, now)
		second = now
	}
	c.checkStatusFromEvery(live, second, 3)

	// The leader cut off from etcd places nothing: asked for a slab (a session of the test's
	// own), it either fails or hands the request to another ctrl.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tok, err := fabric.LoadToken(c.token)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := ctrl.LoadCA(c.ca)
	if err != nil {
		t.Fatal(err)
	}
	probe, err := ctrl.NewClient(second, tok, ca).OpenSession(ctx, "probe")
	if err != nil {
		t.Fatal(err)
	}
	j := slices.Index(c.addrs, second)
	c.cutFromEtcd(j)
	third := live[0]
	if third == second {
		third = live[1]
	}
	short, cancelShort := context.WithTimeout(context.Background(), 3*time.Second)
	cut := ctrl.NewClient(second, tok, ca)
	sl, err := cut.AllocSlab(short, probe.ID, 2)
	cancelShort()
	if err == nil && cut.Addr() == second {
		t.Fatalf("the ctrl cut off from etcd placed slab %d", sl.ID)
	}
	t.Logf("a slab asked of the ctrl cut off from etcd: %v (answered by %s)", err, cut.Addr())
	c.waitLeader([]string{third}, third)
	d3 := addAndDrop(80000) // new slabs, placed by the third ctrl
	c.waitStatus("the replica count whole under the third ctrl", func(st ctrl.Status) bool {
		for _, s := range st.Sessions {
			if s.Name != "probe" && (s.Degraded > 0 || s.Rebuilding > 0 || s.Lost > 0) {
				return false
			}
		}
		return st.Leader == third
	})
	if log := c.ctrlLog[j].String(); !strings.Contains(log, "no longer leading") {
		t.Errorf("the ctrl cut off from etcd never said it stopped leading:\n%s", log)
	}
	closeCtx, cancelClose := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelClose()
	if err := ctrl.NewClient(third, tok, ca).CloseSession(closeCtx, probe.ID); err != nil {
		t.Fatal(err)
	}
	c.checkStatusFromEvery([]string{third}, third, 3)

	r.send("SHUTDOWN", "NOSAVE")
	err = cmd.Wait()
	t.Logf("digests %s %s %s %s; farmem: %s", d0, d1, d2, d3, out.String())
	if err != nil {
		t.Fatalf("farmem run ended with %v", err)
	}
	if strings.Trim(d0, "0") == "" || d0 != d1 || d1 != d2 || d2 != d3 {
		t.Fatalf("DEBUG DIGEST changed: before %s, after the leading ctrl was killed %s, after an etcd member and a memory server too %s, after the next leader was cut off from etcd %s", d0, d1, d2, d3)
	}
}

// A run that frees most of its memory gives the emptied slabs back during the run: a program
// fills 96 MiB under a 16 MiB cap (the memory servers hold the rest), reads it back and unmaps
// it, and while it runs on, the session's slab count and the servers' used memory fall.
func TestClusterFreedSlabsGoBack(t *testing.T) {
	prog := filepath.Join(t.TempDir(), "freeing")
	if out, err := exec.Command("cc", "-O2", "-Wall", "-o", prog, "testdata/freeing.c").CombinedOutput(); err != nil {
		t.Fatalf("cc testdata/freeing.c: %v: %s", err, out)
	}
	c := newNetCluster(t, 2)
	cmd := exec.Command(farmemBin(t), "run", "--ctrl", c.ctrl, "--token-file", c.token, "--ca", c.ca, "--replicas", "2",
		"--local-mem", "16MiB", "--", prog, "96")
	var logs lockedBuf
	cmd.Stderr = &logs
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	usage := func(st ctrl.Status) (slabs int, used uint64) {
		for _, s := range st.Sessions {
			slabs += s.Slabs
		}
		return slabs, st.Totals.UsedPages
	}
	// The most it held: polled while it fills, until it says it unmapped the memory.
	var slabs0 int
	var used0 uint64
	said := make(chan string, 1)
	go func() {
		b := make([]byte, 64)
		n, _ := stdout.Read(b)
		said <- string(b[:n])
	}()
	for filling := true; filling; {
		select {
		case line := <-said:
			if line != "freed\n" {
				t.Fatalf("the program said %q, not \"freed\": %s", line, logs.String())
			}
			filling = false
		case <-time.After(100 * time.Millisecond):
			if st, err := c.status(); err == nil {
				n, used := usage(st)
				slabs0, used0 = max(slabs0, n), max(used0, used)
			}
		}
	}
	if slabs0 < 16 {
		t.Fatalf("the session held at most %d slabs of 4 MiB for 96 MiB of memory beyond a 16 MiB cap: %s", slabs0, logs.String())
	}
	after := c.waitStatus("the emptied slabs given back", func(st ctrl.Status) bool {
		n, used := usage(st)
		return n <= slabs0/4 && used <= used0/4
	})
	slabs1, used1 := usage(after)
	t.Logf("the session's slabs %d -> %d, the servers' used pages %d -> %d", slabs0, slabs1, used0, used1)
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("farmem run ended with %v: %s", err, logs.String())
	}
}
