package fetcher

import (
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/pubtable"
	"github.com/farmem/farmem/uffd"
)

// A process whose agent serves faults (docs/DESIGN.md, "Where a fault is served") has the
// agent's fault thread read its uffd: it installs what its page table's words let it (package
// pubtable), posting each install, and sends every other message here, on a socket, as the
// uffd_msg the kernel gave it (a FORK event's new uffd goes along as SCM_RIGHTS). The fault
// thread reads that socket where it would read the uffd, in the same order, and serves alike,
// with farmem's own copy of the uffd for the ioctls. Three things keep the two in step:
//
//   - the posts are read (PageTable.Drain) before the messages the agent sent after them are
//     applied, and a page the agent claimed is farmem's again only once its post is read;
//   - the agent serves nothing while an event it read is not applied here (the control page's
//     event counts), so the table it reads is never behind the program's layout;
//   - farmem installs only under the control page's lock, which the agent holds across each
//     read of the uffd, and only when every event read is applied: an event not yet read holds
//     the install in the kernel (EAGAIN), one read and not applied sends it back to wait for it,
//     as when farmem reads the uffd itself. So no install lands in a parent after its fork is
//     read and before its child's table is cloned.

// inProgram is the fault thread's side of a process whose agent serves faults.
type inProgram struct {
	sock   int           // farmem's end of the socket the agent sends messages on
	ctl    *pubtable.Ctl // the control page
	grant  int64         // the room the agent is kept at, when the cap allows
	closed bool          // the agent's end is gone (the process exited or exec'd)
	// faults served by the agent and read from its posts since topUp last told the host, and
	// the thread of the last one. Fault thread only.
	faults  int
	lastTid int32
	oob     []byte
}

// HandOver has the agent's fault thread read the uffd from now on (its socket is sock, which
// the fetcher takes; ctl is the process's control page): the fault thread stops reading the
// uffd between two reads, tells the agent to start, and reads sock instead. The agent is kept
// at grant pages of room when the cap allows. Any goroutine; once.
func (f *Fetcher) HandOver(sock int, ctl *pubtable.Ctl, grant int64) {
	f.handover.Store(&inProgram{sock: sock, ctl: ctl, grant: grant, oob: make([]byte, unix.CmsgSpace(4))})
	var one = [8]byte{1}
	unix.Write(f.room, one[:])
}

// takeOver is the fault thread's switch to the agent's socket, between two reads of the uffd:
// what it read from the uffd before is its own to finish. It returns the descriptor to poll.
func (f *Fetcher) takeOver() int {
	in := f.handover.Load()
	if in == nil || f.in != nil {
		return -1
	}
	f.in = in
	f.installCtl.Store(in.ctl)
	if _, err := unix.Write(in.sock, []byte{'g'}); err != nil {
		in.closed = true
		return -1
	}
	return in.sock
}

// recv reads up to len(msgs) messages the agent sent on. The table is locked.
func (in *inProgram) recv(msgs []uffd.Msg) (int, error) {
	n := 0
	for n < len(msgs) && !in.closed {
		b := unsafe.Slice((*byte)(unsafe.Pointer(&msgs[n])), unsafe.Sizeof(msgs[n]))
		got, oobn, _, _, err := unix.Recvmsg(in.sock, b, in.oob, unix.MSG_DONTWAIT|unix.MSG_CMSG_CLOEXEC)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			if n == 0 {
				return 0, unix.EAGAIN
			}
			return n, nil
		case err != nil || got == 0:
			// The agent's end is gone with its process (exit, exec): what the process
			// needs now is its retirement, which its exit watcher or its new image's hello
			// brings.
			in.closed = true
			continue
		case got != len(b):
			continue
		}
		if msgs[n].Event() == uffd.EventFork {
			fd := forkFD(in.oob[:oobn])
			if fd < 0 {
				continue // nothing to serve the child with: its faults are its parent's lifeline's
			}
			msgs[n].SetForkUFD(fd)
		}
		n++
	}
	if n == 0 {
		return 0, unix.EAGAIN
	}
	return n, nil
}

// forkFD returns the descriptor a FORK event's message carried, or -1.
func forkFD(oob []byte) int {
	cms, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return -1
	}
	fd := -1
	for _, cm := range cms {
		if fds, err := unix.ParseUnixRights(&cm); err == nil {
			for _, x := range fds {
				if fd < 0 {
					fd = x
				} else {
					unix.Close(x)
				}
			}
		}
	}
	return fd
}

// topUp reads the agent's posts and gives it room again, once it has used half its grant: room
// the agent holds is counted resident, so the evictor makes it as for the program's own faults.
// The room comes from below the evictor's high watermark, as a prefetch's does, so that what
// lies between it and the cap stays for the faults farmem serves while a batch runs. The
// evictor keeps little room until faults wait for it, and an agent with none sends its faults
// on, a switch more each: so an agent left short counts as a fault that waited at the cap.
func (f *Fetcher) topUp() {
	in := f.in
	if in == nil || in.closed {
		return
	}
	t := f.table
	t.LockForFault()
	t.Drain(in.faulted)
	short := false
	if want := in.grant - in.ctl.Room(); want > in.grant/2 {
		give := min(want, f.host.PrefetchRoom())
		t.Grant(give)
		short = give < want
	}
	t.Unlock()
	if short {
		f.host.RoomShort()
	}
	// Where the program's threads and the agent's fault thread run is decided as for farmem's
	// own faults (Host.Faulting), with the faults the agent served.
	for ; in.faults > 0; in.faults-- {
		f.host.Faulting(in.lastTid)
	}
}

// faulted notes a fault the agent served, for topUp to tell the host. The table is locked.
func (in *inProgram) faulted(tid int32) { in.faults, in.lastTid = in.faults+1, tid }

// copy is uffd.Copy into the process. Once the agent reads the uffd, farmem installs only
// under the control page's lock with every event read applied (see above): otherwise EAGAIN,
// which the caller takes for an event still to be read. Any goroutine (the prefetch worker's
// installs too).
func (f *Fetcher) copy(dst uint64, src unsafe.Pointer, n, mode uint64) (int64, error) {
	c := f.installCtl.Load()
	if c == nil {
		return uffd.Copy(f.fd, dst, src, n, mode)
	}
	if !c.LockInstall() {
		return 0, unix.EAGAIN
	}
	defer c.UnlockInstall()
	return uffd.Copy(f.fd, dst, src, n, mode)
}

// ZeroPage is uffd.ZeroPage into the process, through Fenced. The runtime's adopt asks it
// whether a page is in a mapping of the process's that is registered (ZeroPageDontWake, on a
// page present: EEXIST), and must hear EAGAIN there as well: the agent's read of a REMAP lets the
// program go on, the pages already at their new address, while the table still holds them at the
// old one; adopted at the new one, they would be recorded twice, and the move's entries replace
// the adopted ones under a batch that took one of them as its victim. Any goroutine.
func (f *Fetcher) ZeroPage(dst, n, mode uint64) (zeroed int64, err error) {
	err = f.Fenced(func() error {
		zeroed, err = uffd.ZeroPage(f.fd, dst, n, mode)
		return err
	})
	return zeroed, err
}

// Fenced runs op, an ioctl on the process's uffd, where the kernel's fence on it tells the
// layout as farmem's page table holds it. The kernel fails every such ioctl (EAGAIN) while a
// layout event is raised and not read; once the agent reads the uffd, one it read and farmem
// has not applied yet must fail it too: op then runs under the control page's lock, as copy
// does, only with every event read applied, and Fenced returns EAGAIN otherwise. Any goroutine.
func (f *Fetcher) Fenced(op func() error) error {
	c := f.installCtl.Load()
	if c == nil {
		return op()
	}
	if !c.LockInstall() {
		return unix.EAGAIN
	}
	defer c.UnlockInstall()
	return op()
}
