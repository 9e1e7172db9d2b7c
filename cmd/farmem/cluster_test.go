package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/ctrl/etcdtest"
	"github.com/farmem/farmem/fabric"
)

// netCluster is a ctrl in the root network namespace and memory servers each in a network
// namespace of its own, joined to the root by a veth pair: separate hosts as far as the
// network goes, so a link can be cut (`ip link set down`) as well as a process killed.
// Traffic stays inside namespaces the test created: 10.77.0.1 (the ctrl, on the root's lo)
// and 10.77.N.1/10.77.N.2 (root and server N ends of veth N).
//
// The ctrl serves over TLS with a certificate from `farmem cert` (its address is not loopback),
// and keeps its state in a file, or in a real etcd on the root's loopback. Several ctrls share
// one etcd, at 10.77.0.1, 10.77.0.2, ...
type netCluster struct {
	t       *testing.T
	tag     string // unique per test: names of namespaces and links
	token   string // token file
	ca      string // the cluster CA: every client's --ca
	ctrl    string // the ctrls' addresses, comma-separated: every client's --ctrl
	ctrls   []*exec.Cmd
	addrs   []string // of the ctrls, in the order of ctrls
	etcd    *etcdtest.Cluster
	servers []*netServer
}

// netOpts says how a netCluster's ctrls keep their state.
type netOpts struct {
	etcd        bool // in etcd, not a file
	ctrls       int  // this many ctrls (more than one: on etcd)
	etcdMembers int  // members of the etcd cluster (default 1)
}

type netServer struct {
	ns, link, addr string
	cmd            *exec.Cmd
}

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

func newNetCluster(t *testing.T, servers int, opts ...netOpts) *netCluster {
	if os.Getuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Fatal("the multi-host tests need iproute2's ip (apt-get install iproute2)")
	}
	c := &netCluster{t: t, tag: fmt.Sprintf("fm%d", os.Getpid()%10000)}
	dir := t.TempDir()
	c.token = filepath.Join(dir, "token")
	os.WriteFile(c.token, []byte("cluster-test-token-0123456789abcdef\n"), 0o600)
	opt := netOpts{ctrls: 1}
	if len(opts) > 0 {
		opt = opts[0]
	}
	// The ctrls' addresses live on the root namespace's lo (this kernel has no dummy links), so
	// they stay reachable from every server whichever link is cut.
	var hosts []string
	for i := 1; i <= max(opt.ctrls, 1); i++ {
		host := fmt.Sprintf("10.77.0.%d", i)
		ip(t, "addr", "add", host+"/32", "dev", "lo")
		t.Cleanup(func() { exec.Command("ip", "addr", "del", host+"/32", "dev", "lo").Run() })
		hosts = append(hosts, host)
		c.addrs = append(c.addrs, fmt.Sprintf("%s:%d", host, freePort(t)))
	}
	c.ctrl = strings.Join(c.addrs, ",")
	certs := filepath.Join(dir, "tls")
	if out, err := exec.Command(farmemBin(t), "cert", "--dir", certs, "--host", strings.Join(hosts, ",")).CombinedOutput(); err != nil {
		t.Fatalf("farmem cert: %v: %s", err, out)
	}
	c.ca = filepath.Join(certs, "ca.pem")
	store := []string{"--state", filepath.Join(dir, "ctrl")}
	if opt.etcd || opt.ctrls > 1 {
		c.etcd = etcdtest.Start(t, max(opt.etcdMembers, 1), "")
		store = []string{"--etcd", strings.Join(c.etcd.Endpoints(), ",")}
	}
	for _, addr := range c.addrs {
		cmd, _ := startLogged(t, "ctrl "+addr, append([]string{farmemBin(t), "ctrl", "--listen", addr, "--token-file", c.token, "--slab-size", "4MiB", "--dead-after", "2s",
			"--tls-cert", filepath.Join(certs, "ctrl.pem"), "--tls-key", filepath.Join(certs, "ctrl-key.pem")}, store...)...)
		c.ctrls = append(c.ctrls, cmd)
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

func (c *netCluster) addServer(i int) {
	t := c.t
	s := &netServer{ns: fmt.Sprintf("%ss%d", c.tag, i), link: fmt.Sprintf("%sv%d", c.tag, i),
		addr: fmt.Sprintf("10.77.%d.2:7070", i)}
	ip(t, "netns", "add", s.ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", s.ns).Run() })
	ip(t, "link", "add", s.link, "type", "veth", "peer", "name", "eth0", "netns", s.ns)
	t.Cleanup(func() { exec.Command("ip", "link", "del", s.link).Run() })
	ip(t, "addr", "add", fmt.Sprintf("10.77.%d.1/24", i), "dev", s.link)
	ip(t, "link", "set", s.link, "up")
	ip(t, "-n", s.ns, "addr", "add", fmt.Sprintf("10.77.%d.2/24", i), "dev", "eth0")
	ip(t, "-n", s.ns, "link", "set", "eth0", "up")
	ip(t, "-n", s.ns, "link", "set", "lo", "up")
	ip(t, "-n", s.ns, "route", "add", "default", "via", fmt.Sprintf("10.77.%d.1", i))
	s.cmd, _ = startLogged(t, "memserver "+s.addr, "ip", "netns", "exec", s.ns, farmemBin(t), "memserver",
		"--listen", s.addr, "--capacity", "512MiB", "--ctrl", c.ctrl, "--token-file", c.token, "--ca", c.ca)
	c.servers = append(c.servers, s)
}

// kill crashes a memory server (kill -9: its memory and connections go at once).
func (s *netServer) kill() { s.cmd.Process.Signal(syscall.SIGKILL) }

// cut takes the server's link down: the process lives on, unreachable.
func (c *netCluster) cut(s *netServer) { ip(c.t, "link", "set", s.link, "down") }

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

// Two ctrls on a three-member etcd, three memory servers, redis at --replicas 2: the leading
// ctrl is killed (SIGKILL: its lease runs out rather than being given up), then an etcd
// member, then a memory server. The other ctrl takes over: the memory servers and the client
// move to it, it restores the replica count, places the new slabs, and `farmem status`
// through either address is answered by it. DEBUG DIGEST is unchanged throughout.
func TestClusterCtrlFailover(t *testing.T) {
	need(t, "redis-server")
	c := newNetCluster(t, 3, netOpts{ctrls: 2, etcdMembers: 3})
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

	i := slices.Index(c.addrs, leader)
	if i < 0 {
		t.Fatalf("status answered by %s, not one of the ctrls %v", leader, c.addrs)
	}
	c.ctrls[i].Process.Signal(syscall.SIGKILL)
	survivor := c.addrs[1-i]
	readAll(40000) // the data path does not wait for the ctrl
	d1 := r.must(t, "DEBUG", "DIGEST")
	c.waitStatus("the other ctrl leading, every server and the session on it", func(st ctrl.Status) bool {
		healthy := 0
		for _, s := range st.Servers {
			if s.Healthy && s.MsSinceHeartbeat < 1000 {
				healthy++
			}
		}
		return healthy == 3 && len(st.Sessions) == 1 && st.Sessions[0].MsSinceHeartbeat < 2000
	})
	if _, by, err := c.statusFrom(leader + "," + survivor); err != nil || by != survivor {
		t.Fatalf("status through the dead leader's address first: answered by %s, %v; want %s", by, err, survivor)
	}

	c.etcd.Members[0].Kill() // two of three still make a quorum
	c.servers[0].kill()
	readAll(40000)
	c.waitRestored(c.servers[0])
	r.must(t, "DEBUG", "POPULATE", "60000", "key", "400") // new slabs, placed by the survivor
	readAll(60000)
	for i := 40000; i < 60000; i += 1000 {
		args := []string{"DEL"}
		for k := i; k < i+1000; k++ {
			args = append(args, fmt.Sprintf("key:%d", k))
		}
		r.must(t, args...)
	}
	d2 := r.must(t, "DEBUG", "DIGEST")
	st, by, err := c.statusFrom(survivor)
	if err != nil || by != survivor || st.Totals.HealthyServers != 2 || st.Totals.Degraded+st.Totals.Lost+st.Totals.Rebuilding != 0 {
		t.Errorf("status from the surviving ctrl: %+v, answered by %s, %v", st.Totals, by, err)
	}
	r.send("SHUTDOWN", "NOSAVE")
	err = cmd.Wait()
	t.Logf("digests %s %s %s; farmem: %s", d0, d1, d2, out.String())
	if err != nil {
		t.Fatalf("farmem run ended with %v", err)
	}
	if strings.Trim(d0, "0") == "" || d0 != d1 || d1 != d2 {
		t.Fatalf("DEBUG DIGEST changed: before %s, after the leading ctrl was killed %s, after an etcd member and a memory server too %s", d0, d1, d2)
	}
}
