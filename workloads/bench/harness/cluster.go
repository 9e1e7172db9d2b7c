package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// cluster is a farmem ctrl and one memory server on this host, for the farmem-tcp and
// farmem-shm configurations: the server listens on tcp and, with --shm, on a unix socket
// through which a client on this host maps its slabs (cmd/farmem/cluster_test.go starts them
// the same way). They live for the whole benchmark; every run is a new client session.
type cluster struct {
	ctrl, token, shm string
	procs            []*exec.Cmd
}

func startCluster(work string) (*cluster, error) {
	dir := filepath.Join(work, "cluster")
	c := &cluster{token: filepath.Join(dir, "token"), shm: filepath.Join(dir, "shm")}
	if err := os.MkdirAll(c.shm, 0o700); err != nil {
		return nil, err
	}
	secret := make([]byte, 32)
	rand.Read(secret)
	if err := os.WriteFile(c.token, []byte(hex.EncodeToString(secret)+"\n"), 0o600); err != nil {
		return nil, err
	}
	cp, err := freePort()
	if err != nil {
		return nil, err
	}
	sp, err := freePort()
	if err != nil {
		return nil, err
	}
	c.ctrl = fmt.Sprintf("127.0.0.1:%d", cp)
	start := func(name string, args ...string) error {
		log, err := os.Create(filepath.Join(dir, name+".log"))
		if err != nil {
			return err
		}
		cmd := exec.Command(farmemBin, args...)
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // a ^C to the harness is the harness's to handle
		if err := cmd.Start(); err != nil {
			return err
		}
		c.procs = append(c.procs, cmd)
		return nil
	}
	// Small slabs (4 MiB, as the cluster tests use): the footprints here are tens of MiB. A
	// long --dead-after: on this loaded 2-core machine the server once missed the default 2 s of
	// heartbeats while the benchmark ran, was declared dead and had to exit.
	if err := start("ctrl", "ctrl", "--listen", c.ctrl, "--state", filepath.Join(dir, "state"), "--token-file", c.token, "--slab-size", "4MiB",
		"--dead-after", "60s"); err != nil {
		return nil, err
	}
	if err := start("memserver", "memserver", "--listen", fmt.Sprintf("127.0.0.1:%d", sp), "--capacity", "4GiB", "--ctrl", c.ctrl,
		"--token-file", c.token, "--shm", c.shm); err != nil {
		c.stop()
		return nil, err
	}
	// Ready when the ctrl reports the server healthy.
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		out, _ := exec.Command(farmemBin, "status", "--ctrl", c.ctrl, "--token-file", c.token).CombinedOutput()
		if strings.Contains(string(out), "1 healthy of 1") {
			return c, nil
		}
		if time.Now().After(deadline) {
			c.stop()
			return nil, fmt.Errorf("the farmem ctrl and memory server did not come up in 20 s (logs in %s): %s", dir, strings.TrimSpace(string(out)))
		}
	}
}

// stop ends the memory server, then the ctrl (SIGTERM, SIGKILL after 5 s).
func (c *cluster) stop() {
	if c == nil {
		return
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			p.Process.Kill()
			<-done
		}
	}
	c.procs = nil
}
