package launcher

import (
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/sys/unix"
)

// The program runs in a process group of its own. When farmem runs in the foreground of a
// terminal, it hands the terminal to the program's group, as a shell hands it to a job: the keys
// a user types (Ctrl-C, Ctrl-\, Ctrl-Z) then reach the program's processes once, exactly as they
// would without farmem, and farmem forwards only the signals sent to farmem itself (kill, a
// supervisor). Were the program in farmem's own group, a Ctrl-C would reach it twice: from the
// terminal and forwarded by farmem (redis takes a second SIGINT as "exit now").
//
// Job control goes through farmem: when the program stops (Ctrl-Z), farmem takes the terminal
// back and stops itself, so that the shell sees its job stopped; when the shell continues
// farmem (fg, bg), farmem gives the terminal back if it is in the foreground again and
// continues the program.

// terminal is the controlling terminal farmem was started in the foreground of.
type terminal struct {
	f *os.File
}

// foregroundTerminal returns farmem's controlling terminal if farmem's process group is its
// foreground group; nil otherwise (no terminal, or farmem runs in the background).
func foregroundTerminal() *terminal {
	f, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return nil
	}
	t := &terminal{f: f}
	if !t.foreground() {
		f.Close()
		return nil
	}
	return t
}

// foreground reports whether farmem's process group is the terminal's foreground group.
func (t *terminal) foreground() bool {
	pg, err := unix.IoctlGetInt(int(t.f.Fd()), unix.TIOCGPGRP)
	return err == nil && pg == unix.Getpgrp()
}

// give makes process group pgid the terminal's foreground group (tcsetpgrp). From the
// background (the program holds the terminal) that would stop farmem with SIGTTOU, so it is
// ignored for the call only: ignored for good, the program farmem starts would inherit it.
func (t *terminal) give(pgid int) {
	signal.Ignore(syscall.SIGTTOU)
	defer signal.Reset(syscall.SIGTTOU)
	unix.IoctlSetPointerInt(int(t.f.Fd()), unix.TIOCSPGRP, pgid)
}

// close gives the terminal back to farmem's process group and closes it.
func (t *terminal) close() {
	t.give(unix.Getpgrp())
	t.f.Close()
}

// attr is how the program is started: in a process group of its own, the terminal's foreground
// group if t is not nil.
func (t *terminal) attr(a *syscall.SysProcAttr) {
	a.Setpgid = true
	if t != nil {
		a.Foreground, a.Ctty = true, int(t.f.Fd())
	}
}

// wait waits for the program (pid, the leader of its own process group) to end, and returns how.
// Each time it stops instead, farmem stops with it and, once continued, continues it.
func (t *terminal) wait(pid int) (unix.WaitStatus, error) {
	for {
		var ws unix.WaitStatus
		_, err := unix.Wait4(pid, &ws, unix.WUNTRACED, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || !ws.Stopped() {
			return ws, err
		}
		t.stopped(pid)
	}
}

// poll is wait without waiting: ended reports whether the program has ended (ws, err: how).
func (t *terminal) poll(pid int) (ws unix.WaitStatus, ended bool, err error) {
	for {
		wpid, err := unix.Wait4(pid, &ws, unix.WUNTRACED|unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ws, true, err
		}
		if wpid == 0 {
			return ws, false, nil
		}
		if !ws.Stopped() {
			return ws, true, nil
		}
		t.stopped(pid)
	}
}

// stopped stops farmem with the program (pid), which has stopped, and continues it once farmem
// is continued.
func (t *terminal) stopped(pid int) {
	if t != nil {
		t.give(unix.Getpgrp())
	}
	unix.Kill(os.Getpid(), unix.SIGSTOP) // returns once the shell continues farmem
	if t != nil && t.foreground() {
		t.give(pid)
	}
	unix.Kill(-pid, unix.SIGCONT)
}
