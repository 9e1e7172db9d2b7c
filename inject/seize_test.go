package inject

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// sleeper is the helper of the Seize tests: a running Go program (several threads), which says
// ready, sleeps in a system call, and says how long it slept before it exits 0.
func sleeper() {
	fmt.Println("ready")
	start := time.Now()
	time.Sleep(400 * time.Millisecond)
	fmt.Printf("slept %v\n", time.Since(start) >= 400*time.Millisecond)
	os.Exit(0)
}

// Seize stops every thread of a running program where it is; a system call made in it there
// runs, and once let go the program goes on as before: its sleep, interrupted, is restarted.
func TestSeizeRunningProgram(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=sleeper")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	r := bufio.NewReader(out)
	if l, _ := r.ReadString('\n'); l != "ready\n" {
		t.Fatalf("the sleeper said %q", l)
	}
	pid := cmd.Process.Pid
	g, err := Seize(pid)
	if err != nil {
		t.Fatal(err)
	}
	tids, _ := threadsOf(pid)
	if len(tids) < 2 {
		t.Fatalf("the sleeper has %d threads: a Go program has several", len(tids))
	}
	for _, tid := range tids {
		st, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/stat", pid, tid))
		if i := strings.LastIndexByte(string(st), ')'); i < 0 || st[i+2] != 't' {
			t.Errorf("thread %d of the seized sleeper is not stopped: %s", tid, st)
		}
	}
	got, err := g.Leader().Syscall(unix.SYS_GETPID)
	if err != nil || int(got) != pid {
		t.Fatalf("getpid in the seized sleeper: %d, %v; want %d", got, err, pid)
	}
	if err := g.Detach(); err != nil {
		t.Fatal(err)
	}
	if l, _ := r.ReadString('\n'); l != "slept true\n" {
		t.Fatalf("the sleeper, let go, said %q", l)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the sleeper, let go: %v", err)
	}
}

// Seize of a process that does not exist says so.
func TestSeizeGone(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command("true")
	cmd.Run()
	if _, err := Seize(cmd.Process.Pid); err == nil {
		t.Fatal("seized a process that has exited")
	}
}
