package inject

import (
	"bufio"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/seccomp"
)

// The tracee is this test binary itself, run again with helperEnv set: a Go program built
// without cgo, so statically linked, like the programs the package is for.
const helperEnv = "FARMEM_INJECT_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		os.Exit(m.Run())
	case "fork", "badclone":
		forker(os.Getenv(helperEnv))
	case "sleeper":
		sleeper()
	}
	os.Stdout.WriteString("helper ran\n")
	os.Exit(7)
}

// forker is the helper of the CatchFork tests: it puts a seccomp filter that holds its fork and
// clone calls for a supervisor on its thread, prints the filter's listener, and forks (the child
// exits 42 at once) or makes a clone the kernel refuses (EINVAL), then says how it went.
func forker(mode string) {
	runtime.LockOSThread()
	filter := []unix.SockFilter{
		{Code: unix.BPF_LD | unix.BPF_W | unix.BPF_ABS, K: 0}, // seccomp_data.nr
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 2, K: unix.SYS_FORK},
		{Code: unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K, Jt: 1, K: unix.SYS_CLONE},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_ALLOW},
		{Code: unix.BPF_RET | unix.BPF_K, K: unix.SECCOMP_RET_USER_NOTIF},
	}
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	fd, _, e := unix.RawSyscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&prog)))
	if e != 0 {
		fmt.Printf("seccomp: %v\n", e)
		os.Exit(1)
	}
	fmt.Printf("%d\n", fd)
	if mode == "badclone" {
		_, _, e := unix.RawSyscall(unix.SYS_CLONE, unix.CLONE_THREAD, 0, 0) // no CLONE_SIGHAND: EINVAL
		// Blocked in another call for a while: how CatchFork learns that no child came.
		time.Sleep(300 * time.Millisecond)
		fmt.Printf("clone: %v\n", e)
		os.Exit(0)
	}
	pid, _, e := unix.RawSyscall(unix.SYS_FORK, 0, 0, 0)
	if e == 0 && pid == 0 {
		unix.RawSyscall(unix.SYS_EXIT_GROUP, 42, 0, 0)
	}
	var ws unix.WaitStatus
	unix.Wait4(int(pid), &ws, 0, nil)
	fmt.Printf("child %d exit %d\n", pid, ws.ExitStatus())
	os.Exit(0)
}

// startForker starts the forker in mode and returns it, its output, and its filter's listener.
func startForker(t *testing.T, mode string) (*exec.Cmd, *bufio.Reader, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"="+mode)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	theirs, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		t.Fatalf("the forker said %q (%v)", line, err)
	}
	pfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(pfd)
	listener, err := unix.PidfdGetfd(pfd, theirs, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(listener) })
	return cmd, r, listener
}

// held waits for the forker's held call and returns it and a proceed that lets it go on.
//
// The forker is a Go program blocked in a raw system call, which its runtime takes for a
// goroutine running too long and interrupts with a preemption signal: the held call is then
// withdrawn (ENOENT here), and the kernel makes it again, held anew.
func held(t *testing.T, listener int) (seccomp.Notif, func() error) {
	t.Helper()
	var n seccomp.Notif
	for {
		err := seccomp.Receive(listener, &n)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) {
			t.Fatal(err)
		}
	}
	return n, func() error { return seccomp.Respond(listener, &seccomp.Resp{ID: n.ID, Flags: seccomp.FlagContinue}) }
}

// start starts the helper stopped at its first instruction on the calling goroutine's locked
// thread; the thread is unlocked when the test ends.
func start(t *testing.T) (*Tracee, *exec.Cmd) {
	t.Helper()
	runtime.LockOSThread()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=1")
	tr, err := Start(cmd)
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		unix.Kill(tr.Pid(), unix.SIGKILL)
		var ws unix.WaitStatus
		unix.Wait4(tr.Pid(), &ws, unix.WALL, nil)
		runtime.UnlockOSThread()
	})
	return tr, cmd
}

// finish detaches the helper and returns how it ended.
func finish(t *testing.T, tr *Tracee) unix.WaitStatus {
	t.Helper()
	if err := tr.Detach(); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(tr.Pid(), &ws, 0, nil); err != nil {
		t.Fatalf("wait: %v", err)
	}
	return ws
}

func entryPoint(t *testing.T) uint64 {
	t.Helper()
	f, err := elf.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC {
		t.Skipf("the test binary is %v, not a fixed-address executable: its entry moves", f.Type)
	}
	return f.Entry
}

func TestStartStopsAtFirstInstruction(t *testing.T) {
	tr, _ := start(t)
	r, err := tr.Regs()
	if err != nil {
		t.Fatal(err)
	}
	if want := entryPoint(t); r.Rip != want {
		t.Fatalf("stopped at %#x, the program's entry point is %#x", r.Rip, want)
	}
	if ws := finish(t, tr); !ws.Exited() || ws.ExitStatus() != 7 {
		t.Fatalf("the helper ended with %v, want exit status 7", ws)
	}
}

// mmapPage maps one page in the tracee with prot and returns its address.
func mmapPage(t *testing.T, tr *Tracee, prot int) uint64 {
	t.Helper()
	addr, err := tr.Syscall(unix.SYS_MMAP, 0, 4096, uint64(prot), unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uint64(0), 0)
	if err != nil {
		t.Fatalf("mmap in the tracee: %v", err)
	}
	return addr
}

func TestSyscallLeavesNoTrace(t *testing.T) {
	tr, _ := start(t)
	before, _ := tr.Regs()
	text := make([]byte, 16)
	if _, err := unix.PtracePeekText(tr.Pid(), uintptr(before.Rip), text); err != nil {
		t.Fatal(err)
	}
	pid, err := tr.Syscall(unix.SYS_GETPID)
	if err != nil || int(pid) != tr.Pid() {
		t.Fatalf("getpid in the tracee = %d, %v; want %d", pid, err, tr.Pid())
	}
	after, _ := tr.Regs()
	if after != before {
		t.Fatalf("registers changed:\nbefore %+v\nafter  %+v", before, after)
	}
	again := make([]byte, 16)
	unix.PtracePeekText(tr.Pid(), uintptr(before.Rip), again)
	if string(again) != string(text) {
		t.Fatalf("text at rip changed: % x, was % x", again, text)
	}
	if ws := finish(t, tr); !ws.Exited() || ws.ExitStatus() != 7 {
		t.Fatalf("the helper ended with %v after the syscall, want exit status 7", ws)
	}
}

func TestSyscallErrno(t *testing.T) {
	tr, _ := start(t)
	if _, err := tr.Syscall(unix.SYS_CLOSE, 12345); !errors.Is(err, unix.EBADF) {
		t.Fatalf("close(12345) in the tracee: %v, want EBADF", err)
	}
	if _, err := tr.Syscall(unix.SYS_GETPID, 1, 2, 3, 4, 5, 6, 7); err == nil {
		t.Fatal("seven arguments accepted")
	}
}

// A blocking call made in the tracee that a signal interrupts is made again, as the kernel
// would restart it: the caller never sees the kernel's internal ERESTARTSYS. The signal
// (SIGWINCH, ignored by default) is kept, and the call returns what it was waiting for.
func TestSyscallRestartsAfterASignal(t *testing.T) {
	tr, _ := start(t)
	page := mmapPage(t, tr, unix.PROT_READ|unix.PROT_WRITE)
	if _, err := tr.Syscall(unix.SYS_PIPE2, page, 0); err != nil {
		t.Fatalf("pipe2 in the tracee: %v", err)
	}
	fds := make([]byte, 8)
	if err := tr.Read(page, fds); err != nil {
		t.Fatal(err)
	}
	rfd, wfd := binary.LittleEndian.Uint32(fds), binary.LittleEndian.Uint32(fds[4:])
	pid := tr.Pid()
	done := make(chan error, 1)
	go func() {
		// While the read below waits: a signal first, then something to read.
		time.Sleep(200 * time.Millisecond)
		unix.Kill(pid, unix.SIGWINCH)
		time.Sleep(200 * time.Millisecond)
		w, err := os.OpenFile(fmt.Sprintf("/proc/%d/fd/%d", pid, wfd), os.O_WRONLY, 0)
		if err == nil {
			_, err = w.Write([]byte{42})
			w.Close()
		}
		done <- err
	}()
	n, err := tr.Syscall(unix.SYS_READ, uint64(rfd), page+64, 1)
	if werr := <-done; werr != nil {
		t.Fatalf("writing into the tracee's pipe: %v", werr)
	}
	if err != nil || n != 1 {
		t.Fatalf("read in the tracee, interrupted by a signal: %d, %v; want 1 byte", n, err)
	}
	b := make([]byte, 1)
	if err := tr.Read(page+64, b); err != nil || b[0] != 42 {
		t.Fatalf("the tracee read %v (%v), want 42", b, err)
	}
}

func TestWriteReadMemory(t *testing.T) {
	tr, _ := start(t)
	page := mmapPage(t, tr, unix.PROT_READ|unix.PROT_WRITE)
	want := []byte("far memory, written from outside")
	if err := tr.Write(page+100, want); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(want))
	if err := tr.Read(page+100, got); err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("read back %q, wrote %q", got, want)
	}
	// The tracee sees it too: write(2) of it to a pipe farmem reads.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	fds := make([]byte, 8)
	if _, err := tr.Syscall(unix.SYS_PIPE2, page, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	tr.Read(page, fds)
	rd, wr := binary.LittleEndian.Uint32(fds), binary.LittleEndian.Uint32(fds[4:])
	if n, err := tr.Syscall(unix.SYS_WRITE, uint64(wr), page+100, uint64(len(want))); err != nil || n != uint64(len(want)) {
		t.Fatalf("write in the tracee: %d, %v", n, err)
	}
	mine, err := tr.TakeFD(int(rd))
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(mine)
	buf := make([]byte, 64)
	n, err := unix.Read(mine, buf)
	if err != nil || string(buf[:n]) != string(want) {
		t.Fatalf("read from the tracee's pipe through the taken fd: %q, %v", buf[:n], err)
	}
	if err := tr.Write(0, []byte{1}); err == nil {
		t.Fatal("a write at address 0 succeeded")
	}
}

func TestTakeFDBad(t *testing.T) {
	tr, _ := start(t)
	if _, err := tr.TakeFD(999); !errors.Is(err, unix.EBADF) {
		t.Fatalf("TakeFD(999): %v, want EBADF", err)
	}
}

// TestCall runs code put into the tracee: getpid, then int3.
func TestCall(t *testing.T) {
	tr, _ := start(t)
	code := mmapPage(t, tr, unix.PROT_READ|unix.PROT_WRITE)
	stack := mmapPage(t, tr, unix.PROT_READ|unix.PROT_WRITE)
	if err := tr.Write(code, []byte{0x0f, 0x05, 0xcc}); err != nil { // syscall; int3
		t.Fatal(err)
	}
	if _, err := tr.Syscall(unix.SYS_MPROTECT, code, 4096, unix.PROT_READ|unix.PROT_EXEC); err != nil {
		t.Fatal(err)
	}
	before, _ := tr.Regs()
	pid, err := tr.Call(code, stack+4096, unix.SYS_GETPID)
	if err != nil || int(pid) != tr.Pid() {
		t.Fatalf("Call(getpid) = %d, %v; want %d", pid, err, tr.Pid())
	}
	if after, _ := tr.Regs(); after != before {
		t.Fatalf("registers changed by Call")
	}
	if ws := finish(t, tr); !ws.Exited() || ws.ExitStatus() != 7 {
		t.Fatalf("the helper ended with %v, want exit status 7", ws)
	}
}

// A signal that arrives while the tracee is held is delivered when it is let go: the helper,
// at its first instruction with no handler yet, dies of it.
func TestKeptSignalDeliveredAtDetach(t *testing.T) {
	tr, _ := start(t)
	unix.Kill(tr.Pid(), unix.SIGUSR1)
	if _, err := tr.Syscall(unix.SYS_GETPID); err != nil {
		t.Fatal(err)
	}
	if k := tr.Kept(); len(k) != 1 || k[0] != unix.SIGUSR1 {
		t.Fatalf("kept %v, want [SIGUSR1]", k)
	}
	if ws := finish(t, tr); !ws.Signaled() || ws.Signal() != unix.SIGUSR1 {
		t.Fatalf("the helper ended with %v, want killed by SIGUSR1", ws)
	}
}

func TestWrongThread(t *testing.T) {
	tr, _ := start(t)
	errc := make(chan error)
	go func() {
		runtime.LockOSThread() // surely another thread than the tracer's
		defer runtime.UnlockOSThread()
		_, err := tr.Syscall(unix.SYS_GETPID)
		errc <- err
	}()
	if err := <-errc; !errors.Is(err, ErrWrongThread) {
		t.Fatalf("Syscall from another thread: %v, want ErrWrongThread", err)
	}
}

func TestTraceeGone(t *testing.T) {
	tr, _ := start(t)
	unix.Kill(tr.Pid(), unix.SIGKILL)
	_, err := tr.Syscall(unix.SYS_GETPID)
	var ex *ExitedError
	if !errors.As(err, &ex) || !ex.Status.Signaled() || ex.Status.Signal() != unix.SIGKILL {
		t.Fatalf("Syscall on a killed tracee: %v, want it killed by SIGKILL", err)
	}
	if _, err := tr.Syscall(unix.SYS_GETPID); !errors.As(err, &ex) {
		t.Fatalf("second Syscall on a killed tracee: %v", err)
	}
}

// CatchFork returns the child of a held fork stopped at its birth, in fork's return to the child
// (rax 0), a child of the forker; let go, it runs on (it exits 42, which the forker reports).
func TestCatchFork(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd, out, listener := startForker(t, "fork")
	n, proceed := held(t, listener)
	if n.Data.Nr != unix.SYS_FORK {
		t.Fatalf("held call %d, want fork", n.Data.Nr)
	}
	child, err := CatchFork(int(n.Pid), proceed)
	if err != nil {
		t.Fatalf("CatchFork: %v", err)
	}
	r, err := child.Regs()
	if err != nil || r.Rax != 0 {
		t.Fatalf("the child at its birth: rax %d, %v; want fork's 0", r.Rax, err)
	}
	if ppid, err := child.Syscall(unix.SYS_GETPPID); err != nil || int(ppid) != cmd.Process.Pid {
		t.Fatalf("the child's parent is %d (%v), want the forker %d", ppid, err, cmd.Process.Pid)
	}
	if err := child.Detach(); err != nil {
		t.Fatal(err)
	}
	line, _ := out.ReadString('\n')
	if want := fmt.Sprintf("child %d exit 42\n", child.Pid()); line != want {
		t.Fatalf("the forker said %q, want %q", line, want)
	}
}

// A held clone the kernel refuses makes no child: CatchFork says so, and the thread goes on
// undisturbed.
func TestCatchForkNoChild(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd, out, listener := startForker(t, "badclone")
	n, proceed := held(t, listener)
	if _, err := CatchFork(int(n.Pid), proceed); !errors.Is(err, ErrNoFork) {
		t.Fatalf("CatchFork of a clone that fails: %v, want ErrNoFork", err)
	}
	if line, _ := out.ReadString('\n'); line != "clone: "+unix.EINVAL.Error()+"\n" {
		t.Fatalf("the forker said %q", line)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the forker: %v", err)
	}
}

func TestStartNotFound(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if _, err := Start(exec.Command("/nonexistent/program")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Start of a missing program: %v", err)
	}
}
