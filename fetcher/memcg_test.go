package fetcher

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A program started from a contained thread is born in the run's memory cgroup, the cgroup's
// threshold fires when the program's memory crosses it, and the cgroup is gone after the run.
func TestArmWatchSeesTheProgramCross(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a memory cgroup needs root")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	runtime.LockOSThread() // the test's goroutine ends with its thread, which is then in no cgroup of ours
	const threshold = 32 << 20
	w, err := newArmWatch(threshold)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("no cgroup v1 memory controller:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if !w.below() {
		t.Fatalf("a new cgroup is not below a %d MiB threshold", threshold>>20)
	}
	// Holds 48 MiB it wrote (a bytes object of ones, so every page is touched) until stdin closes.
	cmd := exec.Command("python3", "-c", "import sys; b = b'\\x01' * (48 << 20); print('ok', flush=True); sys.stdin.read()")
	stdin, _ := cmd.StdinPipe()
	stdout, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer stdin.Close()
	if err := w.leave(unix.Gettid()); err != nil {
		t.Fatalf("farmem's thread could not leave the run's cgroup: %v", err)
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", cmd.Process.Pid))
	if !strings.Contains(string(cg), "/"+filepath.Base(w.dir)+"\n") {
		t.Fatalf("the program was not born in the run's cgroup %s:\n%s", w.dir, cg)
	}
	var ok [3]byte
	if _, err := stdout.Read(ok[:]); err != nil {
		t.Fatalf("the program did not fill its memory: %v", err)
	}
	select {
	case <-w.crossed:
	case <-time.After(10 * time.Second):
		t.Fatalf("no threshold event 10 s after the program wrote 48 MiB (threshold %d MiB)", threshold>>20)
	}
	if w.below() {
		t.Fatalf("the cgroup holding a 48 MiB program reads below %d MiB", threshold>>20)
	}
	stdin.Close()
	cmd.Wait()
	w.close()
	if _, err := os.Stat(w.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the run's cgroup %s is left behind after the program ended: %v", w.dir, err)
	}
}
