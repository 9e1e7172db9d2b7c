package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
)

// Bad --transport/--shm input: each gets its message, exit 125, nothing started.
func TestTransportBadInput(t *testing.T) {
	dir := t.TempDir()
	tok := writeToken(t, dir, "the-right-cluster-token-0123456789")
	ctl := "127.0.0.1:1" // never dialed: the input is refused first
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--ctrl", ctl, "--token-file", tok, "--transport", "rdma", "--local-mem", "64MiB", "--", "true"}, "the rdma transport is not compiled into this farmem (build with -tags rdma)"},
		{[]string{"run", "--transport", "rdma", "--local-mem", "64MiB", "--", "true"}, "the rdma transport is not compiled into this farmem (build with -tags rdma)"},
		{[]string{"run", "--ctrl", ctl, "--token-file", tok, "--transport", "udp", "--local-mem", "64MiB", "--", "true"}, `--transport "udp": give tcp, shm or rdma`},
		{[]string{"run", "--transport", "shm", "--local-mem", "64MiB", "--", "true"}, "give --ctrl"},
		{[]string{"run", "--ctrl", ctl, "--token-file", tok, "--shm", "/run/x", "--local-mem", "64MiB", "--", "true"}, "--shm DIR applies to --transport shm"},
		{[]string{"run", "--ctrl", ctl, "--token-file", tok, "--transport", "shm", "--shm", "rel", "--local-mem", "64MiB", "--", "true"}, "give an absolute directory"},
		{[]string{"memserver", "--ctrl", ctl, "--token-file", tok, "--capacity", "64MiB", "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--shm", "rel"}, "give an absolute directory"},
		{[]string{"run", "--ctrl", ctl, "--token-file", tok, "--spin", "5ms", "--local-mem", "64MiB", "--", "true"}, "--spin 5ms: give 0 to 1ms"},
		{[]string{"run", "--spin", "50us", "--local-mem", "64MiB", "--", "true"}, "give --ctrl"},
		{[]string{"memserver", "--ctrl", ctl, "--token-file", tok, "--capacity", "64MiB", "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--spin", "-1s"}, "--spin -1s: give 0 to 1ms"},
		{[]string{"memserver", "--ctrl", ctl, "--token-file", tok, "--capacity", "64MiB", "--spin", "fast"}, "spin"},
		{[]string{"memserver", "--ctrl", ctl, "--token-file", tok, "--capacity", "64MiB", "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--shm", "/" + strings.Repeat("d", 120)}, "longer than a unix socket allows"},
	} {
		out, err := exec.Command(farmemBin(t), c.args...).CombinedOutput()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
		if code != 125 || !strings.Contains(string(out), c.want) {
			t.Errorf("farmem %s: exit %d, output %q; want exit 125 and %q", strings.Join(c.args, " "), code, out, c.want)
		}
	}
}

// A program paged to a memory server on this host through shared memory: every page it reads
// back is right, the pages went through the server's slabs, and a server without --shm is
// refused by name.
func TestMemserverSHMTransport(t *testing.T) {
	if err := checkUserfaultfd(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	tok := writeToken(t, dir, "the-right-cluster-token-0123456789")
	shmDir := filepath.Join(dir, "shm")
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	start := func(name string, args ...string) (*exec.Cmd, *bytes.Buffer) {
		return startLogged(t, name, append([]string{farmemBin(t)}, args...)...)
	}
	start("ctrl", "ctrl", "--listen", addr, "--state", filepath.Join(dir, "ctrl"), "--token-file", tok, "--slab-size", "4MiB")
	dialRetry(t, mustPort(t, addr)).Close()
	tk, err := fabric.LoadToken(tok)
	if err != nil {
		t.Fatal(err)
	}
	status := func() ctrl.Status {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, _ := ctrl.NewClient(addr, tk, nil).Status(ctx)
		return st
	}
	waitFor := func(what string, ok func(ctrl.Status) bool) {
		for deadline := time.Now().Add(30 * time.Second); !ok(status()); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("never: %s: %+v", what, status())
			}
		}
	}
	healthy := func(addr string) func(ctrl.Status) bool {
		return func(st ctrl.Status) bool {
			for _, s := range st.Servers {
				if s.Addr == addr && s.Healthy {
					return true
				}
			}
			return false
		}
	}
	// A local memory server without --shm: --transport shm names what is missing.
	plain := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ps, _ := start("plain memserver", "memserver", "--listen", plain, "--capacity", "64MiB", "--ctrl", addr, "--token-file", tok)
	waitFor("the plain memory server up", healthy(plain))
	out, err := exec.Command(farmemBin(t), "run", "--ctrl", addr, "--token-file", tok, "--transport", "shm", "--shm", shmDir,
		"--local-mem", "16MiB", "--", "true").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "start it with --shm "+shmDir) {
		t.Fatalf("--transport shm to a memory server without --shm: %v: %s", err, out)
	}
	ps.Process.Kill()
	ps.Wait()
	waitFor("the plain memory server counted dead", func(st ctrl.Status) bool { return st.Servers != nil && !healthy(plain)(st) })

	mem := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	start("shm memserver", "memserver", "--listen", mem, "--capacity", "256MiB", "--ctrl", addr, "--token-file", tok, "--shm", shmDir, "--spin", "50us")
	waitFor("the shm memory server up", healthy(mem))
	args, summary := summarized(t, []string{"run", "--ctrl", addr, "--token-file", tok, "--transport", "shm", "--shm", shmDir,
		"--local-mem", "16MiB", "--", filepath.Join(binDir, "micro"), "--mib", "64", "--pattern", "random", "--passes", "2"})
	cmd := exec.Command(farmemBin(t), args...)
	out, err = cmd.CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !strings.Contains(string(out), "micro: OK bad=0") {
		t.Fatalf("micro under farmem --transport shm: %v", err)
	}
	if !strings.Contains(string(out), "memory server "+mem+" is on this host: shared memory through "+shmSocket(shmDir, mem)) {
		t.Fatalf("the run did not use shared memory for %s", mem)
	}
	if summary().Faults["backend"].Count == 0 {
		t.Fatalf("micro never faulted a page back from the memory server")
	}
	if _, err := os.Stat(shmSocket(shmDir, mem)); err != nil {
		t.Fatalf("the memory server's socket: %v", err)
	}

	// The same server over tcp, both ends polling (--spin).
	out, err = exec.Command(farmemBin(t), "run", "--ctrl", addr, "--token-file", tok, "--spin", "50us",
		"--local-mem", "16MiB", "--", filepath.Join(binDir, "micro"), "--mib", "64", "--pattern", "random", "--passes", "1").CombinedOutput()
	t.Logf("%s", out)
	if err != nil || !strings.Contains(string(out), "micro: OK bad=0") || strings.Contains(string(out), "shared memory") {
		t.Fatalf("micro under farmem --spin 50us over tcp: %v", err)
	}
}
