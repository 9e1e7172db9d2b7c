package runtime

import (
	"fmt"
	"os"
	"time"
)

// newImageGrace is how long a process whose control connection ended has to say hello again
// as a new image: a shim says hello from its constructor, before the program's main, so a
// served image does within milliseconds.
const newImageGrace = 2 * time.Second

// ControlEnded is told that p's control connection with its shim ended: the process exited, or
// it exec'd (the connection is close-on-exec). An exit retires p through its pidfd (watchExit);
// an exec into an image that loads the shim retires it with that image's hello (attach). An exec
// into one that does not (a static binary, or LD_PRELOAD dropped by a program that changes
// user) would leave p in the run for as long as the new image lives: its page table still
// counting, against the cap, pages whose memory went with the old image, and the new image
// running uncapped without a word. So if p is still the process of its pid after
// newImageGrace and its memory is gone (memoryGone), it is retired, and the new image named on
// stderr: it runs without farmem.
func (rt *Runtime) ControlEnded(p *Process) {
	pid := p.Pid()
	if pid == 0 || p.probe == 0 {
		return
	}
	go func() {
		time.Sleep(newImageGrace)
		if rt.Lookup(pid) != p || !memoryGone(p.fd, p.probe) {
			return // exited and retired, or a new image said hello; or the memory lives on
		}
		rt.retire(p)
		exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil {
			return // it exited meanwhile
		}
		rt.Stats.Unserved.Add(1)
		fmt.Fprintf(os.Stderr, "farmem: process %d exec'd %s, which did not load farmem's shim (a static binary, or a program "+
			"that changed user and so dropped LD_PRELOAD): it runs without farmem, its memory not capped\n", pid, exe)
	}()
}
