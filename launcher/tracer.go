package launcher

import (
	"errors"
	"os"
	"os/signal"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/inject"
)

// parentThread is the thread that started a static program, which is its parent, and the one
// thread of farmem that may trace it. The kernel reports a tracee's stops to every thread of its
// tracer's process that waits for it, and the program's parent does (for its end, and its stops
// at a terminal): had another thread of farmem traced the program's main thread while the parent
// waited, the parent could take the tracer's stop for a job-control stop, and the tracer would
// wait for ever. So the parent thread does both, one after the other: it waits for the program
// without blocking (terminal.poll) whenever a SIGCHLD says a child of farmem changed state, and
// runs, in between, the ptrace work on the program (do) that other goroutines hand it.
type parentThread struct {
	jobs  chan parentJob
	ended chan struct{} // closed once serve returned: the program is gone
	sigs  chan os.Signal
}

type parentJob struct {
	f    func() error
	done chan error
}

// newParentThread starts listening for SIGCHLD: before the program starts, so that none is
// missed.
func newParentThread() *parentThread {
	t := &parentThread{jobs: make(chan parentJob), ended: make(chan struct{}), sigs: make(chan os.Signal, 1)}
	signal.Notify(t.sigs, unix.SIGCHLD)
	return t
}

// do runs f on the parent thread and returns its error; errGone if the program has ended.
func (t *parentThread) do(f func() error) error {
	j := parentJob{f: f, done: make(chan error, 1)}
	select {
	case t.jobs <- j:
		return <-j.done
	case <-t.ended:
		return errGone
	}
}

var errGone = errors.New("the program has ended")

// serve is terminal.wait for the static program pid, run on the parent thread: it returns how
// the program ended, running the jobs handed to do meanwhile.
func (t *parentThread) serve(tty *terminal, pid int) (unix.WaitStatus, error) {
	defer signal.Stop(t.sigs)
	defer close(t.ended)
	for {
		if ws, ended, err := tty.poll(pid); ended {
			return ws, err
		}
		select {
		case j := <-t.jobs:
			err := j.f()
			j.done <- err
			// A job that waited for the program's main thread may have been told of its end:
			// it is the program's.
			var ex *inject.ExitedError
			if errors.As(err, &ex) && ex.Pid == pid {
				return ex.Status, nil
			}
		case <-t.sigs:
		}
	}
}
