package fetcher

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/uffd"
)

// The mapping filter: how an armed run sees the mappings LD_PRELOAD cannot.
//
// glibc's malloc maps its large blocks, reserves its thread arenas and grows its main heap with
// internal mmap and brk calls that never reach the shim's interposed mmap. Before the filter,
// the rescan found them within a poll (~2 ms), and what the program wrote there meanwhile was in
// the kernel's count with no fault to hold it back: the torture, filling fresh 256 KiB-1 MiB
// blocks, put up to 16 MiB over a 16 MiB cap in one burst. Once armed, each process's agent
// installs a seccomp filter (shim.c, item 5) that turns those calls into user notifications;
// serveMapping has the agent make the call, registers the new range, and only then answers the
// caller, so the program returns from mmap or brk into memory that is already ours. A glibc
// arena's PROT_NONE reservation is registered too: registration survives the mprotect that
// later opens it for writing (measured on 6.18), while brk growth never joins the registered
// heap (the new part is a VMA of its own).
//
// Cost: a notification and an agent round trip per call, paid only once armed and only by mmaps
// of at least MinRegister bytes and by brk: 150-250 µs here for a 1 MiB mmap+munmap (6 µs
// without farmem; the munmap's UNMAP event is part of it) and for a 128 KiB brk (1.3 µs). The
// notification alone, answered CONTINUE, is 49 µs; the rest is the agent round trip over the
// netpoller'd socket, which a blocking one could shorten as it did for the fabric. Without the privilege to install a filter (seccomp needs
// CAP_SYS_ADMIN, and we do not set no_new_privs behind the program's back) the run goes on with
// the rescan alone and the evictor's burst reserve.

// The kernel's struct seccomp_notif and struct seccomp_notif_resp (linux/seccomp.h).
type seccompNotif struct {
	id    uint64
	pid   uint32 // the calling thread, in our pid namespace
	flags uint32
	nr    int32
	arch  uint32
	ip    uint64
	args  [6]uint64
}

type seccompResp struct {
	id    uint64
	val   int64
	error int32
	flags uint32
}

const seccompContinue = 1 // SECCOMP_USER_NOTIF_FLAG_CONTINUE

func notifRecv(fd int, n *seccompNotif) error {
	*n = seccompNotif{} // the kernel insists on a zeroed buffer
	return ioctlPtr(fd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(n))
}

func notifSend(fd int, r *seccompResp) error {
	return ioctlPtr(fd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(r))
}

func notifValid(fd int, id uint64) bool {
	return ioctlPtr(fd, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, unsafe.Pointer(&id)) == nil
}

func ioctlPtr(fd int, req uint, arg unsafe.Pointer) error {
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
		if e != unix.EINTR {
			if e != 0 {
				return e
			}
			return nil
		}
	}
}

// filterMappings has p's agent install the mapping filter, once, and serves its notifications
// until the run stops or every process the filter applies to is gone. It is called when the run
// arms and for each process whose agent says hello after. A fork child or an exec'd image
// inherits its parent's filter, and the kernel allows one listener per chain of filters (EBUSY):
// it is served on the listener of the process that installed it, which finds it by its threads
// (answering CONTINUE until it said hello).
func (rt *Runtime) filterMappings(p *Process) {
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	if a == nil || !p.filtered.CompareAndSwap(false, true) {
		return
	}
	fd, err := a.Filter(rt.MinRegister)
	if errors.Is(err, unix.EBUSY) {
		return // a filter inherited from a parent has a listener already: ours, serving it
	}
	if err != nil {
		if rt.filterFailed.CompareAndSwap(false, true) {
			fmt.Fprintf(os.Stderr, "farmem: cannot install the mapping filter (%v): glibc's internal mappings are found by polling, and the cap may be overshot while they are\n", err)
		}
		return
	}
	rt.finished.Add(1)
	go func() {
		defer rt.finished.Done()
		defer unix.Close(fd)
		rt.serveNotifications(fd)
	}()
}

func (rt *Runtime) serveNotifications(fd int) {
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	for {
		select {
		case <-rt.stop:
			return
		default:
		}
		n, err := unix.Poll(pfd, 100)
		if errors.Is(err, unix.EINTR) || (err == nil && n == 0) {
			continue
		}
		if err != nil {
			return
		}
		if pfd[0].Revents&unix.POLLHUP != 0 {
			return // every process the filter applied to is gone
		}
		var call seccompNotif
		if err := notifRecv(fd, &call); err != nil {
			continue // ENOENT: the caller was interrupted meanwhile
		}
		// Each on its own: an agent round trip must not hold up other processes' calls, and a
		// fork child's agent is itself filtered (its calls are answered CONTINUE below).
		go rt.serveMapping(fd, call)
	}
}

// serveMapping answers one notified mmap or brk.
func (rt *Runtime) serveMapping(fd int, n seccompNotif) {
	resp := seccompResp{id: n.id, flags: seccompContinue}
	answered := false
	defer func() {
		if !answered {
			notifSend(fd, &resp)
		}
	}()
	p := rt.lookupThread(int(n.pid))
	if p == nil || !rt.Armed() || int32(n.pid) == p.agentTid.Load() {
		return // unknown (exec'd image before its hello), not yet armed, or the agent itself
	}
	p.agentMu.Lock()
	a := p.agent
	p.agentMu.Unlock()
	if a == nil || !notifValid(fd, n.id) {
		return
	}
	var err error
	switch n.nr {
	case unix.SYS_MMAP:
		var addr int64
		addr, err = a.Syscall(unix.SYS_MMAP, n.args)
		if err != nil {
			return // the agent is gone, and its process with it: the call was not made
		}
		resp = seccompResp{id: n.id, val: addr}
		if addr < 0 && addr > -4096 {
			resp = seccompResp{id: n.id, error: int32(addr)}
			return
		}
		p.Register(uint64(addr), pageUp(n.args[1]))
		rt.Stats.MappingsSeen.Add(1)
		if notifSend(fd, &resp) != nil {
			// The caller was interrupted and will make the call again: undo ours.
			a.Syscall(unix.SYS_MUNMAP, [6]uint64{uint64(addr), n.args[1]})
		}
		answered = true
	case unix.SYS_BRK:
		// Once the filter is in, every brk of the process is made here, one at a time (the
		// agent's lock), so the break it left is the one the next call starts from.
		p.brkMu.Lock()
		defer p.brkMu.Unlock()
		old := p.brk
		if old == 0 {
			if old, err = a.Syscall(unix.SYS_BRK, [6]uint64{}); err != nil {
				return
			}
		}
		brk, err := a.Syscall(unix.SYS_BRK, n.args)
		if err != nil {
			return
		}
		p.brk = brk
		resp = seccompResp{id: n.id, val: brk}
		if lo, hi := pageUp(uint64(old)), pageUp(uint64(brk)); hi > lo {
			p.Register(lo, hi-lo)
			rt.Stats.MappingsSeen.Add(1)
		}
		// brk is idempotent: a caller interrupted meanwhile simply makes it again.
	}
}

func pageUp(n uint64) uint64 { return (n + uffd.PageSize - 1) &^ (uffd.PageSize - 1) }

// lookupThread returns the process thread tid belongs to.
func (rt *Runtime) lookupThread(tid int) *Process {
	if p := rt.Lookup(tid); p != nil {
		return p // the main thread
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(tid) + "/status")
	if err != nil {
		return nil
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Tgid:"); ok {
			tgid, _ := strconv.Atoi(strings.TrimSpace(v))
			return rt.Lookup(tgid)
		}
	}
	return nil
}
