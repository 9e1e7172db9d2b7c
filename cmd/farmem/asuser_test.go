package main

// End-to-end tests of a program of the run that runs as another user than root (runuser drops
// to nobody and exec's it): farmem serves it as it serves a root one, doing for it what the user
// may not (launcher/asuser.go), with no capability given to the program.

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/farmem/farmem/launcher"
)

// nobodyDir returns a new directory that user nobody may read and run programs from (a test's
// TempDir is its owner's alone).
func nobodyDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "farmem-asuser-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The attachee, run as nobody under a cap well below its data, with a thread that forks children
// which verify every 8th page and rewrite some: every page verifies after heavy eviction, in the
// program and in its fork children; the run stays within the cap; and the program is served, not
// counted unserved. Armed mid-run, after the program switched users, it has no mapping filter
// (it may not install one), which farmem says; armed from the start, it keeps the one farmem
// installed in runuser, which it inherited.
func TestAsUserServed(t *testing.T) {
	runuser := need(t, "/usr/sbin/runuser")
	dir := nobodyDir(t)
	bin := testProgram(t, dir, "attachee")
	for _, c := range []struct {
		name            string
		capMiB, dataMiB int
		inherited       bool
	}{
		{"ArmedMidRun", 64, 160, false},
		{"ArmedFromStart", 32, 96, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, peaks, stderr := runAsNobody(t, runuser, filepath.Join(dir, c.name+".json"), c.capMiB,
				`[ "$(id -u)" = 65534 ] && exec "$0" "$1" 1`, bin, fmt.Sprint(c.dataMiB))
			if s.UnservedImages != 0 {
				t.Errorf("summary: unserved_images %d, want 0", s.UnservedImages)
			}
			// runuser, its child (which exec's sh, then the program), id, and the program's fork
			// children.
			if s.Processes < 4 {
				t.Errorf("farmem served %d processes: the program or its fork children were not served", s.Processes)
			}
			if s.Evicted.Written == 0 || s.Faults["backend"].Count == 0 {
				t.Errorf("the program was never paged: %d pages written out, %d read back", s.Evicted.Written, s.Faults["backend"].Count)
			}
			// Its staging area's uffd, which the agent moves victims into, is made on farmem's
			// device too.
			if s.Batches.Staged == 0 {
				t.Errorf("no batch moved a page into the program's staging area")
			}
			if unfiltered := s.UnfilteredProcesses > 0; unfiltered == c.inherited {
				t.Errorf("summary: unfiltered_processes %d, want %s", s.UnfilteredProcesses, map[bool]string{true: "0", false: "some"}[c.inherited])
			}
			said := strings.Contains(stderr.String(), "runs as user 65534, which may not install the mapping filter without no_new_privs (farmem does not set it): it is served without the filter")
			if said == c.inherited {
				t.Errorf("farmem said the program, as nobody, is served without the mapping filter: %v; want %v", said, !c.inherited)
			}
			// The cap holds from the arming on: a run that armed far past its threshold (its
			// arming was late, on a loaded machine, while the program filled its data at full
			// speed) says nothing about serving this user.
			if late := s.ArmedAtBytes - s.ArmThresholdBytes; !c.inherited && late > 16<<20 {
				t.Logf("the run armed %d MiB past its threshold: the cap is not checked", late>>20)
				return
			}
			checkCap(t, s, peaks, int64(c.capMiB)<<20)
		})
	}
}

// runAsNobody runs, under farmem run at capMiB with its summary at sum, runuser dropping to
// nobody and sh running script with args (which exec's an attachee with a forking thread); it
// checks the attachee until its thread forked 3 times (at most 20 checks: every child verifying
// its pages), ends it, and returns the run's summary, the peaks sampled, and farmem's stderr.
func runAsNobody(t *testing.T, runuser, sum string, capMiB int, script string, args ...string) (*launcher.Summary, map[int]int64, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(farmemBin(t), append([]string{"run", "--local-mem", fmt.Sprintf("%dMiB", capMiB), "--summary-json", sum, "--",
		runuser, "-u", "nobody", "--", "/bin/sh", "-c", script}, args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	a := startAttacheeCmd(t, cmd)
	rss := sampleRSS(cmd.Process.Pid)
	forks := 0
	for i := 0; i < 20 && forks < 3; i++ {
		var bad int
		if _, forks, bad = a.check(t); bad != 0 {
			t.Fatalf("%d fork children of the program found a page not their own", bad)
		}
	}
	fmt.Fprintln(a.in, "exit")
	if err := a.cmd.Wait(); err != nil {
		t.Fatalf("farmem run: %v\n%s", err, stderr.String())
	}
	peaks := rss.finish()
	t.Logf("%s", stderr.String())
	if forks < 1 {
		t.Errorf("the program's forking thread finished no fork")
	}
	return readSummary(t, sum), peaks, &stderr
}

// A program running as nobody that exec's a setuid-root binary: the new image, in secure
// execution, ignores the shim and is entered as farmem enters any such image (root again, it may
// have its uffd and filter); its data and its fork children's verify, within the cap.
func TestAsUserExecsSetuid(t *testing.T) {
	runuser := need(t, "/usr/sbin/runuser")
	dir := nobodyDir(t)
	bin := testProgram(t, dir, "attachee")
	if err := os.Chmod(bin, os.ModeSetuid|0o755); err != nil {
		t.Fatal(err)
	}
	const capMiB = 32
	s, peaks, _ := runAsNobody(t, runuser, filepath.Join(dir, "summary.json"), capMiB,
		`[ "$(id -u)" = 65534 ] && exec "$0" 96 1`, bin)
	checkEntered(t, s)
	checkCap(t, s, peaks, capMiB<<20)
}

// A process outside the run, as nobody, that names the run's shim and socket (their names are
// readable by anyone: the socket's in /proc/net/unix) is refused the /dev/userfaultfd farmem
// would hand a process of the run: farmem says so, and the process's shim stops it rather than
// let it run half served. The run goes on unharmed.
func TestAsUserOutsiderRefused(t *testing.T) {
	runuser := need(t, "/usr/sbin/runuser")
	cmd := exec.Command(farmemBin(t), "run", "--local-mem", "32MiB", "--quiet", "--", "/bin/sh", "-c",
		`echo "$LD_PRELOAD" "$FARMEM_SOCK"; read x; echo still here`)
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatalf("the program said nothing: %s", stderr.String())
	}
	names := strings.Fields(lines.Text())
	if len(names) != 2 {
		t.Fatalf("the program printed %q, not its LD_PRELOAD and FARMEM_SOCK", lines.Text())
	}
	outsider := exec.Command(runuser, "-u", "nobody", "--", "/usr/bin/env", "LD_PRELOAD="+names[0], "FARMEM_SOCK="+names[1], "/bin/true")
	b, err := outsider.CombinedOutput()
	// runuser waits for its child and exits 128+9 for its SIGKILL.
	if ws, ok := outsider.ProcessState.Sys().(syscall.WaitStatus); !ok || ws.ExitStatus() != 128+int(syscall.SIGKILL) {
		t.Errorf("the outsider ended with %v, not killed by its shim:\n%s", err, b)
	}
	if !strings.Contains(string(b), "farmem shim: farmem refused this process a userfaultfd: it is not one of the run's") {
		t.Errorf("the outsider's shim did not say why it stopped it:\n%s", b)
	}
	fmt.Fprintln(in, "go on")
	if !lines.Scan() || lines.Text() != "still here" {
		t.Errorf("the run's program did not go on")
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("farmem run: %v", err)
	}
	if !strings.Contains(stderr.String(), "(user 65534), which is not one of the run's, asked for a userfaultfd: refused") {
		t.Errorf("farmem did not name the refused outsider:\n%s", stderr.String())
	}
}

// A static program run as nobody has no shim: farmem enters it from outside, making its
// userfaultfd on a descriptor of the device it sends it (the user may not open it). Armed from the
// start, the image inherits the mapping filter farmem installed in runuser, which hands over its
// forks: it is served as a root one is, its data and its fork child's right, within the cap.
// Armed after the switch of users, it has no filter and may not install one (no_new_privs is not
// set): it is served as an attached process is, farmem says so, and its data and its fork
// child's are right.
func TestAsUserStatic(t *testing.T) {
	runuser := need(t, "/usr/sbin/runuser")
	dir := nobodyDir(t)
	goProg := filepath.Join(dir, "staticfill-go")
	if b, err := exec.Command("cp", staticGo(t), goProg).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, b)
	}
	t.Run("ArmedFromStart", func(t *testing.T) {
		check := func(t *testing.T, prog string, args ...string) (string, *launcher.Summary, map[int]int64) {
			out, s, peaks, err := runSampled(t, append([]string{"run", "--local-mem", "32MiB", "--", runuser, "-u", "nobody", "--", prog}, args...)...)
			if err != nil {
				t.Fatalf("under farmem: %v\n%s", err, out)
			}
			if s.UnservedImages != 0 || s.EnteredImages != 1 {
				t.Errorf("summary: unserved_images %d, entered_images %d, want 0 and 1\n%s", s.UnservedImages, s.EnteredImages, out)
			}
			if s.Evicted.Written == 0 || s.Faults["backend"].Count == 0 {
				t.Errorf("the program was never paged: %d pages written out, %d read back", s.Evicted.Written, s.Faults["backend"].Count)
			}
			return out, s, peaks
		}
		t.Run("Go", func(t *testing.T) {
			want := native(t, goProg, "64", "100")
			out, s, peaks := check(t, goProg, "64", "100")
			if got := digestLine(t, out); got != want {
				t.Errorf("as nobody under farmem the program printed\n%s\nnatively\n%s", got, want)
			}
			checkCap(t, s, peaks, 32<<20)
		})
		t.Run("MuslFork", func(t *testing.T) {
			prog := filepath.Join(dir, "staticfill-musl")
			if b, err := exec.Command("cp", staticMusl(t), prog).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v\n%s", err, b)
			}
			want := native(t, prog, "64", "1000", "fork")
			out, s, _ := check(t, prog, "64", "1000", "fork")
			for _, line := range []string{"child: " + want, "fork: child exit 0", "posix_spawn: exit 0", want} {
				if !strings.Contains(out, line+"\n") {
					t.Errorf("the program did not print %q:\n%s", line, out)
				}
			}
			// A page parent and child share counts in each one's RssAnon: the cgroup's peak is
			// the check.
			if b, ok := cgroupPeak(t, s, 32<<20); ok && b > 32<<20+capSlack {
				t.Errorf("the run's memory cgroup peaked at %.1f MiB: more than the cap and %d MiB", float64(b)/(1<<20), capSlack>>20)
			}
		})
	})
	t.Run("ArmedMidRun", func(t *testing.T) {
		check := func(t *testing.T, prog string, args ...string) (string, *launcher.Summary) {
			out, s, _, err := runSampled(t, append([]string{"run", "--local-mem", "64MiB", "--", runuser, "-u", "nobody", "--", prog}, args...)...)
			if err != nil {
				t.Fatalf("under farmem: %v\n%s", err, out)
			}
			if s.UnservedImages != 0 || s.EnteredImages != 1 || s.UnfilteredProcesses == 0 {
				t.Errorf("summary: unserved_images %d, entered_images %d, unfiltered_processes %d, want 0, 1 and some\n%s",
					s.UnservedImages, s.EnteredImages, s.UnfilteredProcesses, out)
			}
			if !strings.Contains(out, "runs as user 65534, which may not install the mapping filter without no_new_privs (farmem does not set it): it is served without the filter") {
				t.Errorf("farmem did not say the image is served without the filter:\n%s", out)
			}
			if s.Evicted.Written == 0 || s.Faults["backend"].Count == 0 {
				t.Errorf("the program was never paged: %d pages written out, %d read back", s.Evicted.Written, s.Faults["backend"].Count)
			}
			// The cap by the cgroup's peak (a page parent and child share counts in each one's
			// RssAnon), from the arming on: a run that armed far past its threshold, late on a
			// loaded machine while the program filled its data, says nothing of serving it.
			if late := s.ArmedAtBytes - s.ArmThresholdBytes; late > 16<<20 {
				t.Logf("the run armed %d MiB past its threshold: the cap is not checked", late>>20)
			} else if b, ok := cgroupPeak(t, s, 64<<20); ok && b > 64<<20+capSlack {
				t.Errorf("the run's memory cgroup peaked at %.1f MiB: more than the cap and %d MiB", float64(b)/(1<<20), capSlack>>20)
			}
			return out, s
		}
		t.Run("Go", func(t *testing.T) {
			want := native(t, goProg, "160", "100")
			out, _ := check(t, goProg, "160", "100")
			if got := digestLine(t, out); got != want {
				t.Errorf("as nobody under farmem the program printed\n%s\nnatively\n%s", got, want)
			}
		})
		// Its fork child runs a few milliseconds before farmem finds it through its FORK event
		// and enters it: it reads back the pages its parent had evicted, each its own.
		t.Run("MuslFork", func(t *testing.T) {
			prog := filepath.Join(dir, "staticfill-musl")
			if b, err := exec.Command("cp", staticMusl(t), prog).CombinedOutput(); err != nil {
				t.Fatalf("cp: %v\n%s", err, b)
			}
			want := native(t, prog, "160", "1000", "fork")
			out, s := check(t, prog, "160", "1000", "fork")
			for _, line := range []string{"child: " + want, "fork: child exit 0", "posix_spawn: exit 0", want} {
				if !strings.Contains(out, line+"\n") {
					t.Errorf("the program did not print %q:\n%s", line, out)
				}
			}
			if strings.Contains(out, "could not be entered") || s.Processes < 3 {
				t.Errorf("its fork child was not entered (%d processes served):\n%s", s.Processes, out)
			}
		})
	})
}

// If farmem dies while a program running as nobody pages (and forks), every process of it dies
// too, through the lifeline each made as that user, and none reads a page that is not its own.
func TestAsUserFarmemKilled(t *testing.T) {
	runuser := need(t, "/usr/sbin/runuser")
	dir := nobodyDir(t)
	bin := testProgram(t, dir, "attachee")
	cmd := exec.Command(farmemBin(t), "run", "--local-mem", "32MiB", "--quiet", "--", runuser, "-u", "nobody", "--", bin, "96", "1")
	a := startAttacheeCmd(t, cmd)
	if _, _, bad := a.check(t); bad != 0 {
		t.Fatalf("%d fork children found a page not their own", bad)
	}
	fmt.Fprintln(a.in, "check") // in flight, faulting its pages back, as farmem dies
	tree := descendants(cmd.Process.Pid)
	cmd.Process.Kill()
	for l := range a.lines {
		if strings.HasPrefix(l, "BAD") {
			t.Errorf("the program read a page not its own after farmem died: %s", l)
		}
	}
	for _, pid := range tree {
		if !exitsWithin(pid, 10*time.Second) {
			wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
			syscall.Kill(pid, syscall.SIGKILL)
			t.Errorf("process %d of the program's tree still there 10 s after farmem (waiting in %s)", pid, wchan)
		}
	}
}

// rawcloneAsNobody builds testdata/rawclone.c where user nobody may run it, and returns runuser,
// the program, and the file its child writes its verdict to (in a directory nobody may write).
func rawcloneAsNobody(t *testing.T) (runuser, prog, verdict string) {
	t.Helper()
	runuser = need(t, "/usr/sbin/runuser")
	dir := nobodyDir(t)
	if err := os.Chmod(dir, 0o777); err != nil { // the child writes its verdict there
		t.Fatal(err)
	}
	prog = testProgram(t, dir, "rawclone")
	return runuser, prog, filepath.Join(dir, "child")
}

// A process running as nobody and served without the mapping filter (the run armed after it
// switched users) forks by a raw clone and exits at once. Its child runs no atfork handler, and no
// filter hands its fork over: it says no hello, and is served on its FORK event alone. It outlives
// its parent by more than the grace a silent orphan is given to say hello (5 s), then reads every
// page back: each its own, none zeros, and farmem serves it to its end.
func TestAsUserRawForkOrphanReadsItsPages(t *testing.T) {
	runuser, prog, verdict := rawcloneAsNobody(t)
	out, err := exec.Command(farmemBin(t), "run", "--local-mem", "64MiB", "--", runuser, "-u", "nobody", "--",
		prog, "160", "7", verdict, "orphan").CombinedOutput()
	if err != nil {
		t.Fatalf("farmem run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "it is served without the filter") {
		t.Fatalf("the run armed before the program switched users (the test needs one that did not):\n%s", out)
	}
	if b, _ := os.ReadFile(verdict); string(b) != "child ok\n" {
		t.Fatalf("the orphaned child wrote %q by the time farmem ended\n%s", b, out)
	}
}

// A child such a process forks by a raw clone, served on its FORK event alone, has no lifeline of
// its own: the one it inherited signals its parent. farmem makes it one once its rescan finds the
// child, so that farmem's death kills the child rather than leave it reading zeros where its
// evicted pages were. Unkilled, it would read them as zeros once farmem is gone (the uffd they
// are registered on is farmem's alone).
func TestAsUserSilentForkChildDiesWithFarmem(t *testing.T) { silentChildDiesWithFarmem(t, "wait") }

// The same when the parent exits at once, leaving its child to init before farmem's rescan can
// find it among its children: the kernel's process events tell farmem of the fork.
func TestAsUserSilentOrphanDiesWithFarmem(t *testing.T) {
	if c := processEventsCheck(); c.verdict != checkOK {
		t.Skipf("farmem hears of no fork as it happens here (%s): only the rescan finds such children", c.detail)
	}
	silentChildDiesWithFarmem(t, "orphan")
}

// silentChildDiesWithFarmem runs rawclone as nobody under farmem with how (wait: the parent waits
// for the child; orphan: it exits at once), kills farmem while the child sleeps, and fails unless
// the child dies without a word.
func silentChildDiesWithFarmem(t *testing.T, how string) {
	runuser, prog, verdict := rawcloneAsNobody(t)
	var stderr syncBuffer
	args := []string{"run", "--local-mem", "64MiB", "--", runuser, "-u", "nobody", "--", prog, "160", "4", verdict}
	if how == "orphan" {
		args = append(args, how)
	}
	cmd := exec.Command(farmemBin(t), args...)
	cmd.Stderr = &stderr
	// The rescan looks among the served processes' children every 100 ms.
	child := killFarmemOnceForked(t, cmd, time.Second)
	if !strings.Contains(stderr.String(), "it is served without the filter") {
		t.Fatalf("the run armed before the program switched users (the test needs one that did not):\n%s", stderr.String())
	}
	if !exitsWithin(child, 10*time.Second) {
		syscall.Kill(child, syscall.SIGKILL)
		t.Fatalf("the child %d still runs 10 s after farmem was killed", child)
	}
	if b, err := os.ReadFile(verdict); err == nil {
		t.Fatalf("the child outlived farmem and wrote %q\nfarmem said:\n%s", b, stderr.String())
	}
}

// The same with a clone made with CLONE_PARENT: the child is a child of its parent's parent
// (runuser, served), whose vDSO is not where the child's is. It is still a fork child, served on
// its FORK event, not an image runuser exec'd: farmem must not take it for one and enter it a
// second time (a second agent and uffd beside the event's), nor count it as an image.
func TestAsUserCloneParentChildNotTakenForAnImage(t *testing.T) {
	runuser, prog, verdict := rawcloneAsNobody(t)
	summary := filepath.Join(t.TempDir(), "summary.json")
	out, err := exec.Command(farmemBin(t), "run", "--local-mem", "64MiB", "--summary-json", summary, "--",
		runuser, "-u", "nobody", "--", prog, "160", "3", verdict, "cloneparent").CombinedOutput()
	if err != nil {
		t.Fatalf("farmem run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "it is served without the filter") {
		t.Fatalf("the run armed before the program switched users (the test needs one that did not):\n%s", out)
	}
	if b, _ := os.ReadFile(verdict); string(b) != "child ok\n" {
		t.Fatalf("the CLONE_PARENT child wrote %q by the time farmem ended\n%s", b, out)
	}
	if s := readSummary(t, summary); s.EnteredImages != 0 || s.UnservedImages != 0 {
		t.Fatalf("farmem took the CLONE_PARENT child for an image: %d entered, %d unserved\n%s", s.EnteredImages, s.UnservedImages, out)
	}
}

// A process running as nobody is attached as a root one is: it may not open /dev/userfaultfd, and
// farmem sends it a descriptor of the device by calls it makes in it while it is frozen. Its data
// verifies attached, after a rewrite under the cap, and after the detach.
func TestAttachAsUser(t *testing.T) {
	a := startAttacheeCmd(t, attacheeAsNobody(t, "64"))
	pid := a.cmd.Process.Pid
	before, _, _ := a.check(t)
	summary := filepath.Join(t.TempDir(), "summary.json")
	c, stderr := attachTo(t, pid, "16MiB", "--summary-json", summary)
	waitRSSBelow(t, pid, 32<<20, c, stderr)
	if sum, _, _ := a.check(t); sum != before {
		t.Fatalf("attached: sum %s, before farmem %s", sum, before)
	}
	a.write(t)
	written, _, _ := a.check(t)
	waitRSSBelow(t, pid, 32<<20, c, stderr) // evicted again before the detach
	detach(t, c, stderr)
	if sum, _, _ := a.check(t); sum != written {
		t.Fatalf("detached: sum %s, attached %s", sum, written)
	}
	// Its agent's staging area, which victims are moved into, is registered on a uffd made on
	// the same descriptor.
	if s := readSummary(t, summary); s.Batches.Staged == 0 {
		t.Errorf("no batch moved a page into the process's staging area")
	}
	a.exit(t)
}

// The same while two threads of it fork children again and again beside a churning one: each
// child, entered through its agent's fork entry, asks farmem for the device as its parent did,
// and verifies its copy of the data.
func TestAttachAsUserForkingThreads(t *testing.T) {
	attachForking(t, "16MiB", attacheeAsNobody(t, "32", "2", "1"))
}

// attacheeAsNobody returns the command that runs the attachee with args as user nobody.
func attacheeAsNobody(t *testing.T, args ...string) *exec.Cmd {
	bin := testProgram(t, nobodyDir(t), "attachee")
	cmd := exec.Command(bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	return cmd
}
