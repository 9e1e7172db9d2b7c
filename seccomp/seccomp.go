// Package seccomp is a thin, exact binding of the supervisor's side of seccomp user
// notification (seccomp_unotify(2)), in the style of golang.org/x/sys/unix and of package uffd.
//
// Every function is one ioctl on a notification listener descriptor (the one
// SECCOMP_FILTER_FLAG_NEW_LISTENER returns to whoever installs the filter), with the kernel's
// structures laid out byte for byte and its errno returned unchanged as a unix.Errno. It keeps
// no state and decides nothing: which calls to notify is the filter's business (farmem's is
// installed by the preload shim's agent, launcher/shim/shim.c), and what to do with a call is the
// caller's. An interrupted ioctl (EINTR) is restarted, as the kernel would restart it.
package seccomp

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Notif is struct seccomp_notif: one system call held by the filter until it is answered.
type Notif struct {
	ID    uint64 // the call's cookie: answer it, or check it, by this
	Pid   uint32 // the calling thread, in the listener's pid namespace
	Flags uint32
	Data  Data
}

// Data is struct seccomp_data: the call as the filter saw it.
type Data struct {
	Nr   int32 // the system call number
	Arch uint32
	IP   uint64 // the instruction pointer at the call
	Args [6]uint64
}

// Resp is struct seccomp_notif_resp: the answer to a notification. With FlagContinue the kernel
// makes the call as if the filter had allowed it (Val and Error must be 0); otherwise the call
// returns Val, or fails with -Error when Error is non-zero (Error is a negative errno).
type Resp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

// FlagContinue is SECCOMP_USER_NOTIF_FLAG_CONTINUE.
const FlagContinue = unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE

// The kernel checks the sizes the ioctl numbers encode; these fail to compile if a struct drifts.
var (
	_ [unix.SECCOMP_IOCTL_NOTIF_RECV >> 16 & 0x3FFF]byte = [unsafe.Sizeof(Notif{})]byte{}
	_ [unix.SECCOMP_IOCTL_NOTIF_SEND >> 16 & 0x3FFF]byte = [unsafe.Sizeof(Resp{})]byte{}
)

// Receive waits for the next notification on listener fd (SECCOMP_IOCTL_NOTIF_RECV), unless fd
// is non-blocking. ENOENT: the caller went away (a signal) between the wakeup and the read.
func Receive(fd int, n *Notif) error {
	*n = Notif{} // the kernel refuses a buffer that is not zeroed
	return ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(n))
}

// Respond answers a notification (SECCOMP_IOCTL_NOTIF_SEND). ENOENT: the caller was interrupted
// meanwhile and will make the call again (its answer is lost).
func Respond(fd int, r *Resp) error {
	return ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(r))
}

// IDValid reports whether notification id is still pending (SECCOMP_IOCTL_NOTIF_ID_VALID): the
// caller has not been interrupted, so its pid still names the thread that made the call.
func IDValid(fd int, id uint64) bool {
	return ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, unsafe.Pointer(&id)) == nil
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	for {
		_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
		switch e {
		case 0:
			return nil
		case unix.EINTR:
			continue
		}
		return e
	}
}
