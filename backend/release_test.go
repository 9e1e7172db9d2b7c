package backend

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// The releaser gives ranges back with one process_madvise on PIDFD_SELF where the kernel has
// it (6.15 and later), and with a madvise each before: either way the kernel drops the pages.
func TestReleaserGivesRangesBack(t *testing.T) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	hasSelf := major > 6 || major == 6 && minor >= 15
	for _, loop := range []bool{false, true} {
		selfMadviseFails.Store(loop)
		a := newArena(PageSize, 1<<20)
		for i := range 256 {
			if _, err := a.put(blob(i, PageSize)); err != nil {
				t.Fatal(err)
			}
		}
		// Every other page, in many ranges: more than one process_madvise takes.
		data := a.chunks[0].data
		for p := 0; p < 256; p += 2 {
			a.rel.add(data[p*PageSize : (p+1)*PageSize])
		}
		for p := 0; p < 2*maxIovecs; p++ { // the same ranges again, past UIO_MAXIOV
			a.rel.add(data[(p%128)*2*PageSize : ((p%128)*2+1)*PageSize])
		}
		a.rel.flush()
		if got := residentPages(t, &a); got != 128 {
			t.Errorf("loop %v: %d pages resident after giving back 128 of 256, want 128", loop, got)
		}
		if !loop && hasSelf && selfMadviseFails.Load() {
			t.Errorf("process_madvise on PIDFD_SELF failed on Linux %d.%d, which has it", major, minor)
		}
		a.close()
	}
	selfMadviseFails.Store(false)
}
