package launcher

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os/exec"
	goruntime "runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/inject"
	"github.com/farmem/farmem/procfs"
	"github.com/farmem/farmem/runtime"
	"github.com/farmem/farmem/uffd"
)

// A statically linked program ignores LD_PRELOAD, so farmem does from outside what the shim
// does from inside (shim.c's items 1, 3 and 5), the way CRIU enters a process: it starts the
// program under ptrace, stopped before its first instruction, and, by system calls it makes in
// the program's context (package inject):
//   - creates the program's userfaultfd and takes a copy (pidfd_getfd): the program keeps its
//     own, so that, should farmem die, a faulting thread waits (and is killed) instead of
//     reading zeros;
//   - makes the program's lifeline pipe (shim.c, make_lifeline) and takes its write end;
//   - maps the agent (shim/agent.c) and its stack, and starts the agent thread with a clone;
// and holds the program stopped until the agent has said hello and installed the mapping
// filter, then lets it go. Nothing of farmem's stays in the program but that thread, its
// memory, and the two descriptors (close-on-exec).
//
// The filter is installed at once, not when the run arms as for a dynamic program: it is how
// the runtime learns of every mapping once armed (a static program has no interposed mmap), and
// how it learns of the program's forks (runtime.Process.ServeForks). Before the run arms it lets
// every mapping call through, at the cost of a notification.
//
// A fork child must be entered as the program was: it has no shim to say its hello, keep a copy
// of its uffd and start its agent. The filter holds the forking thread in its fork call while
// farmem traces it (inject.CatchFork), so that the child stops at its birth; farmem runs the
// agent's fork entry in it (the shim's atfork handler: the child inherited the agent at the same
// address) and holds it until its agent is attached. A child farmem cannot enter is killed:
// nothing would keep its evicted pages once farmem is gone.

// staticAgents is where the connection handler tells a static program's launcher that the
// program's agent has said hello: the launcher holds the program stopped until then.
//
// A process entered at its start or at an exec has no control connection (a fork child's agent
// makes one, as the shim does) whose end would tell farmem of its next exec: its agent's
// connection, close-on-exec too, tells instead (watched).
type staticAgents struct {
	rt      *runtime.Runtime
	mu      sync.Mutex
	waiting map[int]chan error // pid -> the filter's installation result
	watched map[int]bool       // pids whose agent connection's end is an end of their image
}

// expect is told of a process whose agent is about to say hello; watch: it has no control
// connection, and its agent connection's end is watched for instead (runtime.ControlEnded).
func (s *staticAgents) expect(pid int, watch bool) <-chan error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiting == nil {
		s.waiting, s.watched = map[int]chan error{}, map[int]bool{}
	}
	c := make(chan error, 1)
	s.waiting[pid] = c
	s.watched[pid] = watch
	return c
}

func (s *staticAgents) forget(pid int) {
	s.mu.Lock()
	delete(s.waiting, pid)
	delete(s.watched, pid)
	s.mu.Unlock()
}

// attached is called with each process whose agent said hello: a static program's gets its
// filter, with its forks guarded, and then its faults served in it (runtime.ServeInProgram),
// before its launcher lets it run. It reports whether p was such a process.
func (s *staticAgents) attached(p *runtime.Process, a *agentConn) bool {
	s.mu.Lock()
	c, watch := s.waiting[p.Pid()], s.watched[p.Pid()]
	delete(s.waiting, p.Pid())
	delete(s.watched, p.Pid())
	s.mu.Unlock()
	if c == nil {
		return false
	}
	if watch && s.rt != nil {
		watchAgent(s.rt, p, a)
	}
	err := p.InstallFilter()
	if err == nil {
		// Only an agent that stays: one whose filter could not go in is taken out again, its
		// memory unmapped, where a fault thread would still run.
		p.ServeInProgram(a)
	}
	c <- err
	return true
}

// watchAgent tells the runtime when p's agent connection ends (ControlEnded): the agent thread
// ended, with its process or at an exec (the socket is close-on-exec), or farmem let it go.
func watchAgent(rt *runtime.Runtime, p *runtime.Process, a *agentConn) {
	fd, err := unix.FcntlInt(uintptr(a.sock), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return
	}
	go func() {
		defer unix.Close(fd)
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		for {
			// Only the end is waited for: the answers the evictor reads on the same socket
			// make it readable, not hung up.
			pfd[0].Revents = 0
			if _, err := unix.Poll(pfd, -1); err == unix.EINTR {
				continue
			} else if err != nil {
				return
			}
			if pfd[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0 {
				break
			}
		}
		rt.ControlEnded(p)
	}()
}

// uffdFeatures are the features the runtime relies on (shim.c, new_uffd).
const uffdFeatures = uffd.FeatureEventFork | uffd.FeatureEventRemove | uffd.FeatureEventUnmap |
	uffd.FeatureEventRemap | uffd.FeatureThreadID | uffd.FeaturePagefaultFlagWP

// agentWait is how long the program is held for its agent's hello.
const agentWait = 10 * time.Second

// startStatic starts cmd, a statically linked program, with farmem's agent in it, on the
// calling thread, which must be locked to its goroutine and outlive the program (it becomes the
// program's parent and, while the agent goes in, its tracer). It returns the write end of the
// program's lifeline, for the caller to hold until the program is gone. started is called as
// soon as the program exists (runtime.ContainChildren's). On failure the program has been
// killed and reaped.
func startStatic(cmd *exec.Cmd, rt *runtime.Runtime, sock string, agents *staticAgents, parent *parentThread, started func()) (lifeline int, err error) {
	img, err := readAgent(agentELF)
	if err != nil {
		return -1, err
	}
	if len(sock) >= paramSockLen {
		return -1, fmt.Errorf("socket name %q too long for the agent", sock)
	}
	tr, err := inject.Start(cmd)
	started()
	if err != nil {
		return -1, err
	}
	pid := tr.Pid()
	ready := agents.expect(pid, true)
	lifeline = -1
	defer func() {
		if err == nil {
			return
		}
		agents.forget(pid)
		if lifeline >= 0 {
			unix.Close(lifeline)
			lifeline = -1
		}
		unix.Kill(pid, unix.SIGKILL)
		var ws unix.WaitStatus
		unix.Wait4(pid, &ws, unix.WALL, nil)
		err = fmt.Errorf("putting farmem's agent into %s: %w", cmd.Path, err)
	}()

	mem, fd, lifeline, err := injectAgent(tr, img, sock)
	if err != nil {
		return -1, err
	}
	p, err := rt.Attach(pid, fd)
	if err != nil {
		return lifeline, err
	}
	// Before its agent's hello, which installs the filter in an armed run.
	p.ServeForks(forkServer(img, mem, sock, agents, parent, pid))
	if _, err := runAgentEntry(tr, mem+agentOffset+img.startEntry); err != nil {
		return lifeline, err
	}
	return lifeline, holdUntilAttached(tr, ready, func() {
		if rt.Armed() {
			// The mappings exec made (the program's .bss, where a Go runtime keeps its heap's
			// metadata) are seen by no filter: registered now, before anything is written
			// there, what the program writes there faults, and counts, instead of being found
			// unseen by a rescan later. (The agent's memory is pinned by now.)
			p.Rescan()
		}
	})
}

// injectAgent puts farmem's agent into the tracee without starting it (mapAgent), makes its
// userfaultfd and lifeline, and writes their numbers into the agent's parameters. It returns the
// agent's memory, farmem's copy of the uffd and the lifeline's write end; on failure it has
// closed what it took.
func injectAgent(tr *inject.Tracee, img *agentImage, sock string) (mem uint64, fd, lifeline int, err error) {
	if mem, err = mapAgent(tr, img, sock); err != nil {
		return 0, -1, -1, err
	}
	scratch := mem + pageSize // the stack's low end: free until the agent thread runs
	theirUffd, fd, dev, err := makeUffd(tr, scratch, sock)
	if err != nil {
		return 0, -1, -1, err
	}
	theirLifeline, lifeline, err := makeLifeline(tr, scratch)
	if err != nil {
		unix.Close(fd)
		return 0, -1, -1, err
	}
	var fds [12]byte
	binary.LittleEndian.PutUint32(fds[:], uint32(theirUffd))
	if err == nil {
		err = tr.Write(mem+agentOffset+img.params+paramUffd, fds[:4])
	}
	binary.LittleEndian.PutUint32(fds[4:], uint32(theirLifeline))
	if err == nil {
		err = tr.Write(mem+agentOffset+img.params+paramLifeline, fds[4:8])
	}
	if err == nil && dev >= 0 {
		binary.LittleEndian.PutUint32(fds[8:], uint32(dev))
		err = tr.Write(mem+agentOffset+img.params+paramUffdDev, fds[8:])
	}
	if err != nil {
		unix.Close(fd)
		tr.Syscall(unix.SYS_CLOSE, uint64(theirLifeline)) // first: the write end's close would kill it
		unix.Close(lifeline)
		if dev >= 0 {
			tr.Syscall(unix.SYS_CLOSE, uint64(dev))
		}
		return 0, -1, -1, err
	}
	return mem, fd, lifeline, nil
}

// carriesAgent reports whether thread tid's process still has the agent farmem put in it: its
// parameters, at params, name farmem's socket.
func carriesAgent(tid int, params uint64, sock string) bool {
	got := make([]byte, len(sock)+1)
	local := []unix.Iovec{{Base: &got[0]}}
	local[0].SetLen(len(got))
	remote := []unix.RemoteIovec{{Base: uintptr(params), Len: len(got)}}
	n, err := unix.ProcessVMReadv(tid, local, remote, 0)
	return err == nil && n == len(got) && string(got) == sock+"\x00"
}

// forkServer is the fork server (runtime.ForkServer) of a process farmem entered by injection,
// its agent at mem: the agent is at the same address in every fork child (a copy of the
// parent's memory). program is the pid of the program farmem started, whose forks are traced
// from its parent thread (tracer.go).
func forkServer(img *agentImage, mem uint64, sock string, agents *staticAgents, parent *parentThread, program int) runtime.ForkServer {
	return func(tid int, proceed func() error) error {
		if !carriesAgent(tid, mem+agentOffset+img.params, sock) {
			// An image the process exec'd since, not entered yet: nothing of it is registered,
			// so its child has nothing of farmem's to lose.
			return proceed()
		}
		enter := func() error { return enterForkChild(img, mem, agents, tid, proceed) }
		if tgid, err := procfs.Tgid(tid); err == nil && tgid == program {
			// The program's own fork: traced from its parent thread (tracer.go).
			if err := parent.do(enter); !errors.Is(err, errGone) {
				return err
			}
		}
		goruntime.LockOSThread() // the child's tracer, until it is let go
		defer goruntime.UnlockOSThread()
		return enter()
	}
}

// runAgentEntry runs one of the agent's entries (agent.c) on the tracee's stopped thread, below
// its stack pointer, and returns the agent thread's id.
func runAgentEntry(tr *inject.Tracee, entry uint64) (int, error) {
	regs, err := tr.Regs()
	if err != nil {
		return 0, err
	}
	// Below the thread's stack pointer and its red zone, which the code interrupted may use.
	tid, err := tr.Call(entry, (regs.Rsp-256)&^15, 0)
	if err != nil {
		return 0, err
	}
	if int64(tid) < 0 {
		return 0, fmt.Errorf("clone of the agent thread: %w", unix.Errno(-int64(tid)))
	}
	return int(tid), nil
}

// holdUntilAttached holds the tracee stopped until its agent has said hello and its filter is
// in (ready), then calls attached (if not nil) and lets it go.
func holdUntilAttached(tr *inject.Tracee, ready <-chan error, attached func()) error {
	deadline := time.Now().Add(agentWait)
	for {
		select {
		case err := <-ready:
			if err != nil {
				return fmt.Errorf("installing the mapping filter: %w", err)
			}
			if attached != nil {
				attached()
			}
			return tr.Detach()
		case <-time.After(10 * time.Millisecond):
		}
		if err := tr.Poll(); err != nil {
			return err // the agent could not reach farmem, and killed it
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("its agent did not say hello within %v", agentWait)
		}
	}
}

// enterForkChild is a static program's fork server (runtime.ForkServer): it catches the child of
// the fork thread tid is making, stopped at its birth, has it say its hello and start its agent
// (agent.c, fm_fork_child: the shim's atfork handler), and lets it go once the agent is attached.
// A child that cannot be entered is killed: nothing would keep its evicted pages.
// It runs on a locked thread.
func enterForkChild(img *agentImage, mem uint64, agents *staticAgents, tid int, proceed func() error) error {
	tr, err := inject.CatchFork(tid, proceed)
	if errors.Is(err, inject.ErrNoFork) {
		return nil // the kernel refused the fork: the program has its error
	}
	if err != nil {
		return err
	}
	ready := agents.expect(tr.Pid(), false) // it says hello on a control connection
	if _, err = runAgentEntry(tr, mem+agentOffset+img.forkEntry); err == nil {
		err = holdUntilAttached(tr, ready, nil)
	}
	if err != nil {
		agents.forget(tr.Pid())
		tr.Kill()
		return fmt.Errorf("fork child %d could not be entered, and was killed: %w", tr.Pid(), err)
	}
	return nil
}

// agentOffset is where the agent's image starts in its memory: after a guard page and the
// stack.
const agentOffset = pageSize + agentStackBytes

// mapAgent maps the agent's memory in the tracee (a guard page, the agent thread's stack, the
// agent's image), copies the image in with its protections, and writes its parameters. It
// returns the memory's address.
func mapAgent(tr *inject.Tracee, img *agentImage, sock string) (mem uint64, err error) {
	length := agentOffset + img.span
	mem, err = tr.Syscall(unix.SYS_MMAP, 0, length, unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_PRIVATE|unix.MAP_ANONYMOUS, ^uint64(0), 0)
	if err != nil {
		return 0, fmt.Errorf("mmap of the agent's memory: %w", err)
	}
	if _, err := tr.Syscall(unix.SYS_MPROTECT, mem, pageSize, unix.PROT_NONE); err != nil {
		return 0, fmt.Errorf("mprotect of the agent's guard page: %w", err)
	}
	base := mem + agentOffset
	for _, s := range img.segs {
		if err := tr.Write(base+s.off, s.data); err != nil {
			return 0, err
		}
	}
	params := make([]byte, paramsBytes)
	copy(params, sock)
	binary.LittleEndian.PutUint64(params[paramMem:], mem)
	binary.LittleEndian.PutUint64(params[paramMemLen:], length)
	binary.LittleEndian.PutUint64(params[paramStackTop:], mem+pageSize+agentStackBytes)
	binary.LittleEndian.PutUint32(params[paramUffdDev:], ^uint32(0)) // -1: none (injectAgent)
	if err := tr.Write(base+img.params, params); err != nil {
		return 0, err
	}
	for _, s := range img.segs {
		start, end := s.off&^(pageSize-1), (s.off+s.memsz+pageSize-1)&^(pageSize-1)
		if _, err := tr.Syscall(unix.SYS_MPROTECT, base+start, end-start, uint64(s.prot)); err != nil {
			return 0, fmt.Errorf("mprotect of the agent's segment at %#x: %w", s.off, err)
		}
	}
	return mem, nil
}

// makeUffd creates the tracee's userfaultfd (it keeps it) and returns farmem's copy, its API
// handshake done: farmem's, since a tracee running as another user may not make it with fork
// events (asuser.go). scratch is a page of the tracee's memory it may use; sock is farmem's
// socket, from which a tracee that may not open /dev/userfaultfd receives a descriptor of it,
// which it keeps (dev, -1 if none) for its agent's later uffds: its staging area's, and its fork
// children's (agent.h, open_uffd).
func makeUffd(tr *inject.Tracee, scratch uint64, sock string) (theirs, mine, dev int, err error) {
	const flags = unix.O_CLOEXEC | unix.O_NONBLOCK
	dev = -1
	fd, err := tr.Syscall(unix.SYS_USERFAULTFD, flags)
	if errors.Is(err, unix.EPERM) {
		// No syscall for this user (vm.unprivileged_userfaultfd=0): the device may be open to it.
		fd, dev, err = uffdFromDevice(tr, scratch, flags, sock)
	}
	if err != nil {
		return -1, -1, -1, fmt.Errorf("userfaultfd: %w", err)
	}
	fail := func(err error) (int, int, int, error) {
		tr.Syscall(unix.SYS_CLOSE, fd)
		if dev >= 0 {
			tr.Syscall(unix.SYS_CLOSE, uint64(dev))
		}
		return -1, -1, -1, err
	}
	if mine, err = tr.TakeFD(int(fd)); err != nil {
		return fail(err)
	}
	if _, _, err := uffd.API(mine, uffdFeatures); err != nil {
		unix.Close(mine)
		return fail(fmt.Errorf("UFFDIO_API: %w", err))
	}
	return int(fd), mine, dev, nil
}

// uffdFromDevice makes the tracee's userfaultfd on a descriptor of /dev/userfaultfd: its own, or,
// if it may not open the device (it runs as another user), one farmem sends it, which the tracee
// keeps (kept; else -1).
func uffdFromDevice(tr *inject.Tracee, scratch uint64, flags int, sock string) (fd uint64, kept int, err error) {
	if err := tr.Write(scratch, []byte("/dev/userfaultfd\x00")); err != nil {
		return 0, -1, err
	}
	cwd := int64(unix.AT_FDCWD)
	dev, err := tr.Syscall(unix.SYS_OPENAT, uint64(cwd), scratch, unix.O_RDWR|unix.O_CLOEXEC)
	sent := false
	if errors.Is(err, unix.EACCES) || errors.Is(err, unix.EPERM) {
		dev, err = receiveUffdDev(tr, scratch, sock)
		sent = true
	}
	if err != nil {
		return 0, -1, err
	}
	const iocNew = 0xAA00 // USERFAULTFD_IOC_NEW = _IO(0xAA, 0x00)
	fd, err = tr.Syscall(unix.SYS_IOCTL, dev, iocNew, uint64(flags))
	if err != nil || !sent {
		tr.Syscall(unix.SYS_CLOSE, dev)
		return fd, -1, err
	}
	return fd, int(dev), nil
}

// makeLifeline makes the tracee's lifeline pipe (shim.c, make_lifeline): the tracee keeps the
// read end, set to SIGKILL it once no writer is left, and farmem takes the only write end.
func makeLifeline(tr *inject.Tracee, scratch uint64) (theirs, mine int, err error) {
	if _, err := tr.Syscall(unix.SYS_PIPE2, scratch, unix.O_CLOEXEC); err != nil {
		return -1, -1, fmt.Errorf("pipe2: %w", err)
	}
	var fds [8]byte
	if err := tr.Read(scratch, fds[:]); err != nil {
		return -1, -1, err
	}
	rd, wr := uint64(binary.LittleEndian.Uint32(fds[:])), uint64(binary.LittleEndian.Uint32(fds[4:]))
	for _, c := range [][2]uint64{{unix.F_SETOWN, uint64(tr.Pid())}, {unix.F_SETSIG, uint64(unix.SIGKILL)}, {unix.F_SETFL, unix.O_ASYNC | unix.O_NONBLOCK}} {
		if _, err := tr.Syscall(unix.SYS_FCNTL, rd, c[0], c[1]); err != nil {
			return -1, -1, fmt.Errorf("fcntl of the lifeline: %w", err)
		}
	}
	if mine, err = tr.TakeFD(int(wr)); err != nil {
		return -1, -1, err
	}
	if _, err := tr.Syscall(unix.SYS_CLOSE, wr); err != nil {
		unix.Close(mine)
		return -1, -1, err
	}
	return int(rd), mine, nil
}
