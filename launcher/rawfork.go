package launcher

import (
	"errors"
	"fmt"
	goruntime "runtime"

	"github.com/farmem/farmem/inject"
	"github.com/farmem/farmem/procfs"
)

// A raw fork of a process with the shim: fork, or clone without CLONE_VM, made by the system call
// itself rather than by libc's fork() (some runtimes and sandboxes fork that way). No atfork
// handler runs, so the child never says hello: it is served on its FORK event alone, its evicted
// pages held by a uffd only farmem has (farmem's death would leave it reading zeros where they
// were), with no agent to evict its pages and no lifeline. So the runtime hands such a fork here
// (runtime.Config.RawForks), and it is entered as a static program's fork child is: caught at its
// birth, the injected agent (agent.c) mapped into it, and its fork entry run, which says the
// child's hello and starts its agent thread. The shim in the child keeps what it inherited, and
// does nothing with it: its interposed mmap registers nothing in a process other than the one
// that said hello on its connection, and makes the call where the mapping filter hands it over.
//
// Not seen: a raw fork of a process with no filter (a dynamic process before the run arms, when
// nothing is registered, so that its child has nothing of farmem's and runs as any unserved
// process; one that may not install a filter, running as another user, whose child is served on
// its FORK event alone).

// rawFork enters the child of the raw fork thread tid is about to make (runtime.ForkServer).
func (s *imageServer) rawFork(tid int, proceed func() error) error {
	enter := func() error { return s.enterRawForkChild(tid, proceed) }
	<-s.known
	if tgid, err := procfs.Tgid(tid); err == nil && tgid == int(s.program.Load()) {
		// The program's own fork: traced from its parent thread (tracer.go).
		if err := s.parent.do(enter); !errors.Is(err, errGone) {
			return err
		}
	}
	goruntime.LockOSThread() // the child's tracer, until it is let go
	defer goruntime.UnlockOSThread()
	return enter()
}

// enterRawForkChild catches the child of the fork thread tid is making, stopped at its birth, puts
// the agent in it and runs its fork entry, and lets it go once the agent is attached. A child
// that cannot be entered is killed: nothing would keep its evicted pages once farmem is gone.
func (s *imageServer) enterRawForkChild(tid int, proceed func() error) error {
	tr, err := inject.CatchFork(tid, proceed)
	if errors.Is(err, inject.ErrNoFork) {
		return nil // the kernel refused the fork: the program has its error
	}
	if err != nil {
		return err
	}
	ready := s.agents.expect(tr.Pid(), false) // it says hello on a control connection
	mem, err := mapAgent(tr, s.img, s.sock)
	if err == nil {
		_, err = runAgentEntry(tr, mem+agentOffset+s.img.forkEntry)
	}
	if err == nil {
		err = holdUntilAttached(tr, ready, nil)
	}
	if err != nil {
		s.agents.forget(tr.Pid())
		tr.Kill()
		return fmt.Errorf("fork child %d could not be entered, and was killed: %w", tr.Pid(), err)
	}
	return nil
}
