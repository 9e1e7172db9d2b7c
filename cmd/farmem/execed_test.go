package main

// End-to-end tests of images a served program exec's that do not load farmem's shim: a static
// binary, or a dynamic program whose LD_PRELOAD was dropped. farmem enters each as it enters a
// static program (launcher/execed.go) and serves it under the run's cap; one it cannot enter
// runs on without farmem, named on stderr.

import (
	"bytes"
	"encoding/json"
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

// checkEntered fails the test unless the run entered exactly one exec'd image and left none
// unserved, and paged: the program exec'ing is a small shell, so the pages that went out and
// came back were the new image's.
func checkEntered(t *testing.T, s *launcher.Summary) {
	t.Helper()
	if s.EnteredImages != 1 || s.UnservedImages != 0 {
		t.Errorf("summary: entered_images %d, unserved_images %d; want 1 and 0", s.EnteredImages, s.UnservedImages)
	}
	if s.Evicted.Written == 0 || s.Faults["backend"].Count == 0 {
		t.Errorf("the exec'd image was never paged: %d pages written out, %d read back", s.Evicted.Written, s.Faults["backend"].Count)
	}
}

// A shell that exec's a static Go program (CGO_ENABLED=0): the new image is entered and held to
// the run's cap, its data intact.
func TestExecedStaticGoServed(t *testing.T) {
	prog := staticGo(t)
	args := []string{"128", "20000"}
	want := native(t, prog, args...)
	out, s, peaks, err := runSampled(t, "run", "--local-mem", "32MiB", "--", "/bin/bash", "-c", "exec "+prog+" "+strings.Join(args, " "))
	if err != nil {
		t.Fatalf("under farmem: %v", err)
	}
	if got := digestLine(t, out); got != want {
		t.Fatalf("under farmem the exec'd program printed\n%s\nnatively\n%s", got, want)
	}
	checkEntered(t, s)
	checkCap(t, s, peaks, 32<<20)
}

// fillScript has python fill 128 MiB, page by page, and print whether the shim is among its
// mappings and the data's SHA-256.
const fillScript = `import hashlib
shim = any("libfarmem" in l for l in open("/proc/self/maps"))
b = bytearray(128 << 20)
for i in range(0, len(b), 4096):
    b[i:i+8] = i.to_bytes(8, "little")
    b[i+8:i+16] = (i * 7919 % 1000003).to_bytes(8, "little")
print("shim" if shim else "no shim", hashlib.sha256(b).hexdigest())`

// nativeFill runs fillScript without farmem and returns its line's digest part. Run first, it
// also puts python's files in the page cache, which the run's memory cgroup would otherwise be
// charged for as it reads them (the cap does not cover page cache).
func nativeFill(t *testing.T, py string) string {
	t.Helper()
	nat, err := exec.Command(py, "-c", fillScript).Output()
	if err != nil {
		t.Fatalf("python natively: %v", err)
	}
	digest, ok := strings.CutPrefix(string(nat), "no shim ")
	if !ok {
		t.Fatalf("python natively printed %q", nat)
	}
	return digest
}

// A shell that exec's python through `env -u LD_PRELOAD`: python runs without the shim (it
// says so, from its own mappings), and is entered and held to the cap all the same.
func TestExecedWithoutPreloadServed(t *testing.T) {
	py := need(t, "/usr/bin/python3")
	want := "no shim " + nativeFill(t, py)
	out, s, peaks, err := runSampled(t, "run", "--local-mem", "32MiB", "--quiet", "--", "/bin/bash", "-c", `exec env -u LD_PRELOAD "$0" -c "$1"`, py, fillScript)
	if err != nil {
		t.Fatalf("under farmem: %v", err)
	}
	if out != want {
		t.Fatalf("under farmem python printed %q, want %q", out, want)
	}
	checkEntered(t, s)
	checkCap(t, s, peaks, 32<<20)
}

// An entered image that exec's an image with the shim again (the preload put back): the new
// image says hello and is served through its shim, not entered a second time (which would make
// two agents, and the injected one's end would stop the program).
func TestExecedBackToShim(t *testing.T) {
	py := need(t, "/usr/bin/python3")
	want := "shim " + nativeFill(t, py)
	out, s, peaks, err := runSampled(t, "run", "--local-mem", "32MiB", "--quiet", "--", "/bin/bash", "-c",
		`P=$LD_PRELOAD; exec env -u LD_PRELOAD /bin/bash -c 'exec env LD_PRELOAD="$0" "$1" -c "$2"' "$P" "$0" "$1"`, py, fillScript)
	if err != nil {
		t.Fatalf("under farmem: %v", err)
	}
	if out != want {
		t.Fatalf("under farmem python printed %q, want %q", out, want)
	}
	// The bash without the preload, and maybe the env it exec's, if farmem saw it before it
	// exec'd python.
	if s.EnteredImages < 1 || s.UnservedImages != 0 {
		t.Errorf("summary: entered_images %d, unserved_images %d; want at least 1 and 0", s.EnteredImages, s.UnservedImages)
	}
	checkCap(t, s, peaks, 32<<20)
}

// A static image entered after an exec forks: its child is stopped at its birth and entered as
// a static program's is, and reads back the pages its parent had evicted (it checks each and
// prints the digest).
func TestExecedStaticForks(t *testing.T) {
	prog := staticMusl(t)
	args := []string{"64", "1000", "fork"}
	want := native(t, prog, args...)
	out, s, _, err := runSampled(t, "run", "--local-mem", "32MiB", "--", "/bin/bash", "-c", "exec "+prog+" "+strings.Join(args, " "))
	if err != nil {
		t.Fatalf("under farmem: %v", err)
	}
	for _, line := range []string{"child: " + want, "fork: child exit 0", "posix_spawn: exit 0", want} {
		if !strings.Contains(out, line+"\n") {
			t.Errorf("the exec'd program did not print %q:\n%s", line, out)
		}
	}
	checkEntered(t, s)
	// bash, the image it exec'd, and the image's fork child.
	if s.Processes < 3 {
		t.Errorf("farmem served %d processes: the exec'd image's fork child was not served", s.Processes)
	}
	if b, ok := cgroupPeak(t, s, 32<<20); ok && b > 32<<20+capSlack {
		t.Errorf("the run's memory cgroup peaked at %.1f MiB: more than the cap and %d MiB", float64(b)/(1<<20), capSlack>>20)
	}
}

// spawnScript has python posix_spawn() its arguments (glibc's posix_spawn: a vfork child, sharing
// python's memory until it exec's) and exit with the child's status.
const spawnScript = `import os, sys
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))`

// A served dynamic program that spawns a static one from a vfork child: python's posix_spawn(),
// and dash running a command that is not its last. The child's exec raises no FORK event, says no
// hello and ends no control connection, and the mapping filter's hand-over of the exec is what
// tells farmem of the new image. It is entered and held to the cap, its data intact.
func TestVforkExecedStaticServed(t *testing.T) {
	prog := staticGo(t)
	for _, tc := range []struct {
		name string
		argv []string
	}{
		{"posix_spawn", []string{need(t, "/usr/bin/python3"), "-c", spawnScript, prog, "128", "20000"}},
		{"dash", []string{need(t, "/usr/bin/dash"), "-c", prog + " 128 20000; true"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Natively through the spawner too: its files are then in the page cache, which the
			// run's memory cgroup would otherwise be charged for as it reads them (the cap does
			// not cover it).
			want := native(t, tc.argv[0], tc.argv[1:]...)
			out, s, peaks, err := runSampled(t, append([]string{"run", "--local-mem", "32MiB", "--"}, tc.argv...)...)
			if err != nil {
				t.Fatalf("under farmem: %v", err)
			}
			if got := digestLine(t, out); got != want {
				t.Fatalf("under farmem the spawned program printed\n%s\nnatively\n%s", got, want)
			}
			checkEntered(t, s)
			checkCap(t, s, peaks, 32<<20)
		})
	}
}

// The same before the run arms: python has no mapping filter yet (a dynamic process installs it
// when the run arms), so nothing hands the exec over; the rescan loop finds the image among
// python's children, enters it, and the run arms on its memory and holds it to the cap.
func TestVforkExecedBeforeArmingServed(t *testing.T) {
	py := need(t, "/usr/bin/python3")
	prog := staticGo(t)
	args := []string{"-c", spawnScript, prog, "160", "20000"}
	want := native(t, py, args...)
	out, s, peaks, err := runSampled(t, append([]string{"run", "--local-mem", "96MiB", "--", py}, args...)...)
	if err != nil {
		t.Fatalf("under farmem: %v", err)
	}
	if got := digestLine(t, out); got != want {
		t.Fatalf("under farmem the spawned program printed\n%s\nnatively\n%s", got, want)
	}
	if s.ArmedAtBytes == 0 {
		t.Errorf("the run did not arm mid-run")
	}
	checkEntered(t, s)
	checkCap(t, s, peaks, 96<<20)
}

// Short-lived static images a shell runs one after another before the run arms: dash vforks
// each command but the last and exec's it there, with no mapping filter yet to hand the exec
// over. Each is entered as it starts, told by the kernel's exec events, not only those the rescan
// loop happens to find alive.
func TestShortExecedImagesEntered(t *testing.T) {
	if c := processEventsCheck(); c.verdict != checkOK {
		t.Skipf("farmem hears of no exec as it happens here (%s): only the rescan finds such images", c.detail)
	}
	dash := need(t, "/usr/bin/dash")
	prog := staticGo(t)
	const images = 20
	script := strings.Repeat(prog+" 8 200; ", images) + "true"
	want := native(t, prog, "8", "200")
	out, s, _, err := runSampled(t, "run", "--local-mem", "512MiB", "--", dash, "-c", script)
	if err != nil {
		t.Fatalf("under farmem: %v", err)
	}
	if n := strings.Count(out, want+"\n"); n != images {
		t.Fatalf("%d of the %d images printed the native digest %q", n, images, want)
	}
	if s.Armed {
		t.Fatalf("the run armed: the images' exec's may have been handed over by the filter")
	}
	if s.EnteredImages != images || s.UnservedImages != 0 {
		t.Errorf("summary: entered_images %d, unserved_images %d; want %d and 0", s.EnteredImages, s.UnservedImages, images)
	}
}

// An image farmem cannot enter (another process traces it: a process has one tracer) runs on
// untouched and right, without farmem, and farmem names it on stderr with the reason and counts
// it, instead of keeping the old image in the run.
func TestExecedUnenterableNamed(t *testing.T) {
	dir := t.TempDir()
	tracer := testProgram(t, dir, "tracedexec")
	prog := staticGo(t)
	want := native(t, prog, "64", "100")
	sum := filepath.Join(dir, "summary.json")
	cmd := exec.Command(farmemBin(t), "run", "--local-mem", "32MiB", "--summary-json", sum, "--", tracer, prog, "64", "100")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("farmem run: %v\n%s", err, stderr.String())
	}
	if got := digestLine(t, stdout.String()); got != want {
		t.Errorf("the traced image printed\n%s\nnatively\n%s", got, want)
	}
	if !strings.Contains(stderr.String(), "exec'd "+prog+", which did not load farmem's shim, and farmem could not enter it (process ") ||
		!strings.Contains(stderr.String(), "traces it, and a process has one tracer): it runs without farmem") {
		t.Errorf("farmem did not name the unserved image and why:\n%s", stderr.String())
	}
	var s launcher.Summary
	b, err := os.ReadFile(sum)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &s); err != nil || s.UnservedImages != 1 || s.EnteredImages != 0 {
		t.Errorf("summary: unserved_images %d, entered_images %d (%v), want 1 and 0", s.UnservedImages, s.EnteredImages, err)
	}
}

// Without CAP_SYS_ADMIN the entered image's mapping filter cannot go in: farmem takes its agent
// out again (the agent thread ends, its memory is unmapped, its lifeline silenced), and the image
// runs on without farmem, unharmed, named with the reason.
func TestExecedWithoutFilterUnserved(t *testing.T) {
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("setpriv (util-linux) is not installed: no way to run farmem without CAP_SYS_ADMIN")
	}
	prog := staticGo(t)
	want := native(t, prog, "64", "100")
	cmd := exec.Command(setpriv, "--bounding-set", "-sys_admin", "--", farmemBin(t), "run", "--local-mem", "32MiB", "--quiet", "--",
		"/bin/bash", "-c", "exec "+prog+" 64 100")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("farmem run: %v\n%s", err, stderr.String())
	}
	if got := digestLine(t, stdout.String()); got != want {
		t.Errorf("the image printed\n%s\nnatively\n%s", got, want)
	}
	if !strings.Contains(stderr.String(), "farmem could not enter it (installing its mapping filter: permission denied (it needs CAP_SYS_ADMIN))") {
		t.Errorf("farmem did not say why it could not enter the image:\n%s", stderr.String())
	}
}

// If farmem dies while an entered image pages, the image dies too (the lifeline farmem made in
// it when it entered it), and never reads a page that is not its own. The image is a fork child's
// (bash runs it, then waits): no parent-death signal of farmem's reaches it.
func TestExecedImageDiesWithFarmem(t *testing.T) {
	prog := staticGo(t)
	cmd := exec.Command(farmemBin(t), "run", "--local-mem", "16MiB", "--quiet", "--", "/bin/bash", "-c", prog+" 128 1000000000; true")
	// A file, not a pipe: cmd.Wait would wait for the image too, for ever if it lived on.
	outFile := filepath.Join(t.TempDir(), "out")
	f, err := os.Create(outFile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	image := 0
	for i := 0; i < 300 && image == 0; i++ {
		time.Sleep(20 * time.Millisecond)
		for _, pid := range descendants(cmd.Process.Pid) {
			if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); exe == prog {
				image = pid
			}
		}
	}
	if image == 0 {
		cmd.Process.Kill()
		t.Fatal("the image never started")
	}
	time.Sleep(1500 * time.Millisecond) // entered, and well into paging
	cmd.Process.Kill()
	cmd.Wait()
	if !exitsWithin(image, 5*time.Second) {
		syscall.Kill(image, syscall.SIGKILL)
		t.Fatalf("image %d still running 5 s after farmem was killed", image)
	}
	if out, _ := os.ReadFile(outFile); strings.Contains(string(out), "BAD") {
		t.Fatalf("the image read a page that was not its own before it died: %s", out)
	}
}
