package main

// End-to-end tests of fork children under farmem run: children born together, matched each with
// its own FORK event, and a child orphaned before it said hello.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Two threads fork again and again, all paged hard at a 16 MiB cap, in two ways: together, and
// one at a time while a third thread rewrites pages. Every child verifies its copy of every 8th
// page and exits 1 on a wrong one; the attachee counts those (bad).
//   - Children born at the same moment say hello in either order, and each must be served from
//     its own FORK event, its own page table and its own memory. Matched in fork order, a child
//     would be served on its sibling's uffd, with its sibling's table: zeros, or its sibling's
//     pages.
//   - A child's table must be its parent's as it was at the fork: a fault the parent took while
//     its FORK event was queued, served before the event, would record resident in the child a
//     page only the parent has, and the runtime would stop the child at its first touch of it.
func TestForkingThreadsEachServedAsItself(t *testing.T) { forkingThreads(t, attacheeBin(t)) }

// The same with the faults read and served in the program (--serve-faults program): the agent's
// fault thread reads each FORK event and sends it on to farmem, so a child runs, and says
// hello, before farmem has its event; the parent's agent must also not serve a fault between
// its read of the FORK event and farmem's clone of the table.
func TestForkingThreadsServedInProgram(t *testing.T) {
	forkingThreads(t, attacheeBin(t), "--serve-faults", "program")
}

// The same in a static program (musl), whose forks the runtime enters itself (the fork server):
// no shim's atfork handler holds the batches' moves back while it forks, the runtime does.
func TestStaticForkingThreads(t *testing.T) {
	cc, err := exec.LookPath("musl-gcc")
	if err != nil {
		t.Skip("musl-gcc is not installed (Debian's musl-tools; scripts/test-deps.sh installs it)")
	}
	bin := filepath.Join(t.TempDir(), "attachee-musl")
	if b, err := exec.Command(cc, "-static", "-O2", "-pthread", "-o", bin, "testdata/attachee.c").CombinedOutput(); err != nil {
		t.Fatalf("building the musl attachee: %v\n%s", err, b)
	}
	forkingThreads(t, bin)
}

// The same with forks made by a raw clone(SIGCHLD) system call, as some runtimes and sandboxes
// make them: no atfork handler of the shim runs, in the parent (whose move_lock then holds no
// batch back: the runtime's forkGate does) or in the child (which would never say hello: farmem
// enters it at its birth). Every child verifies its copy of every 8th page. Every child gone is
// let go: farmem holds no descriptor (its uffd) for each of the children that have come and gone.
func TestRawCloneForkingThreads(t *testing.T) {
	var stderr syncBuffer
	cmd := exec.Command(farmemBin(t), "run", "--quiet", "--local-mem", "16MiB", "--", attacheeBin(t), "32", "2", "0", "1")
	cmd.Stderr = &stderr
	a := startAttacheeCmd(t, cmd)
	a.forkedRight(t, 60, &stderr)
	fds := 0
	for end := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", cmd.Process.Pid))
		if fds = len(ents); err != nil || fds < 60 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("farmem holds %d descriptors after %d raw-clone children came and went", fds, 60)
		}
	}
	a.exit(t)
	if s := stderr.String(); strings.Contains(s, "cannot serve") {
		t.Fatalf("farmem:\n%s", s)
	}
}

// forkingThreads runs attachee bin under farmem at 16 MiB (with farmem's options opts) with two
// forking threads, together and beside a churning thread, until they forked 60 times each way,
// every child verifying its copy.
func forkingThreads(t *testing.T, bin string, opts ...string) {
	for _, tc := range []struct{ name, churn string }{{"together", "0"}, {"churning", "1"}} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr syncBuffer
			args := append(append([]string{"run", "--quiet", "--local-mem", "16MiB"}, opts...), "--", bin, "32", "2", tc.churn)
			cmd := exec.Command(farmemBin(t), args...)
			cmd.Stderr = &stderr
			a := startAttacheeCmd(t, cmd)
			a.forkedRight(t, 60, &stderr)
			a.exit(t)
			if s := stderr.String(); strings.Contains(s, "fork child") || strings.Contains(s, "cannot serve") {
				t.Fatalf("farmem:\n%s", s)
			}
		})
	}
}

// forkedRight waits, up to a minute, until the attachee's forking threads have forked n more
// times, failing the test as soon as one of its children (or rewrites) found a wrong page.
func (a *attachee) forkedRight(t *testing.T, n int, stderr *syncBuffer) {
	t.Helper()
	_, forks0, _ := a.check(t)
	for end := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, forks, bad := a.check(t)
		if bad != 0 {
			t.Fatalf("%d of the attachee's children found a wrong page\n%s", bad, stderr.String())
		}
		if forks >= forks0+n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("the attachee forked %d times in 60 s\n%s", forks-forks0, stderr.String())
		}
	}
}

// A daemon's parent exits as soon as it has forked: its child, orphaned before its hello, still
// finds its FORK event, and reads every evicted page back right. farmem waits for it.
func TestOrphanedForkChildServed(t *testing.T) {
	prog := testProgram(t, t.TempDir(), "daemonize")
	want, err := exec.Command(prog, "48").Output()
	if err != nil || !strings.HasPrefix(string(want), "child ok") {
		t.Fatalf("natively: %q, %v", want, err)
	}
	for i := 0; i < 3; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		out, err := exec.CommandContext(ctx, farmemBin(t), "run", "--quiet", "--local-mem", "16MiB", "--", prog, "48").CombinedOutput()
		cancel()
		if err != nil || string(out) != string(want) {
			t.Fatalf("run %d under farmem: %v\n%s\nnative: %s", i, err, out, want)
		}
	}
}

// A fork child no atfork handler runs in is served with a uffd and lifeline of its own, so it
// dies with farmem. A raw clone's child is entered (the agent put in it at its birth, as a static
// program's fork child is); glibc's _Fork() child re-arms itself in the shim's _Fork. Served on
// its FORK event alone, such a child would read zeros where its evicted pages were once farmem
// is gone. Unkilled, it reads every page back right.
func TestRawCloneChildDiesWithFarmem(t *testing.T) {
	dir := t.TempDir()
	prog := testProgram(t, dir, "rawclone")
	for _, how := range []string{"clone", "_Fork"} {
		out := filepath.Join(dir, "child-"+how)
		if b, err := exec.Command(farmemBin(t), "run", "--quiet", "--local-mem", "16MiB", "--", prog, "64", "0", out, how).CombinedOutput(); err != nil {
			t.Fatalf("%s: farmem run: %v\n%s", how, err, b)
		}
		if b, _ := os.ReadFile(out); string(b) != "child ok\n" {
			t.Fatalf("%s: the child under farmem wrote %q", how, b)
		}
		os.Remove(out)
		cmd := exec.Command(farmemBin(t), "run", "--quiet", "--local-mem", "16MiB", "--", prog, "64", "3", out, how)
		child := killFarmemOnceForked(t, cmd, 0)
		if !exitsWithin(child, 10*time.Second) {
			syscall.Kill(child, syscall.SIGKILL)
			t.Fatalf("%s: the child %d still runs 10 s after farmem was killed", how, child)
		}
		if b, err := os.ReadFile(out); err == nil {
			t.Fatalf("%s: the child outlived farmem and wrote %q", how, b)
		}
	}
}

// killFarmemOnceForked starts cmd, farmem running rawclone, reads the child's pid from its
// "forked PID", gives farmem settle more, and kills farmem (SIGKILL) while the child sleeps, its
// pages evicted. It returns the child's pid.
func killFarmemOnceForked(t *testing.T, cmd *exec.Cmd, settle time.Duration) int {
	t.Helper()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var child int
	if _, err := fmt.Fscanf(stdout, "forked %d\n", &child); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("no child: %v", err)
	}
	time.Sleep(settle)
	cmd.Process.Kill()
	cmd.Wait()
	return child
}

// A process that exits while another of its threads forks with a raw clone ends that fork
// itself: farmem, taking the child, finds the forking thread gone. No fork was refused, and
// farmem does not say that the process's forks fail. A child the fork made before its thread was
// killed is killed at its birth, not left stopped and served until farmem's end: farmem ends with
// the program (a hang here would be the test's timeout). Twenty exits in the middle of forking:
// each with two threads forking by raw clone at a 16 MiB cap.
func TestExitWhileForkingSaysNothing(t *testing.T) {
	for i := range 20 {
		cmd := exec.Command(farmemBin(t), "run", "--quiet", "--local-mem", "16MiB", "--", attacheeBin(t), "32", "2", "0", "1")
		stdin, err := cmd.StdinPipe()
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(400 * time.Millisecond) // forking by now: the fill takes a few milliseconds
		fmt.Fprintln(stdin, "exit")
		stdin.Close()
		if err := cmd.Wait(); err != nil || strings.Contains(out.String(), "could not take its child") {
			t.Fatalf("exit %d while forking: %v\n%s", i, err, out.String())
		}
	}
}
