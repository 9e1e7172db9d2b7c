package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// outcome is one run, one row of the CSV.
type outcome struct {
	prog   string
	config string // native, zram, farmem, farmem-inject
	capB   int64  // farmem's --local-mem (and the cgroup's limit less the native kernel memory)
	limitB int64  // the zram run's cgroup limit, and the bound a farmem run's cgroup peak is held to
	// sharedB: the program's shared memory (postgres's), which farmem does not cap; asked in
	// the native run, and added to the limit.
	sharedB int64
	wall    float64
	// status: ok, wrong-output, oom-killed, timeout, failed, not-run.
	status string
	exit   int // the exit status (128+N for signal N), -1 if none
	digest string
	peakB  int64
	// peakSrc: cgroup (the kernel's maximum of the run's memory cgroup), sampled (farmem's own
	// samples of the anonymous RSS: no cgroup of the run's own), or empty.
	peakSrc string
	detail  string
}

// result is what running one command gave.
type result struct {
	wall     float64
	exit     int
	timedOut bool
	out      []byte // stdout
	stderr   string // its tail
	err      error  // it could not be started
}

// exitCode is how a shell reports st: the status, or 128+N for signal N.
func exitCode(st *os.ProcessState) int {
	if st == nil {
		return -1
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return st.ExitCode()
}

// tailBuf keeps the last bytes written to it.
type tailBuf struct{ b []byte }

func (t *tailBuf) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > 4096 {
		t.b = t.b[len(t.b)-4096:]
	}
	return len(p), nil
}

// runCmd runs argv to its end or for at most limit, killing its process group then. Its output
// is kept in memory (the programs print a line or their result, which is digested).
func runCmd(argv []string, limit time.Duration) result {
	cmd := exec.Command(argv[0], argv[1:]...)
	var out bytes.Buffer
	var errb tailBuf
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return result{exit: -1, err: err}
	}
	running.Store(int64(cmd.Process.Pid))
	defer running.Store(0)
	done := make(chan struct{})
	timedOut := false
	go func() {
		select {
		case <-done:
		case <-time.After(limit):
			timedOut = true
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
	}()
	cmd.Wait()
	close(done)
	return result{wall: time.Since(t0).Seconds(), exit: exitCode(cmd.ProcessState), timedOut: timedOut,
		out: out.Bytes(), stderr: strings.TrimSpace(string(errb.b))}
}

// digestOf reduces a program's output to its digest.
func digestOf(p *program, out []byte) (string, error) {
	if p.digest != nil {
		m := p.digest.FindSubmatch(out)
		if m == nil {
			return "", fmt.Errorf("no checksum line in its output: %q", tail(string(out), 300))
		}
		return string(m[1]), nil
	}
	if len(out) == 0 {
		return "", errors.New("it printed nothing")
	}
	sum := sha256.Sum256(out)
	return hex.EncodeToString(sum[:8]), nil
}

func tail(s string, n int) string {
	s = strings.TrimSpace(s)
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// oneLine is s on one line, for a CSV field or a table cell.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	return strings.ReplaceAll(s, "|", "/")
}

// runProgram runs p under prefix (nothing natively, linux-swap.sh exec, farmem run ...) in dir
// and fills o's time, status, exit and digest.
func runProgram(p *program, prefix []string, dir string, scale float64, limit time.Duration, o *outcome) {
	if p.server != nil {
		runServer(p, prefix, dir, scale, limit, o)
		return
	}
	argv := append(append([]string{}, prefix...), p.argv(dir, scale)...)
	r := runCmd(argv, limit)
	settle(p, r, o)
}

// settle fills o from r.
func settle(p *program, r result, o *outcome) {
	o.wall, o.exit = r.wall, r.exit
	switch {
	case r.err != nil:
		o.status, o.detail = "failed", r.err.Error()
	case r.timedOut:
		o.status = "timeout"
	case r.exit != 0:
		o.status, o.detail = "failed", fmt.Sprintf("exit %d: %s", r.exit, tail(r.stderr, 300))
	default:
		d, err := digestOf(p, r.out)
		if err != nil {
			o.status, o.detail = "failed", err.Error()
			return
		}
		o.status, o.digest = "ok", d
	}
}

// running is the process group of the run in progress (0: none), which an interrupt kills.
var running atomic.Int64

// tearDownOnSignal makes SIGINT and SIGTERM kill the run in progress and undo the swap setup
// (linux-swap.sh off removes every farmem-swap-* cgroup, the native runs' included) before exiting.
func tearDownOnSignal() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	go func() {
		s := <-c
		if pg := running.Load(); pg > 0 {
			syscall.Kill(-int(pg), syscall.SIGKILL)
		}
		swapCmd("off")
		fmt.Fprintf(os.Stderr, "farmem-reach: %v: stopped, swap and cgroups undone\n", s)
		os.Exit(130)
	}()
}
