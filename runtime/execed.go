package runtime

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// newImageGrace is how long a process whose control connection ended has to say hello again
// as a new image that names farmem's shim in its LD_PRELOAD: a shim says hello from its
// constructor, before the program's main, so a served image does within milliseconds. An image
// that will not (ImageServer.SaysHello) is not waited for.
const newImageGrace = 2 * time.Second

// execPoll is how often ControlEnded looks whether the process has exec'd: its old memory gone
// (memoryGone), or a new image's hello.
const execPoll = time.Millisecond

// ImageServer enters an image a process of the run exec'd that will not load farmem's shim (a
// static binary, or a dynamic one whose LD_PRELOAD was dropped), the way a static program is
// entered (launcher/execed.go). Config.Images; nil: such an image runs without farmem.
type ImageServer interface {
	// SaysHello reports whether process pid's new image is going to say hello itself: it is
	// dynamic, not setuid, and its environment still names farmem's shim and socket.
	SaysHello(pid int) bool
	// Enter freezes process pid, puts farmem's agent into it, attaches it (Attach: which
	// retires the old image's process), installs its mapping filter and, armed, registers
	// its mappings and adopts its present pages, before it runs on. An error says why the
	// image could not be entered; the image then runs on untouched. ErrSaysHello: the image
	// found frozen is one that says hello itself (the process exec'd again meanwhile).
	Enter(pid int) error
}

// ErrSaysHello is Enter's error for an image that loads the shim: it is left to say hello.
var ErrSaysHello = errors.New("the image loads farmem's shim")

// ControlEnded is told that p's control connection with farmem ended: the process exited, or it
// exec'd (the connection is close-on-exec; for a process entered by injection, the connection
// of its agent, whose thread the exec ends). An exit retires p through its pidfd (watchExit); an
// exec into an image that loads the shim retires it with that image's hello (attach). An exec
// into one that does not would leave p in the run for as long as the new image lives, its page
// table counting against the cap pages whose memory went with the old image, and the new image
// uncapped. So once p's memory is gone (memoryGone) while p is still the process of its pid,
// the new image is entered (Config.Images) at once, or after newImageGrace if it was expected
// to say hello and has not. An image that cannot be entered (or a run with no ImageServer) runs
// without farmem: p is retired, and the image named on stderr with the reason and counted
// (Stats.Unserved). Its program is never stopped for it.
func (rt *Runtime) ControlEnded(p *Process) {
	pid := p.Pid()
	if pid == 0 || p.probe == 0 || !p.imageEnded.CompareAndSwap(false, true) {
		return
	}
	go rt.serveImage(pid, p, func() bool { return memoryGone(p.fd, p.probe) })
}

// serveImage serves the image process pid exec'd, or names it: it says hello itself (then
// Attach takes it), or it is entered (Config.Images), at once if it will not load the shim and
// after newImageGrace if it was expected to and has not; one that cannot be entered runs without
// farmem, named on stderr with the reason and counted (Stats.Unserved). old is the process of
// the image it replaced (nil: a vfork child, which had none of its own), retired if the new
// image cannot be entered; execed reports whether the exec happened (the old image's memory is
// gone): until it does, for up to newImageGrace, nothing is decided, and if it never does, the
// connection ended for another reason.
func (rt *Runtime) serveImage(pid int, old *Process, execed func() bool) {
	deadline := time.Now().Add(newImageGrace)
	expectHello := false
	claimed, named := false, false
	defer func() {
		if claimed && !named {
			rt.releaseImage(pid) // served, or gone: the claim need not outlive this
		}
	}()
	reason := "" // why the new image runs without farmem
	for {
		time.Sleep(execPoll)
		if rt.Lookup(pid) != old {
			return // exited and retired, or a new image said hello
		}
		gone := execed()
		if gone && !expectHello && !execComplete(pid) {
			// The old memory went as the exec passed its point of no return, before the
			// new image's environment and auxiliary vector were set up: nothing can be
			// told of it yet (and it cannot be frozen before the exec completes).
			if time.Now().Before(deadline) {
				continue
			}
		}
		if !gone || expectHello {
			if time.Now().Before(deadline) {
				continue
			}
			if !gone {
				return // the memory lives on: not an exec
			}
			break // expected to say hello, and did not
		}
		if !claimed {
			if !rt.claimImage(pid) {
				return // served, or named, from another look at it (lookAmongChildren)
			}
			claimed = true
		}
		if rt.cfg.Images == nil || rt.cfg.Images.SaysHello(pid) {
			expectHello = true
			continue
		}
		// Decided on the image seen a moment ago; Enter looks again once it is frozen.
		err := rt.cfg.Images.Enter(pid)
		if err == nil {
			rt.Stats.Entered.Add(1)
			return
		}
		if errors.Is(err, ErrSaysHello) {
			expectHello = true
			continue
		}
		reason = err.Error()
		break
	}
	if reason == "" && rt.cfg.Images != nil {
		// Expected to say hello, and did not (a setuid loader that ignored the shim).
		err := rt.cfg.Images.Enter(pid)
		if err == nil {
			rt.Stats.Entered.Add(1)
			return
		}
		reason = err.Error()
	}
	if reason == "" {
		reason = "farmem serves no exec'd image here"
	}
	if old != nil {
		rt.retire(old)
	}
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil {
		return // it exited meanwhile
	}
	named = true // and kept claimed: it runs on, unserved, and must not be named again
	rt.Stats.Unserved.Add(1)
	fmt.Fprintf(os.Stderr, "farmem: process %d exec'd %s, which did not load farmem's shim, and farmem could not enter it (%s): "+
		"it runs without farmem, its memory not capped\n", pid, exe, reason)
}

// execComplete reports whether process pid's image has its environment set up (the kernel sets
// the bounds of the environment, field 51 of /proc/PID/stat, as it finishes loading an image:
// 0 before; an empty environment has equal, non-zero bounds).
func execComplete(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // gone: Enter finds out
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return true
	}
	f := strings.Fields(string(b[i+1:])) // f[0] is field 3
	return len(f) < 49 || f[48] != "0"
}
