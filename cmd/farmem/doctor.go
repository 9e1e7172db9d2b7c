package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/urfave/cli/v2"
	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/procevents"
	"github.com/farmem/farmem/runtime"
	"github.com/farmem/farmem/uffd"
)

// A doctor check's verdict: ok (farmem uses it), degraded (farmem runs, slower or with less,
// and says how), or missing (farmem run cannot work here).
const (
	checkOK       = "ok"
	checkDegraded = "degraded"
	checkMissing  = "missing"
)

type check struct {
	verdict, what, detail string
}

func doctorCommand() *cli.Command {
	return &cli.Command{
		Name:  "doctor",
		Usage: "say what this machine supports and what farmem run will do about it",
		Description: "One line a facility: userfaultfd access and its features, UFFDIO_MOVE, process_madvise on\n" +
			"itself, the memory cgroup that tells a run when to arm, seccomp user notification for the\n" +
			"mapping filter, the transports compiled in. Each line says ok, degraded (farmem runs, and\n" +
			"says what it does instead) or missing (farmem run cannot work here, and how to grant it).\n" +
			"Exit status 0 when farmem run will work, 1 when it will not, 125 on bad usage.",
		OnUsageError: func(_ *cli.Context, err error, _ bool) error { return usageError{err.Error()} },
		Action: func(c *cli.Context) error {
			if c.NArg() > 0 {
				return usagef("doctor takes no arguments")
			}
			checks := doctor()
			ok := printChecks(os.Stdout, checks)
			if !ok {
				return cli.Exit("", 1)
			}
			return nil
		},
	}
}

// printChecks prints one line a check and reports whether none is missing.
func printChecks(w io.Writer, checks []check) bool {
	ok := true
	for _, c := range checks {
		fmt.Fprintf(w, "%-9s %s: %s\n", c.verdict, c.what, c.detail)
		ok = ok && c.verdict != checkMissing
	}
	if ok {
		fmt.Fprintln(w, "farmem run will work here.")
	} else {
		fmt.Fprintln(w, "farmem run will not work here: see the lines that say missing.")
	}
	return ok
}

// doctor checks what farmem run relies on, on this machine, as this user.
func doctor() []check {
	var out []check
	fd, err := uffd.Open(unix.O_CLOEXEC | unix.O_NONBLOCK)
	if err != nil {
		detail := fmt.Sprintf("cannot create one (%v)", err)
		if errors.Is(err, unix.EPERM) || errors.Is(err, unix.EACCES) {
			detail += ": run as root, or give the user /dev/userfaultfd (its group or mode), or set " +
				"vm.unprivileged_userfaultfd=1, or grant CAP_SYS_PTRACE"
		}
		return append(out, check{checkMissing, "userfaultfd", detail})
	}
	defer unix.Close(fd)
	out = append(out, check{checkOK, "userfaultfd", "a program can hand farmem its faults"})
	// What the shim asks for, and UFFDIO_MOVE besides (asked for here only, to see it).
	required := uffd.FeatureEventFork | uffd.FeatureEventRemove | uffd.FeatureEventUnmap | uffd.FeatureEventRemap |
		uffd.FeatureThreadID | uffd.FeaturePagefaultFlagWP
	granted, _, err := uffd.API(fd, required|uffd.FeatureMove)
	switch {
	case errors.Is(err, unix.EPERM):
		out = append(out, check{checkMissing, "userfaultfd features",
			"fork events need CAP_SYS_PTRACE: run as root (without them a fork child would read evicted pages as zeros)"})
	case err == nil || errors.Is(err, unix.EINVAL):
		if err != nil { // an older kernel without UFFDIO_MOVE: ask again without it
			fd2, _ := uffd.Open(unix.O_CLOEXEC | unix.O_NONBLOCK)
			granted, _, err = uffd.API(fd2, required)
			unix.Close(fd2)
		}
		if err != nil || granted&required != required {
			out = append(out, check{checkMissing, "userfaultfd features",
				fmt.Sprintf("the kernel lacks fork, remove, unmap or remap events, thread ids or write protection (%#x of %#x; %v)", granted&required, required, err)})
			break
		}
		out = append(out, check{checkOK, "userfaultfd features", "fork, remove, unmap and remap events, thread ids, write protection"})
		if granted&uffd.FeatureMove != 0 {
			out = append(out, check{checkOK, "UFFDIO_MOVE", "eviction moves its victims out of the program (Linux 6.8 and later)"})
		} else {
			out = append(out, check{checkDegraded, "UFFDIO_MOVE", "not in this kernel (before 6.8): every eviction takes the slower way, a write-protect and a REMOVE event a run"})
		}
	default:
		out = append(out, check{checkMissing, "userfaultfd features", err.Error()})
	}
	if err := selfMadvise(); err == nil {
		out = append(out, check{checkOK, "process_madvise on itself", "the agent drops a batch's runs in one call"})
	} else {
		out = append(out, check{checkDegraded, "process_madvise on itself", fmt.Sprintf("%v (before Linux 6.13): the agent drops a run at a time", err)})
	}
	out = append(out, memcgCheck())
	if hasCapability(21) { // CAP_SYS_ADMIN
		out = append(out, check{checkOK, "seccomp user notification", "the mapping filter hands farmem glibc's internal mmap and brk calls, and a static program's"})
	} else {
		out = append(out, check{checkDegraded, "seccomp user notification", "installing the mapping filter needs CAP_SYS_ADMIN (farmem does not set no_new_privs behind a program's back): glibc's internal mappings, and every mapping of a static program, are found by polling, and the cap may be overshot until they are"})
	}
	transports := "tcp, shm"
	if rdmaDial != nil {
		transports += ", rdma"
	}
	detail := transports + " (farmem run --transport)"
	if rdmaDial == nil {
		detail += "; rdma needs a build with -tags rdma"
	}
	out = append(out, check{checkOK, "transports", detail})
	out = append(out, staticCheck())
	out = append(out, processEventsCheck())
	return out
}

// processEventsCheck says whether farmem hears of forks and execs as they happen, by listening to
// the kernel's process events and running true: without them, an image a process exec's before
// the run arms (a shell's command, posix_spawn's) is found only by a look every 100 ms, and so is
// a fork child that says no hello, whose lifeline farmem makes.
func processEventsCheck() check {
	const what = "process events"
	const without = "an image a process exec's before the run arms (a shell's commands, posix_spawn's) is found by a look every 100 ms instead, and one that lives less than that may run unserved; a fork child that says no hello (a raw clone in a process running as another user) is given a lifeline only if that look finds it"
	e, err := procevents.Listen()
	if err != nil {
		return check{checkDegraded, what, fmt.Sprintf("%v (CAP_NET_ADMIN): %s", err, without)}
	}
	defer e.Close()
	told := make(chan procevents.Event)
	done := make(chan struct{})
	defer close(done) // before the Close above: the reader, waiting to hand over an event, ends
	go func() {
		for {
			ev, err := e.Next()
			if errors.Is(err, procevents.ErrLost) {
				continue
			}
			if err != nil {
				close(told)
				return
			}
			select {
			case told <- ev:
			case <-done:
				return
			}
		}
	}()
	prog, err := exec.LookPath("true")
	if err != nil {
		return check{checkDegraded, what, fmt.Sprintf("no program to run to see (%v): not checked", err)}
	}
	c := exec.Command(prog)
	if err := c.Run(); err != nil {
		return check{checkDegraded, what, fmt.Sprintf("running %s: %v: not checked", prog, err)}
	}
	want := map[procevents.Event]bool{
		{Kind: procevents.Fork, Pid: c.Process.Pid, Parent: os.Getpid()}: true,
		{Kind: procevents.Exec, Pid: c.Process.Pid}:                      true,
	}
	deadline := time.After(2 * time.Second)
	for len(want) > 0 {
		select {
		case ev, ok := <-told:
			if !ok {
				return check{checkDegraded, what, "the listener stopped: " + without}
			}
			delete(want, ev)
		case <-deadline:
			return check{checkDegraded, what, "the kernel told of no fork and exec within 2 s (outside the initial namespaces it tells nothing): " + without}
		}
	}
	return check{checkOK, what, "the kernel tells farmem of each fork and exec as it happens (its process events connector), so every image a process exec's is entered at its start, and a fork child that says no hello is given a lifeline at its birth"}
}

// staticCheck says whether farmem can serve a statically linked program here: it injects its
// agent through ptrace, and the agent's mapping filter, how the runtime sees such a program's
// mappings and forks, needs CAP_SYS_ADMIN.
func staticCheck() check {
	const what = "statically linked programs"
	if b, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil && strings.TrimSpace(string(b)) == "3" {
		return check{checkDegraded, what, "not served: farmem injects its agent into one through ptrace, which kernel.yama.ptrace_scope=3 forbids (farmem run fails, exit 125)"}
	}
	if !hasCapability(21) { // CAP_SYS_ADMIN
		return check{checkDegraded, what, "not served: the mapping filter, how farmem sees a static program's mappings and forks, needs CAP_SYS_ADMIN (farmem run fails, exit 125)"}
	}
	return check{checkOK, what, "served: farmem injects its agent through ptrace (LD_PRELOAD does not reach them), and enters each fork child the same way"}
}

// memcgCheck says which cgroup version a run's memory cgroup would use here and how, or why a
// run polls instead.
func memcgCheck() check {
	const polls = "a run polls its programs' memory to know when to arm, which costs a little throughput, and the summary has no cgroup peak"
	v, how, err := runtime.CheckUsageWatch()
	switch {
	case v == 0:
		return check{checkDegraded, "memory cgroup", fmt.Sprintf("%v: %s", err, polls)}
	case err != nil:
		return check{checkDegraded, "memory cgroup", fmt.Sprintf("cgroup v%d, but %v: %s", v, err, polls)}
	case v == 1:
		return check{checkOK, "memory cgroup", "cgroup v1: a run's programs are born in a memory cgroup of its own, whose usage thresholds say when to arm, and whose peak the summary gives"}
	}
	return check{checkOK, "memory cgroup", "cgroup v2: a run's programs are born (clone3) in a memory cgroup of its own, whose memory.high, set at the arming level and lifted when crossed, says when to arm, and whose memory.peak the summary gives; " + how}
}

// selfMadvise makes a process_madvise(MADV_DONTNEED) of a page of its own, as the agent does.
func selfMadvise() error {
	mem, err := unix.Mmap(-1, 0, os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return err
	}
	defer unix.Munmap(mem)
	mem[0] = 1
	pidfd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return err
	}
	defer unix.Close(pidfd)
	iov := unix.Iovec{Base: &mem[0]}
	iov.SetLen(len(mem))
	_, _, e := unix.Syscall6(unix.SYS_PROCESS_MADVISE, uintptr(pidfd), uintptr(unsafe.Pointer(&iov)), 1, unix.MADV_DONTNEED, 0, 0)
	if e != 0 {
		return e
	}
	if mem[0] != 0 {
		return errors.New("the page kept its content")
	}
	return nil
}

// hasCapability reports whether capability bit cap is in this process's effective set.
func hasCapability(cap uint) bool {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapEff:"); ok {
			eff, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
			return err == nil && eff&(1<<cap) != 0
		}
	}
	return false
}
