package main

// `farmem ctrl` and `farmem status`, run in-process on loopback: no root, no bin/farmem.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/ctrl/etcdtest"
	"github.com/farmem/farmem/fabric"
)

// ctrlTestApp is main's app reduced to the commands under test.
func ctrlTestApp(out, errw *ctrlLog) *cli.App {
	return &cli.App{
		Name:            "farmem",
		Writer:          out,
		ErrWriter:       errw,
		HideHelpCommand: true,
		ExitErrHandler:  func(*cli.Context, error) {},
		OnUsageError:    func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Commands:        []*cli.Command{ctrlCommand(), statusCommand(), certCommand()},
	}
}

// ctrlLog collects output and wakes whoever waits for a line.
type ctrlLog struct {
	mu     sync.Mutex
	b      bytes.Buffer  // guarded by mu
	change chan struct{} // closed and replaced on every write; guarded by mu
}

func newCtrlLog() *ctrlLog { return &ctrlLog{change: make(chan struct{})} }

func (l *ctrlLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b.Write(p)
	close(l.change)
	l.change = make(chan struct{})
	return len(p), nil
}

func (l *ctrlLog) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// await returns the first submatch of re once the output has it, or fails after 10s (a hang,
// not a timing assertion: the line comes as soon as the ctrl listens).
func (l *ctrlLog) await(t *testing.T, re *regexp.Regexp, done <-chan error) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		l.mu.Lock()
		m := re.FindStringSubmatch(l.b.String())
		ch := l.change
		l.mu.Unlock()
		if m != nil {
			return m[1]
		}
		select {
		case <-ch:
		case err := <-done:
			t.Fatalf("farmem ctrl ended (%v) before printing %v:\n%s", err, re, l.String())
		case <-deadline:
			t.Fatalf("no %v from farmem ctrl in 10s:\n%s", re, l.String())
		}
	}
}

func writeToken(t *testing.T, dir, tok string) string {
	t.Helper()
	p := filepath.Join(dir, "token")
	if err := os.WriteFile(p, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCtrlCommandBadInput(t *testing.T) {
	dir := t.TempDir()
	tok := writeToken(t, dir, "0123456789abcdef0123456789abcdef")
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abc\n"), 0o600)
	notDir := filepath.Join(dir, "file")
	os.WriteFile(notDir, nil, 0o600)
	state := filepath.Join(dir, "state")
	cases := []struct {
		name  string
		args  []string
		usage bool // exit status 125: bad input, nothing started
		want  string
	}{
		{"no token", []string{"ctrl", "--state", state}, true, "a cluster token is required: pass --token-file"},
		{"short token", []string{"ctrl", "--state", state, "--token-file", short}, false, "is 3 bytes; at least 16 are needed"},
		{"missing token file", []string{"ctrl", "--state", state, "--token-file", filepath.Join(dir, "nope")}, false, "reading the cluster token"},
		{"bad slab size", []string{"ctrl", "--token-file", tok, "--slab-size", "12XB"}, true, `--slab-size: cannot parse size "12XB"`},
		{"odd slab size", []string{"ctrl", "--token-file", tok, "--slab-size", "1000000"}, true, "must be a multiple of 4KiB"},
		{"dead-after too short", []string{"ctrl", "--token-file", tok, "--dead-after", "600ms"}, true, "--dead-after 600ms is too short"},
		{"bad duration", []string{"ctrl", "--token-file", tok, "--dead-after", "soon"}, true, "invalid value \"soon\" for flag -dead-after"},
		{"session-timeout too short", []string{"ctrl", "--token-file", tok, "--session-timeout", "2s"}, true, "--session-timeout 2s is too short"},
		{"state not a directory", []string{"ctrl", "--token-file", tok, "--state", filepath.Join(notDir, "x")}, false, "cannot create the ctrl state directory"},
		{"argument", []string{"ctrl", "--token-file", tok, "extra"}, true, "takes no arguments"},
		{"status without token", []string{"status"}, true, "a cluster token is required"},
		{"state and etcd", []string{"ctrl", "--token-file", tok, "--state", state, "--etcd", "http://127.0.0.1:1"}, true, "--state and --etcd both say where the state is kept"},
		{"etcd prefix without etcd", []string{"ctrl", "--token-file", tok, "--etcd-prefix", "/x/"}, true, "--etcd-prefix, --etcd-max-txn-ops, --etcd-ca, --etcd-cert, --etcd-key and --advertise apply to --etcd"},
		{"advertise without etcd", []string{"ctrl", "--token-file", tok, "--advertise", "127.0.0.1:7000"}, true, "--etcd-prefix, --etcd-max-txn-ops, --etcd-ca, --etcd-cert, --etcd-key and --advertise apply to --etcd"},
		{"etcd without advertise", []string{"ctrl", "--token-file", tok, "--etcd", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"}, true, "--listen 127.0.0.1:0 is not an address clients can dial: give --advertise HOST:PORT too"},
		{"etcd bad URL", []string{"ctrl", "--token-file", tok, "--etcd", "ftp://127.0.0.1:2379"}, false, `etcd endpoint "ftp://127.0.0.1:2379" is not an http(s)://HOST:PORT URL`},
		{"etcd-ca without etcd", []string{"ctrl", "--token-file", tok, "--etcd-ca", tok}, true, "apply to --etcd: give --etcd URL[,URL...] too"},
		{"etcd-ca with http", []string{"ctrl", "--token-file", tok, "--etcd", "http://127.0.0.1:1", "--advertise", "127.0.0.1:7000", "--etcd-ca", tok}, true, "--etcd-ca, --etcd-cert and --etcd-key apply to https:// --etcd endpoints"},
		{"etcd cert without key", []string{"ctrl", "--token-file", tok, "--etcd", "https://127.0.0.1:1", "--advertise", "127.0.0.1:7000", "--etcd-cert", tok}, true, "--etcd-cert and --etcd-key go together"},
		{"etcd https bad CA", []string{"ctrl", "--token-file", tok, "--etcd", "https://127.0.0.1:1", "--advertise", "127.0.0.1:7000", "--etcd-ca", tok}, false, "--etcd-ca: " + tok + " holds no PEM certificate"},
		{"etcd no scheme", []string{"ctrl", "--token-file", tok, "--etcd", "127.0.0.1:2379", "--advertise", "127.0.0.1:7000"}, false, `etcd endpoint "127.0.0.1:2379" is not an http(s)://HOST:PORT URL`},
		{"etcd max ops", []string{"ctrl", "--token-file", tok, "--etcd", "http://127.0.0.1:1", "--etcd-max-txn-ops", "1"}, true, "--etcd-max-txn-ops 1"},
		{"cert without key", []string{"ctrl", "--token-file", tok, "--state", state, "--tls-cert", tok}, true, "--tls-cert and --tls-key go together"},
		{"cert not a cert", []string{"ctrl", "--token-file", tok, "--state", state, "--tls-cert", tok, "--tls-key", tok}, false, "loading the ctrl's TLS certificate"},
		{"clear off loopback", []string{"ctrl", "--token-file", tok, "--state", state, "--listen", "0.0.0.0:7000"}, true, "--listen 0.0.0.0:7000 is not a loopback address, and the API carries the cluster token: serve it over TLS with --tls-cert and --tls-key"},
		{"status in clear off loopback", []string{"status", "--token-file", tok, "--ctrl", "10.0.0.1:7000"}, true, "refusing to send the cluster token in clear to the ctrl at 10.0.0.1:7000"},
		{"status bad CA", []string{"status", "--token-file", tok, "--ctrl", "10.0.0.1:7000", "--ca", tok}, false, "holds no PEM certificate"},
		{"cert without host", []string{"cert", "--dir", dir}, true, "--host HOST[,HOST...] is required"},
		{"cert bad host", []string{"cert", "--dir", dir, "--host", "10.0.0.1:7000"}, true, `--host "10.0.0.1:7000" is neither an IP address nor a DNS name`},
		{"cert name", []string{"cert", "--dir", dir, "--host", "x", "--name", "ca"}, true, `--name "ca"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, errw := newCtrlLog(), newCtrlLog()
			err := ctrlTestApp(out, errw).Run(append([]string{"farmem"}, c.args...))
			var ue usageError
			if err == nil || !strings.Contains(err.Error(), c.want) || errors.As(err, &ue) != c.usage {
				t.Errorf("farmem %s: %v (usage error: %v), want %q (usage error: %v)", strings.Join(c.args, " "), err, errors.As(err, &ue), c.want, c.usage)
			}
		})
	}
}

// `farmem ctrl` serves, `farmem status` prints its tables and JSON, SIGTERM's context stops it.
func TestStatusCommandShowsServers(t *testing.T) {
	dir := t.TempDir()
	const secret = "0123456789abcdef0123456789abcdef"
	tokFile := writeToken(t, dir, secret)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctrlOut, ctrlErr := newCtrlLog(), newCtrlLog()
	done := make(chan error, 1)
	go func() {
		done <- ctrlTestApp(ctrlOut, ctrlErr).RunContext(ctx, []string{"farmem", "ctrl", "--listen", "127.0.0.1:0",
			"--state", filepath.Join(dir, "state"), "--token-file", tokFile, "--slab-size", "4MiB"})
	}()
	addr := ctrlErr.await(t, regexp.MustCompile(`listening on (127\.0\.0\.1:\d+)`), done)

	// Two memory servers and a session with a slab, as the real ones would report them.
	cl := ctrl.NewClient(addr, fabric.Token(secret), nil)
	bg := context.Background()
	for _, s := range []ctrl.ServerReport{
		{ID: "11aa", Addr: "10.0.0.7:7070", CapacityPages: 8 << 18, UsedPages: 1 << 10},
		{ID: "22bb", Addr: "10.0.0.8:7070", CapacityPages: 4 << 18},
	} {
		if _, err := cl.ServerHeartbeat(bg, s); err != nil {
			t.Fatal(err)
		}
	}
	sess, err := cl.OpenSession(bg, "testhost 99 redis-server")
	if err != nil {
		t.Fatal(err)
	}
	if sess.SlabPages != 1024 {
		t.Errorf("--slab-size 4MiB gave %d-page slabs", sess.SlabPages)
	}
	if _, err := cl.AllocSlab(bg, sess.ID, 2); err != nil {
		t.Fatal(err)
	}

	out := newCtrlLog()
	if err := ctrlTestApp(out, newCtrlLog()).Run([]string{"farmem", "status", "--ctrl", addr, "--token-file", tokFile}); err != nil {
		t.Fatal(err)
	}
	text := out.String()
	t.Logf("farmem status:\n%s", text)
	for _, want := range []string{
		"memory servers: 2 healthy of 2, 12GiB capacity, 4MiB used; slabs of 4MiB",
		"ADDR", "HEALTH", "CAPACITY",
		"10.0.0.7:7070", "10.0.0.8:7070", "healthy", "8GiB", "4GiB",
		"sessions: 1, 1 slabs (0 degraded, 0 rebuilding, 0 lost)",
		"testhost 99 redis-server", sess.ID.String(),
	} {
		if !strings.Contains(text, want) {
			t.Errorf("farmem status does not show %q", want)
		}
	}
	if !regexp.MustCompile(`10\.0\.0\.7:7070 +healthy +8GiB +4MiB +7\.99GiB +1 `).MatchString(text) {
		t.Errorf("the server row does not read addr, health, capacity, used, free, slabs")
	}

	out = newCtrlLog()
	if err := ctrlTestApp(out, newCtrlLog()).Run([]string{"farmem", "status", "--ctrl", addr, "--token-file", tokFile, "--json"}); err != nil {
		t.Fatal(err)
	}
	var st ctrl.Status
	if err := json.Unmarshal([]byte(out.String()), &st); err != nil || len(st.Servers) != 2 || st.Sessions[0].Replicas != 2 {
		t.Errorf("farmem status --json: %v %+v\n%s", err, st, out.String())
	}

	wrong := writeToken(t, t.TempDir(), "another-secret-of-enough-length!")
	err = ctrlTestApp(newCtrlLog(), newCtrlLog()).Run([]string{"farmem", "status", "--ctrl", addr, "--token-file", wrong})
	if err == nil || !strings.Contains(err.Error(), "wrong or missing cluster token: check --token-file matches the ctrl's") {
		t.Errorf("status with the wrong token: %v", err)
	}

	cancel()
	if err := <-done; err != nil {
		t.Errorf("farmem ctrl on SIGTERM: %v", err)
	}
	log := ctrlErr.String()
	for _, want := range []string{"farmem ctrl: server 10.0.0.7:7070 (11aa) joined", "session " + sess.ID.String() + " (testhost 99 redis-server) opened", "farmem ctrl: stopped"} {
		if !strings.Contains(log, want) {
			t.Errorf("the ctrl's log does not say %q:\n%s", want, log)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "state", "state.json")); err != nil {
		t.Errorf("no state saved: %v", err)
	}
}

// `farmem cert` makes the CA and the ctrl's certificate; `farmem ctrl --etcd` keeps the state in
// a real etcd (over TLS, with a client certificate) and serves over TLS; `farmem status --ca` reads it; a ctrl started afterwards on
// the same etcd has the same cluster.
func TestCtrlCommandOnEtcdWithTLS(t *testing.T) {
	dir := t.TempDir()
	const secret = "0123456789abcdef0123456789abcdef"
	tokFile := writeToken(t, dir, secret)
	certs := filepath.Join(dir, "tls")
	out := newCtrlLog()
	if err := ctrlTestApp(out, newCtrlLog()).Run([]string{"farmem", "cert", "--dir", certs, "--host", "127.0.0.1,localhost"}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"made the cluster CA " + certs + "/ca.pem", certs + "/ctrl.pem for 127.0.0.1, localhost, valid until",
		"farmem ctrl --tls-cert " + certs + "/ctrl.pem --tls-key " + certs + "/ctrl-key.pem", "--ca " + certs + "/ca.pem"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("farmem cert does not say %q:\n%s", want, out.String())
		}
	}
	if fi, err := os.Stat(filepath.Join(certs, "ctrl-key.pem")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("the key is not private to its owner: %v %v", fi.Mode(), err)
	}
	// A second certificate reuses the CA.
	out = newCtrlLog()
	if err := ctrlTestApp(out, newCtrlLog()).Run([]string{"farmem", "cert", "--dir", certs, "--host", "10.0.0.9", "--name", "other"}); err != nil || strings.Contains(out.String(), "made the cluster CA") {
		t.Errorf("a second certificate: %v\n%s", err, out.String())
	}

	// etcd over TLS too, checking its clients' certificates: its certificate from the same CA,
	// and the ctrl's own certificate as its client certificate.
	if err := ctrlTestApp(newCtrlLog(), newCtrlLog()).Run([]string{"farmem", "cert", "--dir", certs, "--host", "127.0.0.1", "--name", "etcd"}); err != nil {
		t.Fatal(err)
	}
	etcd := etcdtest.StartTLS(t, 1, "", etcdtest.TLSFiles{Cert: filepath.Join(certs, "etcd.pem"), Key: filepath.Join(certs, "etcd-key.pem"), CA: filepath.Join(certs, "ca.pem")})
	start := func() (addr string, ctrlErr *ctrlLog, stop func()) {
		ctx, cancel := context.WithCancel(context.Background())
		listen := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		ctrlErr = newCtrlLog()
		done := make(chan error, 1)
		go func() {
			done <- ctrlTestApp(newCtrlLog(), ctrlErr).RunContext(ctx, []string{"farmem", "ctrl", "--listen", listen,
				"--etcd", strings.Join(etcd.Endpoints(), ","), "--token-file", tokFile, "--slab-size", "4MiB",
				"--etcd-ca", filepath.Join(certs, "ca.pem"), "--etcd-cert", filepath.Join(certs, "ctrl.pem"), "--etcd-key", filepath.Join(certs, "ctrl-key.pem"),
				"--tls-cert", filepath.Join(certs, "ctrl.pem"), "--tls-key", filepath.Join(certs, "ctrl-key.pem")})
		}()
		addr = ctrlErr.await(t, regexp.MustCompile(`listening on (127\.0\.0\.1:\d+) \(TLS; state in etcd at `+regexp.QuoteMeta(etcd.Endpoints()[0])+` under /farmem/ctrl/`), done)
		return addr, ctrlErr, func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("farmem ctrl on SIGTERM: %v", err)
			}
		}
	}
	addr, _, stop := start()
	ca, err := ctrl.LoadCA(filepath.Join(certs, "ca.pem"))
	if err != nil {
		t.Fatal(err)
	}
	cl := ctrl.NewClient(addr, fabric.Token(secret), ca)
	bg := context.Background()
	if _, err := cl.ServerHeartbeat(bg, ctrl.ServerReport{ID: "11aa", Addr: "10.0.0.7:7070", CapacityPages: 8 << 18}); err != nil {
		t.Fatal(err)
	}
	sess, err := cl.OpenSession(bg, "testhost 99 redis-server")
	if err != nil {
		t.Fatal(err)
	}
	sl, err := cl.AllocSlab(bg, sess.ID, 1)
	if err != nil {
		t.Fatal(err)
	}
	status := func(addr string, args ...string) (string, error) {
		out := newCtrlLog()
		err := ctrlTestApp(out, newCtrlLog()).Run(append([]string{"farmem", "status", "--ctrl", addr, "--token-file", tokFile}, args...))
		return out.String(), err
	}
	if text, err := status(addr, "--ca", filepath.Join(certs, "ca.pem")); err != nil || !strings.HasPrefix(text, "leading ctrl: "+addr+"\nmemory servers: 1 healthy of 1") || !strings.Contains(text, "sessions: 1, 1 slabs") {
		t.Errorf("farmem status --ca: %v\n%s", err, text)
	}
	if _, err := status(addr); err == nil || !strings.Contains(err.Error(), "it serves TLS: give --ca FILE") {
		t.Errorf("farmem status without --ca: %v", err)
	}
	stop()

	// Another ctrl on the same etcd: the same servers, session and slab.
	addr, ctrlErr, stop := start()
	defer stop()
	ctrlErr.await(t, regexp.MustCompile(`(leading the ctrls \(as 127\.0\.0\.1:\d+\): 1 servers, 1 sessions, 1 slabs)`), nil)
	if !strings.Contains(ctrlErr.String(), "leading the ctrls") {
		t.Errorf("the second ctrl's log: %s", ctrlErr.String())
	}
	_, slabs, err := ctrl.NewClient(addr, fabric.Token(secret), ca).Slabs(bg, sess.ID)
	if err != nil || len(slabs) != 1 || slabs[0].ID != sl.ID || slabs[0].Replicas[0].Server != "11aa" {
		t.Errorf("the slab map from the second ctrl: %+v %v", slabs, err)
	}
}
