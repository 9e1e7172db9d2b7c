// Package inject is a small, exact ptrace layer for running code inside another process: start
// a program stopped before its first instruction, make system calls in its context, write its
// memory, take descriptors out of it, and let it go. It is how farmem enters a program it
// cannot preload a shim into (a statically linked one), the way CRIU enters the processes it
// checkpoints.
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
package inject
