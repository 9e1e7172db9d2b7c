package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// openPty returns a new pseudo-terminal's master and its slave.
func openPty(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Skipf("no pseudo-terminals: %v", err)
	}
	if err := unix.IoctlSetPointerInt(int(m.Fd()), unix.TIOCSPTLCK, 0); err != nil {
		t.Fatal(err)
	}
	n, err := unix.IoctlGetUint32(int(m.Fd()), unix.TIOCGPTN)
	if err != nil {
		t.Fatal(err)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	return m, s
}

// The program counts the SIGINTs it gets and says so; SIGTERM makes it say the total and exit.
const sigintCounter = `
import signal, sys, time
n = 0
def on_int(s, f):
    global n
    n += 1
    print("INT", n, flush=True)
def on_term(s, f):
    print("TERM", n, flush=True)
    sys.exit(0)
signal.signal(signal.SIGINT, on_int)
signal.signal(signal.SIGTERM, on_term)
ignored = int([l for l in open("/proc/self/status") if l.startswith("SigIgn:")][0].split()[1], 16)
print("SIGTTOU", "ignored" if ignored & (1 << (signal.SIGTTOU - 1)) else "default", flush=True)
print("ready", flush=True)
while True:
    time.sleep(0.05)
`

// On a terminal, the keys a user types reach the program once, as without farmem: Ctrl-C is one
// SIGINT, not one from the terminal and one forwarded by farmem; a SIGINT sent to farmem itself
// is forwarded, once; and Ctrl-Z stops the job (farmem stops with the program) until it is
// continued, when the terminal is the program's again. The program starts with the signal
// dispositions it would have without farmem.
func TestTerminalSignalsReachTheProgramOnce(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 not installed")
	}
	checkTerminalSignals(t, "python3", "-c", sigintCounter)
}

// The same for a static program, whose parent thread in farmem waits for it between the ptrace
// work it does for it (launcher/tracer.go): a Go program built without cgo.
func TestStaticTerminalSignals(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(goruntime.GOROOT(), "bin", "go")
	}
	prog := filepath.Join(t.TempDir(), "sigcount")
	cmd := exec.Command(gobin, "build", "-o", prog, "./testdata/sigcount")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the static Go program: %v\n%s", err, b)
	}
	checkTerminalSignals(t, prog)
}

// checkTerminalSignals runs argv (a program that behaves as sigintCounter) under farmem on a
// pseudo-terminal and checks what TestTerminalSignalsReachTheProgramOnce says.
func checkTerminalSignals(t *testing.T, argv ...string) {
	master, slave := openPty(t)
	defer master.Close()
	// farmem as a shell would start it: the leader of a session whose controlling terminal is
	// the pty, in the terminal's foreground process group. We wait for it ourselves (to see it
	// stop), so it is started with StartProcess rather than exec.Cmd.
	proc, err := os.StartProcess(farmemBin(t), append([]string{"farmem", "run", "--local-mem", "64MiB", "--quiet", "--"},
		argv...), &os.ProcAttr{
		Env:   cleanEnv(),
		Files: []*os.File{slave, slave, slave},
		Sys:   &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0},
	})
	slave.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer proc.Kill()
	lines := make(chan string, 64)
	go func() {
		sc := bufio.NewScanner(master)
		for sc.Scan() {
			l := strings.TrimSpace(sc.Text())
			for strings.HasPrefix(l, "^") && len(l) >= 2 { // the terminal echoes the keys: ^C, ^Z
				l = l[2:]
			}
			lines <- l
		}
		close(lines)
	}()
	expect := func(want string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("the terminal closed before %q", want)
				}
				t.Logf("terminal: %s", l)
				if l == want {
					return
				}
				if strings.HasPrefix(l, "INT ") || strings.HasPrefix(l, "TERM ") {
					t.Fatalf("the program said %q, want %q", l, want)
				}
			case <-deadline:
				t.Fatalf("the program never said %q", want)
			}
		}
	}
	expect("SIGTTOU default") // the program's signal dispositions are its own, not farmem's
	expect("ready")
	master.Write([]byte{3}) // Ctrl-C
	expect("INT 1")
	if err := proc.Signal(syscall.SIGINT); err != nil { // kill -INT <farmem>
		t.Fatal(err)
	}
	expect("INT 2")

	master.Write([]byte{26}) // Ctrl-Z: the program stops, and farmem with it
	var ws unix.WaitStatus
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		pid, err := unix.Wait4(proc.Pid, &ws, unix.WUNTRACED|unix.WNOHANG, nil)
		if err != nil || (pid == proc.Pid && !ws.Stopped()) {
			t.Fatalf("after Ctrl-Z farmem ended (%v, %v), want it stopped", ws, err)
		}
		if pid == proc.Pid {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("farmem did not stop on Ctrl-Z")
		}
	}
	if err := proc.Signal(syscall.SIGCONT); err != nil { // fg
		t.Fatal(err)
	}
	master.Write([]byte{3}) // the terminal is the program's again
	expect("INT 3")

	if err := proc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	expect("TERM 3") // no SIGINT came twice, however late
	if _, err := unix.Wait4(proc.Pid, &ws, 0, nil); err != nil || !ws.Exited() || ws.ExitStatus() != 0 {
		t.Fatalf("farmem ended %v (%v), want the program's status 0", ws, err)
	}
}
