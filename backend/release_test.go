package backend

import (
	"bytes"
	"fmt"
	"testing"

	"golang.org/x/sys/unix"
)

// The releaser gives ranges back with one process_madvise on PIDFD_SELF where the kernel has
// it (6.15 and later), and with a madvise each before: either way the kernel drops the pages,
// from a file arena's memfd too.
func TestReleaserGivesRangesBack(t *testing.T) {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		t.Fatal(err)
	}
	var major, minor int
	fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	hasSelf := major > 6 || major == 6 && minor >= 15
	for _, kind := range []string{"anonymous", "file"} {
		for _, loop := range []bool{false, true} {
			releaseRanges(t, kind, loop, hasSelf)
		}
	}
}

func releaseRanges(t *testing.T, kind string, loop, hasSelf bool) {
	fails := &selfMadviseFails[0]
	a := newArena(PageSize, 1<<20)
	if kind == "file" {
		fd, err := newStoreFile()
		if err != nil {
			t.Fatal(err)
		}
		a = newFileArena(fd, PageSize, 1<<20, PageSize)
		fails = &selfMadviseFails[1]
	}
	defer fails.Store(false)
	fails.Store(loop)
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
		t.Errorf("%s, loop %v: %d pages resident after giving back 128 of 256, want 128", kind, loop, got)
	}
	if kind == "anonymous" && !loop && hasSelf && fails.Load() {
		t.Errorf("process_madvise(MADV_DONTNEED) on PIDFD_SELF failed, on a kernel which has it")
	}
	for i := 1; i < 256; i += 2 { // the pages kept read back
		if got := a.get(i + 1); !bytes.Equal(got, blob(i, PageSize)) {
			t.Fatalf("%s, loop %v: blob %d changed by giving back its neighbours", kind, loop, i+1)
		}
	}
	a.close()
}
