package main

// End-to-end tests of `farmem run` on statically linked programs, which farmem enters by
// injecting its agent (launcher/static.go) instead of preloading the shim: a Go program built
// without cgo and a C program built with musl, both built here from testdata.

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

// staticGo builds testdata/staticfill with CGO_ENABLED=0 and returns its path.
func staticGo(t *testing.T) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(goruntime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(t.TempDir(), "staticfill-go")
	cmd := exec.Command(gobin, "build", "-o", out, "./testdata/staticfill")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the static Go program: %v\n%s", err, b)
	}
	return out
}

// staticMusl builds testdata/staticfill.c with musl-gcc -static and returns its path; it skips
// the test where musl-gcc is missing (scripts/test-deps.sh installs it).
func staticMusl(t *testing.T) string {
	t.Helper()
	cc, err := exec.LookPath("musl-gcc")
	if err != nil {
		t.Skip("musl-gcc is not installed (Debian's musl-tools; scripts/test-deps.sh installs it): no musl program to test")
	}
	out := filepath.Join(t.TempDir(), "staticfill-musl")
	if b, err := exec.Command(cc, "-static", "-O2", "-o", out, "testdata/staticfill.c").CombinedOutput(); err != nil {
		t.Fatalf("building the musl program: %v\n%s", err, b)
	}
	return out
}

// digestLine returns the line a staticfill prints at its end, failing the test without one.
func digestLine(t *testing.T, out string) string {
	t.Helper()
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "BAD") {
			t.Fatalf("the program found a page that was not its own: %s", l)
		}
		if strings.HasPrefix(l, "staticfill ") {
			return l
		}
	}
	t.Fatalf("no digest in the program's output:\n%s", out)
	return ""
}

// native runs prog with args without farmem and returns its digest line.
func native(t *testing.T, prog string, args ...string) string {
	t.Helper()
	out, err := exec.Command(prog, args...).Output()
	if err != nil {
		t.Fatalf("%s natively: %v", prog, err)
	}
	return digestLine(t, string(out))
}

// checkStaticRun runs prog (128 MiB, 20,000 rewritten pages) under a 32 MiB cap and checks that
// it printed the native digest, that pages went out and came back, that the mapping filter
// handed over its mappings, and that it stayed within the cap.
func checkStaticRun(t *testing.T, prog string) {
	const capMiB = 32
	args := []string{"128", "20000"}
	want := native(t, prog, args...)
	out, s, peaks, err := runSampled(t, append([]string{"run", "--local-mem", fmt.Sprintf("%dMiB", capMiB), "--", prog}, args...)...)
	if err != nil {
		t.Fatalf("under farmem: %v", err)
	}
	if got := digestLine(t, out); got != want {
		t.Fatalf("under farmem the program printed\n%s\nnatively\n%s", got, want)
	}
	if s.Evicted.Written == 0 || s.Faults["backend"].Count == 0 {
		t.Fatalf("the program was never paged: %d pages written out, %d read back", s.Evicted.Written, s.Faults["backend"].Count)
	}
	checkSeen(t, s)
	checkCap(t, s, peaks, capMiB<<20)
}

func TestStaticGoProgram(t *testing.T) { checkStaticRun(t, staticGo(t)) }

func TestStaticMuslProgram(t *testing.T) { checkStaticRun(t, staticMusl(t)) }

// A static program arming mid-run (its filter was installed at its start, letting everything
// through until then) is paged as well.
func TestStaticArmsMidRun(t *testing.T) {
	prog := staticGo(t)
	args := []string{"160", "20000"}
	want := native(t, prog, args...)
	out, s, peaks, err := runSampled(t, append([]string{"run", "--local-mem", "64MiB", "--", prog}, args...)...)
	if err != nil {
		t.Fatalf("under farmem: %v", err)
	}
	if got := digestLine(t, out); got != want {
		t.Fatalf("under farmem the program printed\n%s\nnatively\n%s", got, want)
	}
	if s.ArmedAtBytes == 0 || s.Evicted.Written == 0 {
		t.Fatalf("the run did not arm mid-run and page (armed at %d bytes, %d pages written)", s.ArmedAtBytes, s.Evicted.Written)
	}
	checkCap(t, s, peaks, 64<<20)
}

// A static program's fork child is served: farmem stops it at its birth and puts its agent in,
// and it reads back the pages its parent had evicted (it checks each and prints the digest);
// its vfork-style spawns (one mm) work as well.
func TestStaticFork(t *testing.T) {
	prog := staticMusl(t)
	args := []string{"64", "1000", "fork"}
	want := native(t, prog, args...)
	out, s, peaks, err := runSampled(t, append([]string{"run", "--local-mem", "32MiB", "--", prog}, args...)...)
	if err != nil {
		t.Fatalf("under farmem: %v", err)
	}
	for _, line := range []string{"child: " + want, "fork: child exit 0", "posix_spawn: exit 0", want} {
		if !strings.Contains(out, line+"\n") {
			t.Errorf("the program did not print %q:\n%s", line, out)
		}
	}
	if s.Processes < 2 || s.Evicted.Written == 0 {
		t.Errorf("farmem served %d processes and wrote out %d pages: the child was not served after paging", s.Processes, s.Evicted.Written)
	}
	if b, ok := cgroupPeak(t, s, 32<<20); ok && b > 32<<20+capSlack {
		t.Errorf("the run's memory cgroup peaked at %.1f MiB: more than the cap and %d MiB", float64(b)/(1<<20), capSlack>>20)
	}
	_ = peaks // a page parent and child share counts in each one's RssAnon: the cgroup's peak is the check
}

// If farmem dies while a static program's fork child pages, the child dies too (its lifeline),
// and never reads a page that is not its own.
func TestStaticRuntimeDeathStopsForkChild(t *testing.T) {
	prog := staticMusl(t)
	cmd := exec.Command(farmemBin(t), "run", "--local-mem", "16MiB", "--quiet", "--", prog, "64", "1000", "forkspin")
	outFile := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(outFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout = f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var tree []int
	for i := 0; i < 300 && len(tree) < 2; i++ { // the program and its child
		time.Sleep(20 * time.Millisecond)
		tree = descendants(cmd.Process.Pid)
	}
	if len(tree) < 2 {
		cmd.Process.Kill()
		t.Fatalf("no fork child under farmem: %v", tree)
	}
	time.Sleep(500 * time.Millisecond) // the child is paging
	cmd.Process.Kill()
	cmd.Wait()
	for _, pid := range tree {
		if !exitsWithin(pid, 10*time.Second) {
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("process %d of the program's tree still there 10 s after farmem was killed", pid)
		}
	}
	if out, _ := os.ReadFile(outFile); strings.Contains(string(out), "BAD") {
		t.Fatalf("a process read a page that was not its own: %s", out)
	}
}

// A static program's exit status is farmem's, and so is its death by a signal in the middle of
// paging; a glibc static program is served too.
func TestStaticExitStatus(t *testing.T) {
	musl := staticMusl(t)
	run := func(args ...string) (string, int) {
		cmd := exec.Command(farmemBin(t), append([]string{"run", "--local-mem", "16MiB", "--quiet", "--"}, args...)...)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return out.String(), ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return out.String(), 0
	}
	if out, code := run(musl, "64", "2000", "crash"); code != 128+int(syscall.SIGSEGV) || strings.Contains(out, "BAD") {
		t.Errorf("a musl program dying of SIGSEGV while paged: farmem exited %d, want %d:\n%s", code, 128+int(syscall.SIGSEGV), out)
	}
	if out, code := run(staticGo(t), "many", "1"); code != 2 || !strings.Contains(out, "MIB and ROUNDS are counts") {
		t.Errorf("a static Go program exiting 2: farmem exited %d:\n%s", code, out)
	}
	dir := t.TempDir()
	src, glibc := filepath.Join(dir, "exit3.c"), filepath.Join(dir, "exit3")
	os.WriteFile(src, []byte("int main(void){return 3;}\n"), 0o644)
	if b, err := exec.Command("gcc", "-static", "-o", glibc, src).CombinedOutput(); err != nil {
		t.Logf("gcc -static cannot build a static glibc program here (no static libc?): %v\n%s", err, b)
		return
	}
	if out, code := run(glibc); code != 3 {
		t.Errorf("a static glibc program exiting 3: farmem exited %d:\n%s", code, out)
	}
}

// If farmem dies, the static program dies too, at once: it never runs on with zeros where its
// evicted pages were (it would say BAD: every page it rewrites is checked first).
func TestStaticRuntimeDeathStopsProgram(t *testing.T) {
	prog := staticGo(t)
	cmd := exec.Command(farmemBin(t), "run", "--local-mem", "16MiB", "--quiet", "--", prog, "128", "1000000000")
	// A file, not a pipe: cmd.Wait would wait for the program too, for ever if it lived on.
	outFile := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(outFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout = f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	for i := 0; i < 200 && child == 0; i++ {
		time.Sleep(20 * time.Millisecond)
		if d := descendants(cmd.Process.Pid); len(d) > 0 {
			child = d[0]
		}
	}
	if child == 0 {
		cmd.Process.Kill()
		t.Fatal("the program never started")
	}
	time.Sleep(1500 * time.Millisecond) // well into paging
	cmd.Process.Kill()
	cmd.Wait()
	if !exitsWithin(child, 5*time.Second) {
		syscall.Kill(child, syscall.SIGKILL)
		t.Fatalf("program %d still running 5 s after farmem was killed", child)
	}
	if out, _ := os.ReadFile(outFile); strings.Contains(string(out), "BAD") {
		t.Fatalf("the program read a page that was not its own before it died: %s", out)
	}
}

// Without CAP_SYS_ADMIN the mapping filter cannot go in, and a static program could not be
// served: farmem says so in one line, exit status 125, and the program never runs.
func TestStaticWithoutFilterRefused(t *testing.T) {
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) is not installed: no way to run farmem without CAP_SYS_ADMIN")
	}
	prog := staticMusl(t)
	cmd := exec.Command(setpriv, "--bounding-set", "-sys_admin", "--", farmemBin(t), "run", "--local-mem", "32MiB", "--quiet", "--", prog, "8", "10")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 125 {
		t.Fatalf("farmem without CAP_SYS_ADMIN: %v, want exit status 125\n%s", err, stderr.String())
	}
	if msg := strings.TrimSpace(stderr.String()); !strings.HasPrefix(msg, "farmem: ") || strings.Count(msg, "\n") != 0 ||
		!strings.Contains(msg, "installing the mapping filter: permission denied") {
		t.Errorf("farmem said %q, want one line naming the mapping filter", msg)
	}
	if stdout.Len() != 0 {
		t.Errorf("the program ran: %q", stdout.String())
	}
}

// A static program that execs a static program (itself, in fork mode) runs it correctly: farmem
// learns of the exec from its agent's connection, which the exec ends, and enters the new image
// as it entered the program (execed.go); its fork child is served, and both print the native
// digest.
func TestStaticExecsStatic(t *testing.T) {
	prog := staticMusl(t)
	want := native(t, prog, "64", "1000", "fork")
	out, s, _, err := runSampled(t, "run", "--local-mem", "32MiB", "--quiet", "--", prog, "64", "1000", "exec")
	if err != nil {
		t.Fatalf("under farmem: %v\n%s", err, out)
	}
	for _, line := range []string{"child: " + want, "fork: child exit 0", want} {
		if !strings.Contains(out, line+"\n") {
			t.Errorf("the exec'd program did not print %q:\n%s", line, out)
		}
	}
	if s.EnteredImages != 1 {
		t.Errorf("summary: entered_images %d, want 1: the exec'd image was not entered", s.EnteredImages)
	}
}
