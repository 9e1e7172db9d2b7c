// Package uffd is a thin, exact, allocation-free binding of the Linux
// userfaultfd(2) interface, in the style of golang.org/x/sys/unix.
//
// It is mechanism only: every function is one system call (Open is at most
// three) on a userfaultfd file descriptor, with the kernel's structures laid
// out byte for byte and the kernel's errno returned unchanged as a
// unix.Errno, so callers compare err == unix.EAGAIN, unix.EEXIST,
// unix.ENOENT, unix.ESRCH directly. It keeps no state, starts no goroutines,
// retries nothing and decides nothing; policy (which pages to fetch, when to
// retry, how to order events and faults) belongs to the caller.
//
// The descriptor usually belongs to another process's mm (it is created in the
// program and received over SCM_RIGHTS), so addresses are plain uint64s in the
// faulting process's address space, never Go pointers. The only Go pointer
// that crosses the boundary is the source buffer of Copy.
//
// The kernel constants and structures are those of Linux 6.18; the system
// headers on our machines are 6.1, so UFFDIO_MOVE, UFFDIO_POISON and the
// features after UFFD_FEATURE_WP_HUGETLBFS_SHMEM are defined here from the
// kernel's include/uapi/linux/userfaultfd.h.
package uffd

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// PageSize is the base page size the ioctls work in (x86-64). Every start
// and length passed to the range ioctls must be a multiple of it.
const PageSize = 4096

// apiVersion is UFFD_API, the only API number the kernel accepts.
const apiVersion = 0xAA

// UserModeOnly is UFFD_USER_MODE_ONLY, a flag for Open: the descriptor only
// handles faults taken in user mode (faults inside system calls such as
// read(2) into a registered buffer then fail with EFAULT instead of waiting).
const UserModeOnly = 1

// Features requested from and reported by API (UFFD_FEATURE_*).
const (
	FeaturePagefaultFlagWP  uint64 = 1 << 0
	FeatureEventFork        uint64 = 1 << 1
	FeatureEventRemap       uint64 = 1 << 2
	FeatureEventRemove      uint64 = 1 << 3
	FeatureMissingHugetlbfs uint64 = 1 << 4
	FeatureMissingShmem     uint64 = 1 << 5
	FeatureEventUnmap       uint64 = 1 << 6
	FeatureSigbus           uint64 = 1 << 7
	FeatureThreadID         uint64 = 1 << 8
	FeatureMinorHugetlbfs   uint64 = 1 << 9
	FeatureMinorShmem       uint64 = 1 << 10
	FeatureExactAddress     uint64 = 1 << 11
	FeatureWPHugetlbfsShmem uint64 = 1 << 12
	FeatureWPUnpopulated    uint64 = 1 << 13
	FeaturePoison           uint64 = 1 << 14
	FeatureWPAsync          uint64 = 1 << 15
	FeatureMove             uint64 = 1 << 16
)

// Register modes (UFFDIO_REGISTER_MODE_*).
const (
	ModeMissing uint64 = 1 << 0
	ModeWP      uint64 = 1 << 1
	ModeMinor   uint64 = 1 << 2
)

// Per-ioctl modes.
const (
	CopyDontWake      uint64 = 1 << 0 // UFFDIO_COPY_MODE_DONTWAKE
	CopyWP            uint64 = 1 << 1 // UFFDIO_COPY_MODE_WP: install the pages write-protected
	ZeroPageDontWake  uint64 = 1 << 0 // UFFDIO_ZEROPAGE_MODE_DONTWAKE
	WPModeWP          uint64 = 1 << 0 // UFFDIO_WRITEPROTECT_MODE_WP; without it the range is un-protected
	WPModeDontWake    uint64 = 1 << 1 // UFFDIO_WRITEPROTECT_MODE_DONTWAKE
	MoveDontWake      uint64 = 1 << 0 // UFFDIO_MOVE_MODE_DONTWAKE
	MoveAllowSrcHoles uint64 = 1 << 1 // UFFDIO_MOVE_MODE_ALLOW_SRC_HOLES
	ContinueDontWake  uint64 = 1 << 0 // UFFDIO_CONTINUE_MODE_DONTWAKE
	ContinueWP        uint64 = 1 << 1 // UFFDIO_CONTINUE_MODE_WP
	PoisonDontWake    uint64 = 1 << 0 // UFFDIO_POISON_MODE_DONTWAKE
)

// Bits of the ioctls masks returned by API and Register: bit n is set when
// the ioctl with command number n (_UFFDIO_*) is available.
const (
	IoctlRegister     uint64 = 1 << 0x00
	IoctlUnregister   uint64 = 1 << 0x01
	IoctlWake         uint64 = 1 << 0x02
	IoctlCopy         uint64 = 1 << 0x03
	IoctlZeroPage     uint64 = 1 << 0x04
	IoctlMove         uint64 = 1 << 0x05
	IoctlWriteProtect uint64 = 1 << 0x06
	IoctlContinue     uint64 = 1 << 0x07
	IoctlPoison       uint64 = 1 << 0x08
	IoctlAPI          uint64 = 1 << 0x3F
)

// Event types (UFFD_EVENT_*), the first byte of every Msg.
const (
	EventPagefault uint8 = 0x12
	EventFork      uint8 = 0x13
	EventRemap     uint8 = 0x14
	EventRemove    uint8 = 0x15
	EventUnmap     uint8 = 0x16
)

// Pagefault flags (UFFD_PAGEFAULT_FLAG_*). A MISSING fault has neither WP
// nor Minor set.
const (
	PagefaultWrite uint64 = 1 << 0
	PagefaultWP    uint64 = 1 << 1
	PagefaultMinor uint64 = 1 << 2
)

// ioctl request numbers: _IOWR(0xAA, nr, size) = 3<<30 | size<<16 | 0xAA<<8 | nr
// and _IOR = 2<<30 | .... The size in each number is checked against the Go
// structure by the assertions below.
const (
	iocNew          = 0xAA00     // USERFAULTFD_IOC_NEW = _IO(0xAA, 0x00), on /dev/userfaultfd
	iocAPI          = 0xC018AA3F // _IOWR(0xAA, 0x3F, struct uffdio_api)
	iocRegister     = 0xC020AA00 // _IOWR(0xAA, 0x00, struct uffdio_register)
	iocUnregister   = 0x8010AA01 // _IOR(0xAA, 0x01, struct uffdio_range)
	iocWake         = 0x8010AA02 // _IOR(0xAA, 0x02, struct uffdio_range)
	iocCopy         = 0xC028AA03 // _IOWR(0xAA, 0x03, struct uffdio_copy)
	iocZeroPage     = 0xC020AA04 // _IOWR(0xAA, 0x04, struct uffdio_zeropage)
	iocMove         = 0xC028AA05 // _IOWR(0xAA, 0x05, struct uffdio_move)
	iocWriteProtect = 0xC018AA06 // _IOWR(0xAA, 0x06, struct uffdio_writeprotect)
	iocContinue     = 0xC020AA07 // _IOWR(0xAA, 0x07, struct uffdio_continue)
	iocPoison       = 0xC020AA08 // _IOWR(0xAA, 0x08, struct uffdio_poison)
)

// Kernel structures, field for field.

type uffdioAPI struct{ api, features, ioctls uint64 }

type uffdioRange struct{ start, len uint64 }

type uffdioRegister struct {
	rng    uffdioRange
	mode   uint64
	ioctls uint64
}

type uffdioCopy struct {
	dst, src, len, mode uint64
	copy                int64
}

// uffdioCount is the shape shared by uffdio_zeropage, uffdio_continue and
// uffdio_poison: a range, a mode, and a count written back by the kernel.
type uffdioCount struct {
	rng   uffdioRange
	mode  uint64
	count int64
}

type uffdioWriteProtect struct {
	rng  uffdioRange
	mode uint64
}

type uffdioMove struct {
	dst, src, len, mode uint64
	move                int64
}

// Compile-time checks that every structure has the kernel's size, and that the
// size encoded in each ioctl number agrees with it.
var (
	_ [24]byte = [unsafe.Sizeof(uffdioAPI{})]byte{}
	_ [16]byte = [unsafe.Sizeof(uffdioRange{})]byte{}
	_ [32]byte = [unsafe.Sizeof(uffdioRegister{})]byte{}
	_ [40]byte = [unsafe.Sizeof(uffdioCopy{})]byte{}
	_ [32]byte = [unsafe.Sizeof(uffdioCount{})]byte{}
	_ [24]byte = [unsafe.Sizeof(uffdioWriteProtect{})]byte{}
	_ [40]byte = [unsafe.Sizeof(uffdioMove{})]byte{}
	_ [32]byte = [unsafe.Sizeof(Msg{})]byte{}

	_ [iocAPI >> 16 & 0x3FFF]byte          = [unsafe.Sizeof(uffdioAPI{})]byte{}
	_ [iocRegister >> 16 & 0x3FFF]byte     = [unsafe.Sizeof(uffdioRegister{})]byte{}
	_ [iocUnregister >> 16 & 0x3FFF]byte   = [unsafe.Sizeof(uffdioRange{})]byte{}
	_ [iocWake >> 16 & 0x3FFF]byte         = [unsafe.Sizeof(uffdioRange{})]byte{}
	_ [iocCopy >> 16 & 0x3FFF]byte         = [unsafe.Sizeof(uffdioCopy{})]byte{}
	_ [iocZeroPage >> 16 & 0x3FFF]byte     = [unsafe.Sizeof(uffdioCount{})]byte{}
	_ [iocMove >> 16 & 0x3FFF]byte         = [unsafe.Sizeof(uffdioMove{})]byte{}
	_ [iocWriteProtect >> 16 & 0x3FFF]byte = [unsafe.Sizeof(uffdioWriteProtect{})]byte{}
	_ [iocContinue >> 16 & 0x3FFF]byte     = [unsafe.Sizeof(uffdioCount{})]byte{}
	_ [iocPoison >> 16 & 0x3FFF]byte       = [unsafe.Sizeof(uffdioCount{})]byte{}
)

// errno turns a raw syscall errno into the error returned to callers: nil or
// the unix.Errno itself. Errno values are small integers, so the conversion
// to error does not allocate.
func errno(e unix.Errno) error {
	if e != 0 {
		return e
	}
	return nil
}

// done converts a count written back by a range ioctl into bytes done. On
// failure the kernel stores the negative errno in the count field (or leaves
// it untouched, i.e. 0, when it fails before starting), so negative means
// "nothing done".
func done(n int64) int64 {
	if n < 0 {
		return 0
	}
	return n
}

// Open creates a userfaultfd with the given flags (unix.O_CLOEXEC,
// unix.O_NONBLOCK, UserModeOnly). It prefers /dev/userfaultfd
// (USERFAULTFD_IOC_NEW), which is governed by the device's file permissions
// rather than by vm.unprivileged_userfaultfd and so can handle kernel-mode
// faults without CAP_SYS_PTRACE; if the device is missing or denied it falls
// back to the userfaultfd(2) system call. The error says which path failed;
// errors.Is(err, unix.EPERM) and the like still work.
func Open(flags int) (int, error) {
	fd, devErr := openDev(flags)
	if devErr == nil {
		return fd, nil
	}
	switch devErr {
	case unix.ENOENT, unix.ENODEV, unix.ENXIO, unix.EACCES, unix.EPERM, unix.EROFS:
	default:
		return -1, fmt.Errorf("uffd: /dev/userfaultfd: %w", devErr)
	}
	fd, sysErr := openSyscall(flags)
	if sysErr != nil {
		return -1, fmt.Errorf("uffd: /dev/userfaultfd: %v; userfaultfd(2): %w", devErr, sysErr)
	}
	return fd, nil
}

// openDev creates a userfaultfd through /dev/userfaultfd.
func openDev(flags int) (int, error) {
	dev, err := unix.Open("/dev/userfaultfd", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	fd, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(dev), iocNew, uintptr(flags))
	unix.Close(dev)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

// openSyscall creates a userfaultfd through userfaultfd(2).
func openSyscall(flags int) (int, error) {
	fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, uintptr(flags), 0, 0)
	if e != 0 {
		return -1, e
	}
	return int(fd), nil
}

// API performs the UFFDIO_API handshake, enabling the requested features.
// It must be the first ioctl on a new descriptor and succeeds only once per
// descriptor (a second call is EINVAL).
//
// On success granted is every feature the kernel supports, which is a
// superset of what was enabled: only the requested features are in effect.
// To learn what is available, call API with features 0 on a throwaway
// descriptor, then open the real one. Asking for an unsupported feature is
// EINVAL, and FeatureEventFork without CAP_SYS_PTRACE is EPERM; on failure the
// kernel zeroes the structure, so granted and ioctls are 0. ioctls is the mask
// (Ioctl*) of descriptor-wide ioctls; per-range ioctls are reported by
// Register. FeatureWPAsync implies FeatureWPUnpopulated.
func API(fd int, features uint64) (granted, ioctls uint64, err error) {
	a := uffdioAPI{api: apiVersion, features: features}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocAPI, uintptr(unsafe.Pointer(&a)))
	return a.features, a.ioctls, errno(e)
}

// Register attaches the page-aligned range [start, start+length) of the
// descriptor's mm to the descriptor in the given modes (Mode*). The range
// must be covered by compatible VMAs. ioctls is the mask (Ioctl*) of range
// ioctls usable on it; for anonymous private memory registered
// ModeMissing|ModeWP that is Wake, Copy, ZeroPage, Move, WriteProtect and
// Poison. Registering a range already registered with another descriptor
// is EBUSY. (The filling ioctls, however, only check that the destination is
// registered with some userfaultfd of the same mm: a second descriptor on
// the mm can fill, but not wake, the first one's ranges.)
func Register(fd int, start, length, mode uint64) (ioctls uint64, err error) {
	r := uffdioRegister{rng: uffdioRange{start, length}, mode: mode}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocRegister, uintptr(unsafe.Pointer(&r)))
	return r.ioctls, errno(e)
}

// Unregister detaches [start, start+length) from the descriptor. Threads
// blocked on faults in the range are woken and the faults then resolve as
// if no userfaultfd existed (absent anonymous pages read as zeros).
func Unregister(fd int, start, length uint64) error {
	r := uffdioRange{start, length}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocUnregister, uintptr(unsafe.Pointer(&r)))
	return errno(e)
}

// Copy atomically installs length bytes from src (in this process) as new
// pages at dst (in the descriptor's mm) and, unless CopyDontWake, wakes the
// threads faulting in the copied range. CopyWP maps the pages write-protected
// (needs a ModeWP registration), so the first write arrives as a WP fault.
//
// copied is the number of bytes installed, which can be non-zero on failure:
// the kernel copies page by page and stops at the first page it cannot fill.
// A copy that stopped part-way reports the progress in copied and fails with
// EAGAIN (whatever stopped it); retrying from dst+copied then reports the
// real cause, e.g. EEXIST for a page already present. EAGAIN with copied == 0
// means a non-cooperative event (REMOVE, UNMAP, REMAP, FORK) is queued and
// unread: the mm is changing and the caller must read the events before
// retrying. ENOENT means dst is not (or no longer) in a registered VMA, e.g.
// it was unmapped; EFAULT means src could not be read; ESRCH means the
// target mm is gone (the process exited).
//
// src must point to length readable bytes; it is kept alive for the call.
func Copy(fd int, dst uint64, src unsafe.Pointer, length, mode uint64) (copied int64, err error) {
	c := uffdioCopy{dst: dst, src: uint64(uintptr(src)), len: length, mode: mode}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocCopy, uintptr(unsafe.Pointer(&c)))
	// src travels as an integer inside c, invisible to the GC; keep its
	// object alive until the kernel has read it. (A stack-allocated src is
	// safe too: the goroutine's stack cannot move during a system call.)
	runtime.KeepAlive(src)
	return done(c.copy), errno(e)
}

// ZeroPage maps the shared zero page over the absent pages of
// [start, start+length) and wakes the threads faulting there unless
// ZeroPageDontWake. It is the cheapest answer to a read of a never-written
// page; a later write takes an ordinary (kernel-handled) copy-on-write fault.
// zeroed and the partial/EAGAIN/EEXIST semantics are as for Copy.
func ZeroPage(fd int, start, length, mode uint64) (zeroed int64, err error) {
	z := uffdioCount{rng: uffdioRange{start, length}, mode: mode}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocZeroPage, uintptr(unsafe.Pointer(&z)))
	return done(z.count), errno(e)
}

// WriteProtect write-protects [start, start+length) when mode has WPModeWP,
// and otherwise removes the protection and wakes the threads blocked on WP
// faults in the range unless WPModeDontWake. The range needs a ModeWP
// registration. Like Copy it fails with EAGAIN while a non-cooperative event
// is unread.
func WriteProtect(fd int, start, length, mode uint64) error {
	w := uffdioWriteProtect{rng: uffdioRange{start, length}, mode: mode}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocWriteProtect, uintptr(unsafe.Pointer(&w)))
	return errno(e)
}

// Wake wakes the threads blocked on faults in [start, start+length) without
// touching any page: they retry the access, which faults again if the page is
// still absent or protected. It is the second half of a *DontWake operation.
func Wake(fd int, start, length uint64) error {
	r := uffdioRange{start, length}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocWake, uintptr(unsafe.Pointer(&r)))
	return errno(e)
}

// Move moves the pages at [src, src+length) to the absent range at dst, both
// in the descriptor's mm, by remapping them rather than copying (needs
// FeatureMove and a registration covering dst; the source need not be
// registered). A source hole is ENOENT, unless MoveAllowSrcHoles, which skips
// it and counts it in moved although nothing is installed at its
// destination. A source page still shared (e.g. after fork) is EBUSY. On our kernel it only works when issued by a thread of the target
// process itself (EINVAL from another mm). moved and the partial/EAGAIN
// semantics are as for Copy.
func Move(fd int, dst, src, length, mode uint64) (moved int64, err error) {
	m := uffdioMove{dst: dst, src: src, len: length, mode: mode}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocMove, uintptr(unsafe.Pointer(&m)))
	return done(m.move), errno(e)
}

// Poison marks the absent pages of [start, start+length) as poisoned, so
// that accessing them raises SIGBUS (as for a hardware memory error), and
// wakes faulting threads unless PoisonDontWake. Needs FeaturePoison.
// updated and the partial/EAGAIN semantics are as for Copy.
func Poison(fd int, start, length, mode uint64) (updated int64, err error) {
	p := uffdioCount{rng: uffdioRange{start, length}, mode: mode}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocPoison, uintptr(unsafe.Pointer(&p)))
	return done(p.count), errno(e)
}

// Continue resolves a minor fault (ModeMinor, shmem or hugetlbfs only) by
// mapping the page already in the page cache, and wakes faulting threads
// unless ContinueDontWake. mapped and the partial/EAGAIN semantics are as for
// Copy.
func Continue(fd int, start, length, mode uint64) (mapped int64, err error) {
	c := uffdioCount{rng: uffdioRange{start, length}, mode: mode}
	_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), iocContinue, uintptr(unsafe.Pointer(&c)))
	return done(c.count), errno(e)
}

// Msg is struct uffd_msg, exactly as read(2) returns it: the event type, 7
// reserved bytes, and a 24-byte union interpreted according to the event by
// the accessor methods.
type Msg struct {
	event uint8
	_     [7]uint8
	arg   [3]uint64
}

// Event returns the event type (Event*).
func (m *Msg) Event() uint8 { return m.event }

// Pagefault returns arg.pagefault of an EventPagefault message: the
// Pagefault* flags, the faulting address (page-aligned unless
// FeatureExactAddress was enabled) and the faulting thread's id (0 unless
// FeatureThreadID was enabled; it is a tid in the faulting process's pid
// namespace, never a pid).
func (m *Msg) Pagefault() (flags, address uint64, tid uint32) {
	return m.arg[0], m.arg[1], *(*uint32)(unsafe.Pointer(&m.arg[2]))
}

// ForkUFD returns arg.fork.ufd of an EventFork message: a new userfaultfd,
// already installed in the reading process's descriptor table, that serves
// the child's copy of the registered ranges. The reader owns it and must
// close it.
func (m *Msg) ForkUFD() int { return int(*(*uint32)(unsafe.Pointer(&m.arg[0]))) }

// Remap returns arg.remap of an EventRemap message: an mremap moved length
// bytes of registered memory from from to to; the registration moved with
// them. With FeatureEventUnmap the same mremap then also reports an
// EventUnmap of the old range [from, from+length), after the REMAP: apply
// the REMAP first and the UNMAP finds nothing left to drop.
func (m *Msg) Remap() (from, to, length uint64) { return m.arg[0], m.arg[1], m.arg[2] }

// Range returns arg.remove of an EventRemove or EventUnmap message: the
// half-open range [start, end) that madvise(MADV_DONTNEED/MADV_REMOVE/
// MADV_FREE) is discarding, or that munmap (or an mmap/mremap over it)
// unmapped. REMOVE is sent before the pages are zapped: the madvise caller
// is blocked until the message is read and zaps only then, so the pages are
// gone once madvise has returned, not when the message is read. UNMAP is
// sent after the unmap.
func (m *Msg) Range() (start, end uint64) { return m.arg[0], m.arg[1] }

// ReadMsgs reads up to len(buf) messages into buf with one read(2) and
// returns how many it read. It does not allocate.
//
// On a blocking descriptor it sleeps until at least one message is pending;
// on a non-blocking one it returns unix.EAGAIN when none is. A fault message
// is delivered once: the faulting thread stays blocked until an ioctl covering
// its address wakes it. A non-cooperative event (REMOVE, UNMAP, REMAP, FORK)
// blocks the thread that caused it until the message is read here, and until
// then Copy, ZeroPage, WriteProtect and Move fail with EAGAIN; so the reader
// of events must never wait on anything that waits on a fault. An empty buf
// is EINVAL, as the kernel answers for a buffer shorter than one message.
func ReadMsgs(fd int, buf []Msg) (n int, err error) {
	if len(buf) == 0 {
		return 0, unix.EINVAL
	}
	r, _, e := unix.Syscall(unix.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&buf[0])),
		uintptr(len(buf))*unsafe.Sizeof(Msg{}))
	if e != 0 {
		return 0, e
	}
	return int(r / unsafe.Sizeof(Msg{})), nil
}

// String formats the message for debugging.
func (m Msg) String() string {
	switch m.event {
	case EventPagefault:
		flags, addr, tid := m.Pagefault()
		return fmt.Sprintf("pagefault{flags:%#x addr:%#x tid:%d}", flags, addr, tid)
	case EventFork:
		return fmt.Sprintf("fork{ufd:%d}", m.ForkUFD())
	case EventRemap:
		from, to, length := m.Remap()
		return fmt.Sprintf("remap{from:%#x to:%#x len:%#x}", from, to, length)
	case EventRemove:
		start, end := m.Range()
		return fmt.Sprintf("remove{%#x-%#x}", start, end)
	case EventUnmap:
		start, end := m.Range()
		return fmt.Sprintf("unmap{%#x-%#x}", start, end)
	}
	return fmt.Sprintf("event%#x{%#x %#x %#x}", m.event, m.arg[0], m.arg[1], m.arg[2])
}

// SetForkUFD sets arg.fork.ufd of an EventFork message: the descriptor number the new userfaultfd
// has in the reading process (a message read by another process and passed on with the
// descriptor itself).
func (m *Msg) SetForkUFD(fd int) { *(*uint32)(unsafe.Pointer(&m.arg[0])) = uint32(fd) }
