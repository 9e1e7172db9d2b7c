package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// As root on this kernel farmem doctor finds everything farmem run needs (exit 0, userfaultfd
// and its features ok), and one line a facility; as a user who may not create a userfaultfd it
// says so, how to grant it, and exits 1; an argument is bad usage.
func TestDoctor(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the test compares root with an unprivileged user")
	}
	out, err := exec.Command(farmemBin(t), "doctor").CombinedOutput()
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("farmem doctor as root: %v", err)
	}
	for _, want := range []string{"ok        userfaultfd: ", "ok        userfaultfd features: ", "UFFDIO_MOVE: ", "process_madvise on itself: ",
		"memory cgroup: ", "seccomp user notification: ", "transports: tcp, shm", "ok        process events: ", "farmem run will work here."} {
		if !strings.Contains(string(out), want) {
			t.Errorf("no %q in farmem doctor's answer", want)
		}
	}

	// An unprivileged user, where this machine gives it no userfaultfd.
	if b, _ := os.ReadFile("/proc/sys/vm/unprivileged_userfaultfd"); strings.TrimSpace(string(b)) != "0" {
		t.Skip("vm.unprivileged_userfaultfd lets any user create one")
	}
	if fi, err := os.Stat("/dev/userfaultfd"); err == nil && fi.Mode().Perm()&0o006 != 0 {
		t.Skip("/dev/userfaultfd is open to every user")
	}
	dir, err := os.MkdirTemp("", "farmem-doctor-") // one nobody may enter, which t.TempDir's parent is not
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	bin := filepath.Join(dir, "farmem")
	b, err := os.ReadFile(farmemBin(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, b, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "doctor")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	out, err = cmd.CombinedOutput()
	t.Logf("as nobody: %s", out)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "missing   userfaultfd: cannot create one") ||
		!strings.Contains(string(out), "vm.unprivileged_userfaultfd=1") || !strings.Contains(string(out), "will not work here") {
		t.Fatalf("farmem doctor as nobody: %v; want exit 1 and userfaultfd missing, with how to grant it", err)
	}

	out, err = exec.Command(farmemBin(t), "doctor", "now").CombinedOutput()
	if !errors.As(err, &ee) || ee.ExitCode() != exitFailed || !strings.Contains(string(out), "doctor takes no arguments") {
		t.Fatalf("farmem doctor now: %v, %q; want exit 125", err, out)
	}
}
