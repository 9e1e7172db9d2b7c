package seccomp

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// childEnv makes the test binary, started again, the notified child of TestNotification.
const childEnv = "FARMEM_SECCOMP_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(notifiedChild())
	}
	os.Exit(m.Run())
}

// notifiedChild installs a filter that notifies getppid on its own thread, prints its pid, its
// thread id and the listener's descriptor, then prints what getppid returned.
func notifiedChild() int {
	runtime.LockOSThread() // the filter, without TSYNC, is this thread's alone
	const retUserNotif, retAllow = 0x7fc00000, 0x7fff0000
	prog := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 0, Jf: 1, K: unix.SYS_GETPPID},
		{Code: unix.BPF_RET | unix.BPF_K, K: retUserNotif},
		{Code: unix.BPF_RET | unix.BPF_K, K: retAllow},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		fmt.Println("error", err)
		return 1
	}
	fd, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&fprog)))
	if e != 0 {
		fmt.Println("error", e)
		return 1
	}
	fmt.Println(os.Getpid(), unix.Gettid(), fd)
	r, _, _ := unix.RawSyscall(unix.SYS_GETPPID, 0, 0, 0)
	fmt.Println(int64(r))
	return 0
}

// A notified call reaches the supervisor with its number, its thread and its arguments, is
// pending until answered, and returns the answer's value to the caller.
func TestNotification(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("taking the child's listener (pidfd_getfd) needs root")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Wait()
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(out)
	if !lines.Scan() {
		t.Fatal("the child said nothing")
	}
	var pid, tid, childFd int
	if _, err := fmt.Sscan(lines.Text(), &pid, &tid, &childFd); err != nil {
		t.Fatalf("child: %q", lines.Text())
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pidfd)
	fd, err := unix.PidfdGetfd(pidfd, childFd, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)

	var n Notif
	if err := Receive(fd, &n); err != nil {
		t.Fatalf("Receive: %v", err)
	}
	if n.Data.Nr != unix.SYS_GETPPID || int(n.Pid) != tid || n.Data.Arch != unix.AUDIT_ARCH_X86_64 {
		t.Fatalf("notification %+v, want getppid (%d) from thread %d", n, unix.SYS_GETPPID, tid)
	}
	if !IDValid(fd, n.ID) {
		t.Fatal("IDValid is false for a call still waiting for its answer")
	}
	if IDValid(fd, n.ID+1) {
		t.Fatal("IDValid is true for an id never notified")
	}
	if err := Respond(fd, &Resp{ID: n.ID, Val: 4242}); err != nil {
		t.Fatalf("Respond: %v", err)
	}
	if !lines.Scan() {
		t.Fatal("the child did not say what getppid returned")
	}
	if got := strings.TrimSpace(lines.Text()); got != strconv.Itoa(4242) {
		t.Fatalf("getppid returned %s in the child, want the answer 4242", got)
	}
	if IDValid(fd, n.ID) {
		t.Fatal("IDValid is true for a call already answered")
	}
	if err := Respond(fd, &Resp{ID: n.ID, Val: 1}); err != unix.ENOENT {
		t.Fatalf("a second answer: %v, want ENOENT", err)
	}
}
