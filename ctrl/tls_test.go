package ctrl_test

// The API over TLS, on a real listener: farmem's client, real curl, and a replayed connection.

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
)

type tlsCtrl struct {
	addr   string // 127.0.0.1:PORT
	caPath string
	log    *syncBuf
}

// startTLSCtrl makes a cluster CA and a certificate for 127.0.0.1 as farmem cert does, and
// serves a ctrl over TLS with them.
func startTLSCtrl(t *testing.T) *tlsCtrl {
	t.Helper()
	dir := t.TempDir()
	ca, key, made, err := ctrl.EnsureCA(dir)
	if err != nil || !made {
		t.Fatalf("EnsureCA: made %v %v", made, err)
	}
	if _, err := ctrl.IssueCert(dir, "ctrl", []string{"127.0.0.1", "localhost"}, ca, key); err != nil {
		t.Fatal(err)
	}
	certPath, keyPath := ctrl.CertFiles(dir, "ctrl")
	tlsCfg, err := ctrl.ServerTLS(certPath, keyPath)
	if err != nil {
		t.Fatal(err)
	}
	store, err := ctrl.OpenFileStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	log := &syncBuf{}
	svc, err := ctrl.NewService(ctrl.ServiceConfig{Config: ctrl.Config{Token: token, SlabPages: 256}, Store: store,
		Logf: func(f string, a ...any) { log.printf(f+"\n", a...) }})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.Serve(ctx, tls.NewListener(ln, tlsCfg)) }()
	t.Cleanup(func() { cancel(); <-done; store.Close() })
	return &tlsCtrl{addr: ln.Addr().String(), caPath: dir + "/ca.pem", log: log}
}

func (tc *tlsCtrl) client(t *testing.T, addr string, tok fabric.Token) *ctrl.Client {
	t.Helper()
	pool, err := ctrl.LoadCA(tc.caPath)
	if err != nil {
		t.Fatal(err)
	}
	return ctrl.NewClient(addr, tok, pool)
}

func TestCtrlTLS(t *testing.T) {
	ctx := context.Background()
	tc := startTLSCtrl(t)
	cl := tc.client(t, tc.addr, token)
	if _, err := cl.ServerHeartbeat(ctx, report("a", 7070)); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.OpenSession(ctx, "over tls"); err != nil {
		t.Fatal(err)
	}
	if _, err := tc.client(t, "https://localhost:"+strings.Split(tc.addr, ":")[1], token).Status(ctx); err != nil {
		t.Errorf("by the certificate's DNS name: %v", err)
	}

	// In clear to the TLS port: the message says to give the CA.
	_, err := ctrl.NewClient(tc.addr, token, nil).Status(ctx)
	if !errors.Is(err, ctrl.ErrBadRequest) || !strings.Contains(err.Error(), "it serves TLS: give --ca FILE") {
		t.Errorf("a client in clear: %v", err)
	}
	// A certificate from another CA is not the ctrl's.
	other := t.TempDir()
	ctrl.EnsureCA(other)
	pool, _ := ctrl.LoadCA(other + "/ca.pem")
	_, err = ctrl.NewClient(tc.addr, token, pool).Status(ctx)
	if err == nil || !strings.Contains(err.Error(), "certificate signed by unknown authority") {
		t.Errorf("a client trusting another CA: %v", err)
	}
	// The wrong token over TLS is still refused.
	if _, err := tc.client(t, tc.addr, fabric.Token("another-token-of-32-bytes-length")).Status(ctx); !errors.Is(err, ctrl.ErrUnauthorized) {
		t.Errorf("the wrong token over TLS: %v", err)
	}
	// A certificate that does not name the address dialed.
	if _, err := tc.client(t, "https://127.0.0.2:"+strings.Split(tc.addr, ":")[1], token).Status(ctx); err == nil {
		t.Errorf("a certificate for 127.0.0.1 accepted for 127.0.0.2")
	}

	// Real curl, as the README says.
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("this test runs curl (apt-get install curl)")
	}
	curl := func(args ...string) (int, []byte) {
		out, err := exec.Command("curl", append([]string{"-sS", "-o", "-", "-w", "\n%{http_code}", "--cacert", tc.caPath}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("curl %v: %v: %s", args, err, out)
		}
		i := bytes.LastIndexByte(out, '\n')
		var code int
		json.Unmarshal(out[i+1:], &code)
		return code, out[:i]
	}
	code, body := curl("-H", "Authorization: Bearer "+string(token), "https://"+tc.addr+"/v1/status")
	var st ctrl.Status
	if err := json.Unmarshal(body, &st); code != 200 || err != nil || st.Totals.Servers != 1 || st.Totals.Sessions != 1 {
		t.Errorf("curl status: %d %v %s", code, err, body)
	}
	if code, body := curl("https://" + tc.addr + "/v1/status"); code != 401 || !strings.Contains(string(body), "no Authorization: Bearer header") {
		t.Errorf("curl without the token: %d %s", code, body)
	}
	code, body = curl("-X", "POST", "-H", "Authorization: Bearer "+string(token), "-d", `{"name":"from curl"}`, "https://"+tc.addr+"/v1/sessions")
	if code != 200 || !strings.Contains(string(body), `"session"`) {
		t.Errorf("curl opening a session: %d %s", code, body)
	}
}

// recorder is a TCP proxy that keeps what the client sent.
type recorder struct {
	ln   net.Listener
	mu   sync.Mutex
	sent bytes.Buffer // client → server bytes of every connection; guarded by mu
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sent.Write(p)
}

func record(t *testing.T, to string) *recorder {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", to)
			if err != nil {
				c.Close()
				continue
			}
			go func() { io.Copy(io.MultiWriter(s, r), c); s.Close() }()
			go func() { io.Copy(c, s); c.Close() }()
		}
	}()
	return r
}

// Replaying a captured request — every byte the client sent, on a new connection — opens no
// session: the ctrl's new handshake derives new keys, so the recorded Finished and the request
// under the old keys fail to decrypt, and nothing reaches the handler.
func TestCtrlTLSRefusesReplay(t *testing.T) {
	ctx := context.Background()
	tc := startTLSCtrl(t)
	rec := record(t, tc.addr)
	_, port, _ := net.SplitHostPort(rec.ln.Addr().String())
	cl := tc.client(t, "https://127.0.0.1:"+port, token)
	if _, err := cl.OpenSession(ctx, "the original"); err != nil {
		t.Fatal(err)
	}
	rec.mu.Lock()
	captured := bytes.Clone(rec.sent.Bytes())
	rec.mu.Unlock()
	if bytes.Contains(captured, []byte("the original")) || bytes.Contains(captured, token) {
		t.Fatalf("the request crossed the wire in clear")
	}
	for range 3 {
		c, err := net.Dial("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(captured)
		c.SetReadDeadline(time.Now().Add(10 * time.Second)) // a hang guard: the ctrl closes at once
		io.Copy(io.Discard, c)
		c.Close()
	}
	st, err := tc.client(t, tc.addr, token).Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.Totals.Sessions != 1 {
		t.Errorf("%d sessions after replaying the request that opened one three times, want 1", st.Totals.Sessions)
	}
	if !strings.Contains(tc.log.String(), "TLS handshake error") {
		t.Errorf("the replays are not in the ctrl's log: %q", tc.log.String())
	}
}
