package runtime

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

// A program started from a contained thread is born in the run's memory cgroup, each of the
// cgroup's thresholds fires when the program's memory crosses it, and the cgroup is gone after
// the run.
func TestUsageWatchSeesTheProgramCross(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a memory cgroup needs root")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	runtime.LockOSThread() // the test's goroutine ends with its thread, which is then in no cgroup of ours
	const low, high = 32 << 20, 96 << 20
	w, err := newUsageWatch(low, high)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("no cgroup v1 memory controller:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	if !w.below(low) {
		t.Fatalf("a new cgroup is not below a %d MiB threshold", low>>20)
	}
	// For each line N on stdin, writes N MiB more (bytes objects of ones: every page touched),
	// keeps them, and says ok.
	cmd := exec.Command("python3", "-c", "import sys\nkeep = []\nfor n in sys.stdin:\n    keep.append(b'\\x01' * (int(n) << 20))\n    print('ok', flush=True)")
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
	grow := func(mib int, threshold int64) {
		t.Helper()
		fmt.Fprintln(stdin, mib)
		var ok [3]byte
		if _, err := stdout.Read(ok[:]); err != nil {
			t.Fatalf("the program did not write %d MiB more: %v", mib, err)
		}
		select {
		case <-w.crossed:
		case <-time.After(10 * time.Second):
			t.Fatalf("no threshold event 10 s after the program wrote %d MiB more (threshold %d MiB)", mib, threshold>>20)
		}
		if w.below(threshold) {
			t.Fatalf("the cgroup reads below %d MiB after the program wrote %d MiB more", threshold>>20, mib)
		}
	}
	grow(48, low)
	if !w.below(high) {
		t.Fatalf("a cgroup holding a 48 MiB program reads above %d MiB", high>>20)
	}
	grow(48, high)
	stdin.Close()
	cmd.Wait()
	w.close()
	if _, err := os.Stat(w.dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the run's cgroup %s is left behind after the program ended: %v", w.dir, err)
	}
}
