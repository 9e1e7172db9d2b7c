package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/urfave/cli/v2"
)

// What launcher.Run's errors make farmem exit with. The start failures are os.StartProcess's
// own, wrapped as the launcher wraps them.
func TestFailedRunStatus(t *testing.T) {
	dir := t.TempDir()
	noexec := filepath.Join(dir, "noexec")
	os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644)
	startErr := func(path string) error {
		cmd := exec.Command(path)
		err := cmd.Start()
		if err == nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("%s started", path)
		}
		return fmt.Errorf("starting %s: %w", path, err)
	}
	for _, c := range []struct {
		name   string
		status int
		err    error
		want   int
	}{
		{"program vanished", 0, startErr(filepath.Join(dir, "gone")), exitNotFound},
		{"program not executable", 0, startErr(noexec), exitCannotRun},
		{"program is a directory", 0, startErr(dir), exitCannotRun},
		{"internal error", 0, errors.New("writing the preload shim: no space left on device"), exitFailed},
		{"stopped by farmem", 128 + 9, errors.New("the program was stopped: process 7: slab lost"), 137},
		{"stopped after it exited 0", 0, errors.New("the program was stopped: process 8: slab lost"), exitFailed},
		{"trace not written after a failing program", 3, errors.New("--record-faults t: disk full"), 3},
	} {
		if got := failedRunStatus(c.status, c.err); got != c.want {
			t.Errorf("%s: status %d, %v: farmem exits %d, want %d", c.name, c.status, c.err, got, c.want)
		}
	}
}

func TestExitStatusOfErrors(t *testing.T) {
	for _, c := range []struct {
		err  error
		code int
		msg  string
	}{
		{nil, 0, ""},
		{usagef("--evict-heat %d: give 0 to 15", 16), 125, "--evict-heat 16: give 0 to 15"},
		{fmt.Errorf("checking: %w", usagef("bad")), 125, "checking: bad"},
		{programError{"program \"x\" not found", exitNotFound}, 127, "program \"x\" not found"},
		{cli.Exit("", 2), 2, ""}, // the program's status: nothing printed
		{errors.New("cannot listen on :1: permission denied"), 1, "cannot listen on :1: permission denied"},
	} {
		code, msg := exitStatus(c.err)
		if code != c.code || msg != c.msg {
			t.Errorf("exitStatus(%v) = %d, %q; want %d, %q", c.err, code, msg, c.code, c.msg)
		}
	}
}
