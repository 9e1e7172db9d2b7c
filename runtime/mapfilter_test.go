package runtime

import (
	"testing"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/seccomp"
)

// RawFork tells libc's fork() (glibc clones with CLONE_CHILD_SETTID|CLONE_CHILD_CLEARTID, and
// runs the shim's atfork handlers) from the fork system call and a raw clone(SIGCHLD).
func TestRawFork(t *testing.T) {
	const glibcFork = unix.CLONE_CHILD_SETTID | unix.CLONE_CHILD_CLEARTID | uint64(unix.SIGCHLD)
	for _, tc := range []struct {
		name string
		call seccomp.Data
		raw  bool
	}{
		{"glibc fork()", seccomp.Data{Nr: unix.SYS_CLONE, Args: [6]uint64{glibcFork}}, false},
		{"clone(SIGCHLD)", seccomp.Data{Nr: unix.SYS_CLONE, Args: [6]uint64{uint64(unix.SIGCHLD)}}, true},
		{"clone with CLONE_CHILD_SETTID alone", seccomp.Data{Nr: unix.SYS_CLONE, Args: [6]uint64{unix.CLONE_CHILD_SETTID | uint64(unix.SIGCHLD)}}, true},
		{"fork system call", seccomp.Data{Nr: unix.SYS_FORK}, true},
	} {
		if got := RawFork(tc.call); got != tc.raw {
			t.Errorf("%s: RawFork = %v, want %v", tc.name, got, tc.raw)
		}
	}
}
