// Package inject is a small, exact ptrace layer for running code inside another process: start
// a program stopped before its first instruction, make system calls in its context, write its
// memory, take descriptors out of it, and let it go. It is how farmem enters a program it
// cannot preload a shim into (a statically linked one, or an image a served process exec'd
// without the shim), the way CRIU enters the processes it checkpoints.
//
// # One thread
//
// The kernel's tracer is a thread, not a process: a ptrace request from any other thread of
// farmem fails with ESRCH, and a PTRACE_TRACEME child is traced by the very thread that forked
// it. A goroutine, though, moves between OS threads whenever the scheduler likes. So a Tracee
// is made and used on one goroutine that holds runtime.LockOSThread from before Start until
// after Detach, and every method checks that it runs on that thread (ErrWrongThread) instead of
// failing with a puzzling ESRCH. The same thread must also stay alive while the program runs
// if the program has a parent-death signal, which fires when the thread that forked it exits.
//
// # How a system call is made in the tracee
//
// Syscall saves the stopped thread's registers and the two bytes of text at its instruction
// pointer, writes a syscall instruction (0f 05) there (PTRACE_POKETEXT writes through the
// text's read-only protection, as a debugger's breakpoint does), sets rax and the argument
// registers, single-steps over the instruction, reads rax, and puts back the text and every
// register. orig_rax is set to -1 for the step, so that the kernel does not take the stop the
// thread was in for an interrupted system call to restart. A signal that arrives meanwhile
// stops the tracee instead of the trap: it is kept and delivered at Detach, and the step goes
// on. Call runs code that is already in the tracee (an injected agent) the same way, up to an
// int3.
//
// # A fork's child
//
// CatchFork stops the child of a fork at its birth, for farmem to enter it as it entered the
// program: the forking thread, held in its fork call by a seccomp user notification, is seized
// with fork events on and then let go; the kernel attaches the child to the tracer and stops it
// before it runs an instruction of its own. A fork the kernel refuses makes no event: the thread
// is interrupted once it is seen blocked in another call (or after a second), and its interrupt
// stop, which comes only on the way back to user space, after any fork event, says so.
//
// The kernel reports a tracee's stops to whichever thread of its tracer's process waits for it,
// the tracee's parent among them if it is in that process: a caller that is also the tracee's
// parent (farmem and the program it started) must do its own waiting on the tracer's thread,
// between the Tracee's calls (launcher/tracer.go).
package inject
