package runtime

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// growerEnv makes the test binary the program the watch tests watch (TestUsageWatchGrower).
const growerEnv = "FARMEM_TEST_GROWER"

// Not a test: the program of TestUsageWatchSeesTheProgramCross, run as a child of the test
// binary. For each line N on stdin it maps N MiB more with every page populated by the kernel
// (so a -race build charges no shadow memory for them), keeps them, and says ok.
func TestUsageWatchGrower(t *testing.T) {
	if os.Getenv(growerEnv) == "" {
		t.Skip("the watched program of TestUsageWatchSeesTheProgramCross")
	}
	var keep [][]byte
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		n, err := strconv.Atoi(in.Text())
		if err != nil {
			t.Fatal(err)
		}
		b, err := unix.Mmap(-1, 0, n<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_POPULATE)
		if err != nil {
			t.Fatal(err)
		}
		keep = append(keep, b)
		fmt.Println("ok")
	}
	runtime.KeepAlive(keep)
}

// dirOf is the run's cgroup directory.
func dirOf(w *usageWatch) string {
	switch m := w.memcg.(type) {
	case *memcgV1:
		return m.dir
	case *memcgV2:
		return m.dir
	}
	return ""
}

// A program started from a contained thread is born in the run's memory cgroup, each of the
// cgroup's thresholds fires when the program's memory crosses it, the cgroup's peak is the
// program's, and the cgroup is gone after the run (on v2, with farmem's own cgroup as it was).
func TestUsageWatchSeesTheProgramCross(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a memory cgroup needs root")
	}
	runtime.LockOSThread() // the test's goroutine ends with its thread, which is then in no cgroup of ours
	ownBefore, _ := os.ReadFile("/proc/self/cgroup")
	const low, high = 32 << 20, 96 << 20
	cmd := exec.Command(os.Args[0], "-test.run", "^TestUsageWatchGrower$")
	cmd.Env = append(os.Environ(), growerEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{}
	w, err := newUsageWatch(cmd.SysProcAttr, low, high)
	if errors.Is(err, fs.ErrNotExist) {
		t.Skip("no memory controller:", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	dir := dirOf(w)
	if !w.below(low) {
		t.Fatalf("a new cgroup is not below a %d MiB threshold", low>>20)
	}
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
	if !strings.Contains(string(cg), "/"+filepath.Base(dir)+"\n") {
		t.Fatalf("the program was not born in the run's cgroup %s:\n%s", dir, cg)
	}
	if own, _ := os.ReadFile("/proc/self/cgroup"); strings.Contains(string(own), "/"+filepath.Base(dir)+"\n") {
		t.Fatalf("farmem itself is in the run's cgroup:\n%s", own)
	}
	out := bufio.NewScanner(stdout)
	grow := func(mib int, threshold int64) {
		t.Helper()
		fmt.Fprintln(stdin, mib)
		if !out.Scan() || out.Text() != "ok" {
			t.Fatalf("the program did not write %d MiB more: %q %v", mib, out.Text(), out.Err())
		}
		select {
		case <-w.crossed:
		case <-time.After(10 * time.Second):
			t.Fatalf("no threshold event 10 s after the program wrote %d MiB more (threshold %d MiB)", mib, threshold>>20)
		}
		if w.below(threshold) {
			t.Fatalf("the cgroup reads below %d MiB after the program wrote %d MiB more", threshold>>20, mib)
		}
		if m, ok := w.memcg.(*memcgV2); ok {
			// The level is a limit: once crossed it must be lifted, or the program is throttled.
			if h, err := readInt(filepath.Join(m.dir, "memory.high")); err != nil || h != -1 {
				t.Fatalf("memory.high is %d (%v) after the crossing, not max", h, err)
			}
		}
	}
	grow(48, low)
	if !w.below(high) {
		t.Fatalf("a cgroup holding a 48 MiB program reads above %d MiB", high>>20)
	}
	grow(48, high)
	if p, ok := w.peak(); !ok || p < high {
		t.Fatalf("the cgroup's peak is %d bytes (%v), below the %d MiB the program holds", p, ok, high>>20)
	}
	stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the program: %v", err)
	}
	w.close()
	if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("the run's cgroup %s is left behind after the program ended: %v", dir, err)
	}
	if own, _ := os.ReadFile("/proc/self/cgroup"); string(own) != string(ownBefore) {
		t.Fatalf("farmem's cgroup changed across the run:\n%s\nthen\n%s", ownBefore, own)
	}
	if m, ok := w.memcg.(*memcgV2); ok {
		if left, _ := filepath.Glob(filepath.Join(m.own, "farmem-*")); len(left) > 0 {
			t.Fatalf("cgroups left behind in farmem's: %v", left)
		}
	}
}

// On cgroup v2, farmem does not move processes that are not its own: in a cgroup it shares,
// where it could not enable the memory controller for a child, there is no watch, and the
// error says why and what to do.
func TestUsageWatchRefusesASharedCgroupV2(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("moving processes between cgroups needs root")
	}
	if v, _ := cgroupVersion(); v != 2 {
		t.Skip("cgroup v2 only")
	}
	own, err := ownCgroupV2()
	if err != nil {
		t.Fatal(err)
	}
	if !isRootCgroup(own) {
		t.Skip("needs a test process in the root cgroup, which may make a cgroup with memory for it")
	}
	if !subtreeHasMemory(own) {
		if err := writeCgroup(own, "cgroup.subtree_control", "+memory"); err != nil {
			t.Fatal(err)
		}
	}
	shared := filepath.Join(own, fmt.Sprintf("farmem-test-shared-%d", os.Getpid()))
	if err := os.Mkdir(shared, 0o755); err != nil {
		t.Fatal(err)
	}
	defer unix.Rmdir(shared)
	other := exec.Command("sleep", "60")
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	defer other.Wait()
	defer other.Process.Kill()
	for _, pid := range []int{other.Process.Pid, os.Getpid()} {
		if err := writeCgroup(shared, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			t.Fatal(err)
		}
	}
	defer writeCgroup(own, "cgroup.procs", strconv.Itoa(os.Getpid()))
	w, err := newUsageWatch(&syscall.SysProcAttr{})
	if err == nil {
		w.close()
		t.Fatalf("a watch was made in a cgroup farmem shares with pid %d", other.Process.Pid)
	}
	if !strings.Contains(err.Error(), "holds other processes too ("+strconv.Itoa(other.Process.Pid)+")") {
		t.Fatalf("the error does not name the other process: %v", err)
	}
	if ents, _ := filepath.Glob(filepath.Join(shared, "*", "cgroup.procs")); len(ents) > 0 {
		t.Fatalf("the refused watch left cgroups behind: %v", ents)
	}
	if subtreeHasMemory(shared) {
		t.Fatalf("the refused watch enabled +memory in %s", shared)
	}
}
