package inject

import (
	"errors"
	"fmt"
	"os/exec"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ErrWrongThread is returned by a Tracee's methods called from an OS thread other than the one
// that started it: the kernel would refuse the request (see the package doc, "One thread").
var ErrWrongThread = errors.New("inject: ptrace request from a thread that is not the tracer (runtime.LockOSThread)")

// ErrDetached is returned by a Tracee's methods after Detach.
var ErrDetached = errors.New("inject: the process was detached")

// ExitedError is returned when the tracee ended (exited or was killed) while farmem was working
// in it.
type ExitedError struct {
	Pid    int
	Status unix.WaitStatus
}

func (e *ExitedError) Error() string {
	if e.Status.Signaled() {
		return fmt.Sprintf("process %d was killed by signal %d", e.Pid, e.Status.Signal())
	}
	return fmt.Sprintf("process %d exited with status %d", e.Pid, e.Status.ExitStatus())
}

// Tracee is a process stopped under ptrace by the calling thread.
type Tracee struct {
	pid      int
	tracer   int           // the thread that may issue ptrace requests
	kept     []unix.Signal // signals that stopped the tracee while we worked in it, for Detach
	ended    *ExitedError  // set once the tracee is gone
	detached bool
}

// Start starts cmd (not yet started) traced by the calling thread, which must be locked to its
// goroutine (runtime.LockOSThread) and stay so until Detach, and returns it stopped at the
// first instruction of the new program: after execve, before anything of the program ran.
// cmd's SysProcAttr is kept, with Ptrace set.
func Start(cmd *exec.Cmd) (*Tracee, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Ptrace = true // PTRACE_TRACEME in the child: the exec then stops it with SIGTRAP
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	t := &Tracee{pid: cmd.Process.Pid, tracer: unix.Gettid()}
	if err := t.wait(); err != nil {
		return nil, err
	}
	return t, nil
}

// Pid returns the tracee's pid.
func (t *Tracee) Pid() int { return t.pid }

// check reports ErrWrongThread off the tracer's thread, and the tracee's end once it is gone.
func (t *Tracee) check() error {
	if unix.Gettid() != t.tracer {
		return ErrWrongThread
	}
	if t.ended != nil {
		return t.ended
	}
	if t.detached {
		return ErrDetached
	}
	return nil
}

// wait waits for the tracee's next SIGTRAP stop, keeping any other signal that stops it for
// Detach and resuming it with resume (nil: leave it stopped and report the signal as kept).
func (t *Tracee) wait() error { return t.waitTrap(nil) }

func (t *Tracee) waitTrap(resume func() error) error {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(t.pid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("inject: wait for process %d: %w", t.pid, err)
		}
		if ws.Exited() || ws.Signaled() {
			t.ended = &ExitedError{Pid: t.pid, Status: ws}
			return t.ended
		}
		if !ws.Stopped() {
			continue
		}
		if ws.StopSignal() == unix.SIGTRAP {
			return nil
		}
		// Another signal (a Ctrl-C, a SIGCHLD) stopped it first: keep it for Detach, go on.
		t.kept = append(t.kept, ws.StopSignal())
		if resume == nil {
			return fmt.Errorf("inject: process %d stopped by signal %v instead of SIGTRAP", t.pid, ws.StopSignal())
		}
		if err := resume(); err != nil {
			return err
		}
	}
}

// Poll returns the tracee's end (an *ExitedError) if it has exited or been killed while held
// stopped (a thread of its own, which farmem does not trace, may end it), else nil.
func (t *Tracee) Poll() error {
	if err := t.check(); err != nil {
		return err
	}
	var ws unix.WaitStatus
	pid, err := unix.Wait4(t.pid, &ws, unix.WALL|unix.WNOHANG, nil)
	if err == nil && pid == t.pid && (ws.Exited() || ws.Signaled()) {
		t.ended = &ExitedError{Pid: t.pid, Status: ws}
		return t.ended
	}
	return nil
}

// Regs returns the stopped thread's registers.
func (t *Tracee) Regs() (unix.PtraceRegs, error) {
	var r unix.PtraceRegs
	if err := t.check(); err != nil {
		return r, err
	}
	if err := unix.PtraceGetRegs(t.pid, &r); err != nil {
		return r, t.fail("PTRACE_GETREGS", err)
	}
	return r, nil
}

// fail names a failed ptrace request; ESRCH from a tracee that should be stopped means it was
// killed meanwhile: then its end is reaped and returned.
func (t *Tracee) fail(op string, err error) error {
	if err == unix.ESRCH {
		// Not waited for without end: a process's main thread is reported only once its other
		// threads are reaped, and those a Group held are reported to us, not waited for here.
		var ws unix.WaitStatus
		for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
			pid, werr := unix.Wait4(t.pid, &ws, unix.WALL|unix.WNOHANG, nil)
			if werr == unix.EINTR || (werr == nil && pid == 0) {
				time.Sleep(time.Millisecond)
				continue
			}
			if werr == nil && (ws.Exited() || ws.Signaled()) {
				t.ended = &ExitedError{Pid: t.pid, Status: ws}
				return t.ended
			}
			break
		}
	}
	return fmt.Errorf("inject: %s: %w", op, err)
}

// setRegs sets the stopped thread's registers.
func (t *Tracee) setRegs(r *unix.PtraceRegs) error {
	if err := unix.PtraceSetRegs(t.pid, r); err != nil {
		return t.fail("PTRACE_SETREGS", err)
	}
	return nil
}

// Syscall makes system call nr with args (at most six) in the tracee, as its stopped thread,
// and returns the result. A result between -4095 and -1 is the call's errno, returned as a
// unix.Errno. Every register and the text it borrowed are restored before it returns.
func (t *Tracee) Syscall(nr uintptr, args ...uint64) (uint64, error) {
	if len(args) > 6 {
		return 0, fmt.Errorf("inject: %d arguments to a system call (at most 6)", len(args))
	}
	if err := t.check(); err != nil {
		return 0, err
	}
	saved, err := t.Regs()
	if err != nil {
		return 0, err
	}
	// The aligned word(s) holding the two bytes at rip: PTRACE_PEEKTEXT reads whole words, and
	// one that starts at rip could run past the end of the text's last page.
	ip := uintptr(saved.Rip)
	base := ip &^ 7
	words := 8
	if ip-base > 6 {
		words = 16
	}
	orig := make([]byte, words)
	if _, err := unix.PtracePeekText(t.pid, base, orig); err != nil {
		return 0, t.fail(fmt.Sprintf("PTRACE_PEEKTEXT at %#x", base), err)
	}
	code := append([]byte(nil), orig...)
	code[ip-base], code[ip-base+1] = 0x0f, 0x05 // syscall
	if _, err := unix.PtracePokeText(t.pid, base, code); err != nil {
		return 0, t.fail(fmt.Sprintf("PTRACE_POKETEXT at %#x", base), err)
	}
	r := saved
	setArgs(&r, nr, args)
	res, err := t.step(&r)
	// A signal that interrupts a blocking call leaves it one of the kernel's restart codes, which
	// the kernel turns into the call made again once it has handled the signal. A single step
	// traps at the call's exit, before that: the code would reach the caller, which no program
	// ever sees. So the call is made again, as the kernel would; on the way the signal stops the
	// tracee first, and waitTrap keeps it for Detach.
	for tries := 0; err == nil && restartCode(res) && tries < maxRestarts; tries++ {
		r = saved
		setArgs(&r, nr, args)
		res, err = t.step(&r)
	}
	// Put everything back even if the step failed, unless the tracee is gone.
	if t.ended == nil {
		if _, perr := unix.PtracePokeText(t.pid, base, orig); perr != nil && err == nil {
			err = fmt.Errorf("inject: restoring the text at %#x: %w", base, perr)
		}
		if serr := t.setRegs(&saved); serr != nil && err == nil {
			err = serr
		}
	}
	if err != nil {
		return 0, err
	}
	if int64(res) < 0 && int64(res) > -4096 {
		return res, unix.Errno(-int64(res))
	}
	return res, nil
}

// maxRestarts bounds how many times Syscall makes one call again after signals interrupted it.
const maxRestarts = 64

// restartCode reports whether res is one of the kernel's internal restart codes
// (include/linux/errno.h: ERESTARTSYS, ERESTARTNOINTR, ERESTARTNOHAND, ERESTART_RESTARTBLOCK).
func restartCode(res uint64) bool {
	switch int64(res) {
	case -512, -513, -514, -516:
		return true
	}
	return false
}

func setArgs(r *unix.PtraceRegs, nr uintptr, args []uint64) {
	var a [6]uint64
	copy(a[:], args)
	r.Rax, r.Orig_rax = uint64(nr), ^uint64(0)
	r.Rdi, r.Rsi, r.Rdx, r.R10, r.R8, r.R9 = a[0], a[1], a[2], a[3], a[4], a[5]
}

// step sets r and single-steps the stopped thread over one instruction; it returns rax after.
func (t *Tracee) step(r *unix.PtraceRegs) (uint64, error) {
	if err := t.setRegs(r); err != nil {
		return 0, err
	}
	after, err := t.runToTrap(func() error {
		if err := unix.PtraceSingleStep(t.pid); err != nil {
			return t.fail("PTRACE_SINGLESTEP", err)
		}
		return nil
	})
	return after.Rax, err
}

// runToTrap resumes the stopped thread with resume, waits for its next trap (resuming it again
// past any other stop, see waitTrap) and returns its registers there.
func (t *Tracee) runToTrap(resume func() error) (unix.PtraceRegs, error) {
	var after unix.PtraceRegs
	if err := resume(); err != nil {
		return after, err
	}
	if err := t.waitTrap(resume); err != nil {
		return after, err
	}
	if err := unix.PtraceGetRegs(t.pid, &after); err != nil {
		return after, t.fail("PTRACE_GETREGS", err)
	}
	return after, nil
}

// Call runs the tracee's stopped thread from rip, with stack pointer rsp, system call number
// nr in rax and args in the system call argument registers (rdi, rsi, rdx, r10, r8, r9), until
// it executes an int3; it returns rax then, and restores every register. The code at rip must
// be the tracee's own (an agent mapped into it) and must end in int3 on every path this thread
// takes.
func (t *Tracee) Call(rip, rsp uint64, nr uintptr, args ...uint64) (uint64, error) {
	if len(args) > 6 {
		return 0, fmt.Errorf("inject: %d arguments to a call (at most 6)", len(args))
	}
	saved, err := t.Regs()
	if err != nil {
		return 0, err
	}
	r := saved
	setArgs(&r, nr, args)
	r.Rip, r.Rsp = rip, rsp
	if err := t.setRegs(&r); err != nil {
		return 0, err
	}
	after, err := t.runToTrap(func() error {
		if err := unix.PtraceCont(t.pid, 0); err != nil {
			return t.fail("PTRACE_CONT", err)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if err := t.setRegs(&saved); err != nil {
		return 0, err
	}
	return after.Rax, nil
}

// Write writes b into the tracee's memory at addr (process_vm_writev: the pages must be
// writable in the tracee).
func (t *Tracee) Write(addr uint64, b []byte) error {
	return t.transfer(unix.ProcessVMWritev, "writing", addr, b)
}

// Read reads len(b) bytes of the tracee's memory at addr (process_vm_readv).
func (t *Tracee) Read(addr uint64, b []byte) error {
	return t.transfer(unix.ProcessVMReadv, "reading", addr, b)
}

// transfer moves b to or from the tracee's memory at addr with rw (process_vm_writev or
// process_vm_readv), until all of it has gone: either call may move less than asked.
func (t *Tracee) transfer(rw func(int, []unix.Iovec, []unix.RemoteIovec, uint) (int, error), what string, addr uint64, b []byte) error {
	if err := t.check(); err != nil {
		return err
	}
	for len(b) > 0 {
		local := []unix.Iovec{{Base: &b[0]}}
		local[0].SetLen(len(b))
		remote := []unix.RemoteIovec{{Base: uintptr(addr), Len: len(b)}}
		n, err := rw(t.pid, local, remote, 0)
		if err != nil {
			return fmt.Errorf("inject: %s %d bytes at %#x: %w", what, len(b), addr, err)
		}
		if n == 0 {
			return fmt.Errorf("inject: %s %d bytes at %#x: nothing moved", what, len(b), addr)
		}
		b, addr = b[n:], addr+uint64(n)
	}
	return nil
}

// TakeFD returns a duplicate, in farmem, of the tracee's descriptor fd (pidfd_getfd), close on
// exec. The tracee keeps its own.
func (t *Tracee) TakeFD(fd int) (int, error) {
	if err := t.check(); err != nil {
		return -1, err
	}
	pfd, err := unix.PidfdOpen(t.pid, 0)
	if err != nil {
		return -1, fmt.Errorf("inject: pidfd_open(%d): %w", t.pid, err)
	}
	defer unix.Close(pfd)
	nfd, err := unix.PidfdGetfd(pfd, fd, 0) // the new fd is close-on-exec
	if err != nil {
		return -1, fmt.Errorf("inject: pidfd_getfd(%d, fd %d): %w", t.pid, fd, err)
	}
	return nfd, nil
}

// Detach lets the tracee go (PTRACE_DETACH), delivering the first signal that stopped it while
// it was held, and sending the others after.
func (t *Tracee) Detach() error {
	if err := t.check(); err != nil {
		return err
	}
	sig := 0
	if len(t.kept) > 0 {
		sig = int(t.kept[0])
	}
	if _, _, e := unix.Syscall6(unix.SYS_PTRACE, unix.PTRACE_DETACH, uintptr(t.pid), 0, uintptr(sig), 0, 0); e != 0 {
		return fmt.Errorf("inject: PTRACE_DETACH: %w", e)
	}
	for _, s := range t.kept[min(1, len(t.kept)):] {
		unix.Kill(t.pid, s)
	}
	t.kept = nil
	t.detached = true
	return nil
}

// Kill kills the tracee (SIGKILL) and waits for its end, unless it has ended or was let go
// already. A tracee is told of by its tracer first: a parent other than farmem reaps it after.
func (t *Tracee) Kill() {
	unix.Kill(t.pid, unix.SIGKILL)
	if t.ended != nil || t.detached {
		return
	}
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(t.pid, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err == nil && !ws.Exited() && !ws.Signaled() {
			continue // a stop it was in already
		}
		t.ended = &ExitedError{Pid: t.pid, Status: ws}
		return
	}
}

// Kept returns the signals that stopped the tracee while it was held (Detach delivers them).
func (t *Tracee) Kept() []unix.Signal { return t.kept }
