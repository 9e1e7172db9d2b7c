package main

// End-to-end tests of `farmem attach` (launcher/attach.go) on real running processes: the C
// program testdata/attachee.c holds data it verifies page by page, forks children that verify
// their copies, and rewrites pages while farmem pages them, attached to, detached from, or with
// farmem killed under it.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/farmem/farmem/launcher"
)

// attachee is testdata/attachee.c running, spoken to through its stdin and stdout.
type attachee struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// attacheeBin builds testdata/attachee.c and returns its path.
func attacheeBin(t *testing.T) string {
	t.Helper()
	out := testProgram(t, t.TempDir(), "attachee")
	return out
}

// startAttachee starts the attachee with args and waits until its data is filled.
func startAttachee(t *testing.T, bin string, args ...string) *attachee {
	t.Helper()
	return startAttacheeCmd(t, exec.Command(bin, args...))
}

// startAttacheeCmd starts cmd, an attachee or a command that runs one (farmem run), and waits
// until its data is filled.
func startAttacheeCmd(t *testing.T, cmd *exec.Cmd) *attachee {
	t.Helper()
	a := &attachee{cmd: cmd, lines: make(chan string, 64)}
	var err error
	if a.in, err = a.cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	out, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if a.cmd.Stderr == nil {
		a.cmd.Stderr = os.Stderr
	}
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			a.lines <- sc.Text()
		}
		close(a.lines)
	}()
	t.Cleanup(func() { a.cmd.Process.Kill(); a.cmd.Wait() })
	if l := a.next(t); l != "ready" {
		t.Fatalf("attachee said %q, not ready", l)
	}
	return a
}

// next returns the attachee's next line, failing the test if none comes within a while.
func (a *attachee) next(t *testing.T) string {
	t.Helper()
	select {
	case l, ok := <-a.lines:
		if !ok {
			t.Fatalf("attachee %d ended its output (killed, or found a wrong page)", a.cmd.Process.Pid)
		}
		return l
	case <-time.After(60 * time.Second):
		t.Fatalf("attachee %d said nothing for a minute", a.cmd.Process.Pid)
	}
	return ""
}

// check has the attachee verify every page; it returns its sum and its forks and bad counts.
func (a *attachee) check(t *testing.T) (sum string, forks, bad int) {
	t.Helper()
	fmt.Fprintln(a.in, "check")
	l := a.next(t)
	if _, err := fmt.Sscanf(l, "ok %s forks %d bad %d", &sum, &forks, &bad); err != nil {
		t.Fatalf("attachee answered %q to check", l)
	}
	return sum, forks, bad
}

func (a *attachee) write(t *testing.T) {
	t.Helper()
	fmt.Fprintln(a.in, "write")
	if l := a.next(t); l != "written" {
		t.Fatalf("attachee answered %q to write", l)
	}
}

// exit has the attachee exit and checks that it exits 0.
func (a *attachee) exit(t *testing.T) {
	t.Helper()
	fmt.Fprintln(a.in, "exit")
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("attachee after farmem: %v", err)
	}
}

// syncBuffer is stderr shared by farmem's copying goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// attachTo starts farmem attach on pid with cap and flags and waits until it is in.
func attachTo(t *testing.T, pid int, capSize string, flags ...string) (*exec.Cmd, *syncBuffer) {
	t.Helper()
	args := append([]string{"attach", "--local-mem", capSize}, flags...)
	cmd := exec.Command(farmemBin(t), append(args, strconv.Itoa(pid))...)
	stderr := &syncBuffer{}
	cmd.Stderr = stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for end := time.Now().Add(20 * time.Second); !strings.Contains(stderr.String(), "farmem: attached to"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) || cmd.ProcessState != nil {
			t.Fatalf("farmem attach did not attach within 20 s:\n%s", stderr)
		}
	}
	return cmd, stderr
}

// detach sends farmem SIGINT and checks that it detached and exited 0.
func detach(t *testing.T, cmd *exec.Cmd, stderr *syncBuffer) {
	t.Helper()
	cmd.Process.Signal(syscall.SIGINT)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil || !strings.Contains(stderr.String(), "farmem: detached from") {
			t.Fatalf("farmem attach after SIGINT: %v\n%s", err, stderr)
		}
	case <-time.After(60 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("farmem attach did not detach within a minute:\n%s", stderr)
	}
}

// waitRSSBelow waits until pid's anonymous memory is below limit (farmem, attached by cmd,
// evicted what was over the cap). If it does not get there, the test prints farmem's output and
// the stacks of its goroutines (SIGQUIT), to say where eviction stands.
func waitRSSBelow(t *testing.T, pid int, limit int64, cmd *exec.Cmd, stderr *syncBuffer) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); rssAnon(pid) >= limit; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			held := rssAnon(pid)
			cmd.Process.Signal(syscall.SIGQUIT)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
			}
			t.Fatalf("process %d still holds %d MiB, over %d MiB, 20 s after farmem attached; farmem's output and stacks:\n%s", pid, held>>20, limit>>20, stderr)
		}
	}
}

// mappings returns pid's mappings, one "start-end perms" a line.
func mappings(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(l)
		out = append(out, f[0]+" "+f[1])
	}
	return strings.Join(out, "\n")
}

// checkNothingLeft checks that farmem left nothing in pid: no userfaultfd, no registered range,
// no tracer, the mappings it had before farmem came.
func checkNothingLeft(t *testing.T, pid int, mapsBefore string) {
	t.Helper()
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); strings.Contains(l, "userfaultfd") {
			t.Errorf("process %d still holds a userfaultfd (fd %s) after the detach", pid, fd.Name())
		}
	}
	smaps, _ := os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid))
	for _, l := range strings.Split(string(smaps), "\n") {
		if strings.HasPrefix(l, "VmFlags:") && strings.Contains(l+" ", " um ") {
			t.Errorf("process %d still has a range registered with a userfaultfd after the detach", pid)
			break
		}
	}
	status, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if !strings.Contains(string(status), "TracerPid:\t0\n") {
		t.Errorf("process %d is still traced after the detach", pid)
	}
	if after := mappings(t, pid); after != mapsBefore {
		t.Errorf("process %d's mappings after the detach differ from before farmem (the agent's or its staging area left?):\nbefore:\n%s\nafter:\n%s", pid, mapsBefore, after)
	}
}

// A running process holding 64 MiB, attached at a 16 MiB cap: most of it is evicted, every page
// reads back right while attached (the program's own check, and a sum equal to a native twin's
// doing the same), and after the detach it has every page back, nothing of farmem's, runs on,
// and exits 0.
func TestAttachDetach(t *testing.T) {
	bin := attacheeBin(t)
	twin := startAttachee(t, bin, "64") // the same steps without farmem
	a := startAttachee(t, bin, "64")
	pid := a.cmd.Process.Pid
	sum0, _, _ := a.check(t)
	mapsBefore := mappings(t, pid)

	summary := filepath.Join(t.TempDir(), "summary.json")
	cmd, stderr := attachTo(t, pid, "16MiB", "--summary-json", summary)
	waitRSSBelow(t, pid, 32<<20, cmd, stderr)
	var want []string
	for i := 0; i < 2; i++ {
		s, _, _ := twin.check(t)
		want = append(want, s)
		twin.write(t)
	}
	if sum, _, _ := a.check(t); sum != sum0 || sum != want[0] {
		t.Fatalf("attached: sum %s, before farmem %s, native %s", sum, sum0, want[0])
	}
	a.write(t)
	if sum, _, _ := a.check(t); sum != want[1] {
		t.Fatalf("attached, after a write: sum %s, native %s", sum, want[1])
	}
	a.write(t)
	waitRSSBelow(t, pid, 32<<20, cmd, stderr) // evicted again before the detach

	detach(t, cmd, stderr)
	if got := rssAnon(pid); got < 60<<20 {
		t.Errorf("after the detach the process holds %d MiB of its 64: its pages are not back", got>>20)
	}
	checkNothingLeft(t, pid, mapsBefore)
	// The summary is of the time attached: what the process had as farmem came in, and the
	// detach's reads apart from the process's faults.
	var js launcher.Summary
	if b, err := os.ReadFile(summary); err != nil || json.Unmarshal(b, &js) != nil {
		t.Fatalf("summary: %v", err)
	}
	if !js.Attached || js.AttachedAtBytes < 64<<20 || js.BroughtBackPages < (64-32)<<20/4096 {
		t.Errorf("summary: attached %v at %d MiB, %d pages brought back; want attached at 64 MiB or more, at least %d pages back",
			js.Attached, js.AttachedAtBytes>>20, js.BroughtBackPages, (64-32)<<20/4096)
	}
	if strings.Contains(stderr.String(), "over the cap:") {
		t.Errorf("the summary says the process went over the cap, though it was over it only as farmem came in:\n%s", stderr)
	}
	s, _, _ := twin.check(t)
	if sum, _, _ := a.check(t); sum != s {
		t.Fatalf("detached: sum %s, native %s", sum, s)
	}
	a.write(t)
	twin.write(t)
	s, _, _ = twin.check(t)
	if sum, _, _ := a.check(t); sum != s {
		t.Fatalf("detached, after a write: sum %s, native %s", sum, s)
	}
	a.exit(t)
	twin.exit(t)
}

// Attached while two threads fork children again and again (taking turns: a third rewrites pages
// meanwhile, and a fork must not copy a page half rewritten) and the main thread is blocked in a
// read: farmem freezes them wherever they are, finds each child through its FORK event, tells
// which event is whose, and enters it; every child verifies its copy of the data (and rewrites
// some of it), and none finds a wrong page, attached or after the detach.
func TestAttachForkingThreads(t *testing.T) {
	attachForking(t, "16MiB", exec.Command(attacheeBin(t), "32", "2", "1"))
}

// The same with a cap the process fits in: nothing is evicted, but every fork child is still
// found, told its own FORK event, entered, served and let go at the detach.
func TestAttachForkChildrenEntered(t *testing.T) {
	attachForking(t, "96MiB", exec.Command(attacheeBin(t), "32", "2", "1"))
}

// attachForking attaches to the attachee cmd starts, with forking threads and a churning one.
func attachForking(t *testing.T, capSize string, cmd *exec.Cmd) {
	a := startAttacheeCmd(t, cmd)
	pid := a.cmd.Process.Pid
	time.Sleep(100 * time.Millisecond) // forking well under way
	summary := filepath.Join(t.TempDir(), "summary.json")
	farmem, stderr := attachTo(t, pid, capSize, "--summary-json", summary)
	_, forks0, _ := a.check(t)
	for end := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, forks, bad := a.check(t)
		if bad != 0 {
			t.Fatalf("%d of the attachee's children or rewrites found a wrong page while attached\n%s", bad, stderr)
		}
		if forks >= forks0+20 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the attachee forked %d times in 30 s attached", forks-forks0)
		}
	}
	detach(t, farmem, stderr)
	if strings.Contains(stderr.String(), "could not be entered") {
		t.Errorf("farmem could not enter a fork child:\n%s", stderr)
	}
	var s launcher.Summary
	if b, err := os.ReadFile(summary); err != nil || json.Unmarshal(b, &s) != nil {
		t.Fatalf("summary: %v", err)
	}
	if s.Processes < 5 {
		t.Errorf("farmem served %d processes: the fork children were not served", s.Processes)
	}
	_, forks1, _ := a.check(t)
	time.Sleep(300 * time.Millisecond)
	if _, forks, bad := a.check(t); bad != 0 || forks == forks1 {
		t.Fatalf("after the detach: %d forks since, %d wrong\n%s", forks-forks1, bad, stderr)
	}
	a.exit(t)
}

// Detached while two threads fault pages back in and rewrite them as fast as they can, with
// eviction batches and re-faults in flight: the detach waits for them, and no page is wrong.
func TestAttachDetachInFlight(t *testing.T) {
	bin := attacheeBin(t)
	a := startAttachee(t, bin, "48", "0", "2")
	pid := a.cmd.Process.Pid
	mapsBefore := mappings(t, pid)
	cmd, stderr := attachTo(t, pid, "16MiB")
	time.Sleep(500 * time.Millisecond) // paging hard
	if !strings.Contains(string(must(os.ReadFile(fmt.Sprintf("/proc/%d/smaps", pid)))), " um") {
		t.Fatal("nothing registered while attached")
	}
	detach(t, cmd, stderr)
	if _, _, bad := a.check(t); bad != 0 {
		t.Fatalf("%d pages were wrong for the rewriting threads across the detach", bad)
	}
	checkNothingLeft(t, pid, mapsBefore)
	a.exit(t)
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// farmem SIGKILLed while attached: the process is killed with it (its lifeline), never left to
// read zeros where its evicted pages were.
func TestAttachFarmemKilled(t *testing.T) {
	bin := attacheeBin(t)
	a := startAttachee(t, bin, "48", "0", "1")
	pid := a.cmd.Process.Pid
	cmd, stderr := attachTo(t, pid, "16MiB")
	waitRSSBelow(t, pid, 32<<20, cmd, stderr)
	cmd.Process.Kill()
	cmd.Wait()
	fmt.Fprintln(a.in, "check") // a wrong page would say BAD and exit 1
	done := make(chan error, 1)
	go func() { done <- a.cmd.Wait() }()
	select {
	case err := <-done:
		if ws, ok := a.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
			t.Fatalf("the attachee ended (%v) once farmem died, and was not killed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the attachee still runs 10 s after farmem died")
	}
	for l := range a.lines {
		if strings.HasPrefix(l, "BAD") {
			t.Fatalf("the attachee read a wrong page once farmem died: %s", l)
		}
	}
}

// Each bad attach gets one line and exit status 125, and leaves the process as it was.
func TestAttachBadInput(t *testing.T) {
	bin := attacheeBin(t)
	a := startAttachee(t, bin, "16")
	pid := strconv.Itoa(a.cmd.Process.Pid)
	sum0, _, _ := a.check(t)

	gone := exec.Command("true")
	gone.Run()
	zombie := exec.Command("true") // exits, and is not reaped until the test ends
	zombie.Start()
	t.Cleanup(func() { zombie.Wait() })
	for !exitsWithin(zombie.Process.Pid, 0) {
		time.Sleep(10 * time.Millisecond)
	}

	held, heldErr := attachTo(t, a.cmd.Process.Pid, "16MiB")
	cases := []struct {
		args []string
		want string
		cred bool // run as nobody
	}{
		{[]string{pid}, "--local-mem SIZE is required", false},
		{[]string{"--local-mem", "12XB", pid}, "--local-mem", false},
		{[]string{"--local-mem", "8MiB", pid}, "below the minimum", false},
		{[]string{"--local-mem", "16MiB"}, "give one process id", false},
		{[]string{"--local-mem", "16MiB", pid, pid}, "give one process id", false},
		{[]string{"--local-mem", "16MiB", "abc"}, `"abc" is not a process id`, false},
		{[]string{"--local-mem", "16MiB", "0"}, `"0" is not a process id`, false},
		{[]string{"--local-mem", "16MiB", strconv.Itoa(gone.Process.Pid)}, fmt.Sprintf("no process %d", gone.Process.Pid), false},
		{[]string{"--local-mem", "16MiB", strconv.Itoa(zombie.Process.Pid)}, fmt.Sprintf("process %d has exited", zombie.Process.Pid), false},
		{[]string{"--local-mem", "16MiB", pid}, "is already under farmem", false},
		{[]string{"--local-mem", "16MiB", strconv.Itoa(os.Getpid())}, "not permitted to ptrace process", true},
	}
	for _, c := range cases {
		cmd := exec.Command(farmemBin(t), append([]string{"attach"}, c.args...)...)
		if c.cred {
			cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if cmd.ProcessState == nil || cmd.ProcessState.ExitCode() != 125 || len(lines) != 1 || !strings.Contains(lines[0], c.want) || !strings.HasPrefix(lines[0], "farmem: ") {
			t.Errorf("farmem attach %s: %v, want exit 125 and one line with %q; got:\n%s", strings.Join(c.args, " "), err, c.want, out.String())
		}
	}
	detach(t, held, heldErr)
	if sum, _, _ := a.check(t); sum != sum0 {
		t.Fatalf("after the refused attaches and a detach: sum %s, before %s", sum, sum0)
	}
	a.exit(t)
}

// farmem attach --help says what it does, how to detach and what it exits with.
func TestAttachHelp(t *testing.T) {
	out, code := runApp("attach", "--help")
	for _, w := range []string{"farmem attach - cap a process that is already running", "--local-mem", "SIGINT, SIGTERM or SIGHUP detaches", "exits 0", "ptrace_scope"} {
		if code != 0 || !strings.Contains(out, w) {
			t.Errorf("farmem attach --help (exit %d): no %q in:\n%s", code, w, out)
		}
	}
	if out, _ := runApp("help"); !strings.Contains(out, "\n   attach ") {
		t.Errorf("farmem help does not list attach:\n%s", out)
	}
}

// farmem attach runs until the process exits, and then exits 0 by itself.
func TestAttachUntilExit(t *testing.T) {
	bin := attacheeBin(t)
	a := startAttachee(t, bin, "24")
	sum0, _, _ := a.check(t)
	cmd, stderr := attachTo(t, a.cmd.Process.Pid, "16MiB")
	if sum, _, _ := a.check(t); sum != sum0 {
		t.Fatalf("attached: sum %s, before %s", sum, sum0)
	}
	a.exit(t)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("farmem attach once the process exited: %v\n%s", err, stderr)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("farmem attach still runs 10 s after the process exited:\n%s", stderr)
	}
}
