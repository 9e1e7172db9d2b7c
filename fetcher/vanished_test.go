package fetcher

import (
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/pagetable"
	"github.com/farmem/farmem/uffd"
)

// A page recorded resident and found absent is served as zeros only if it was adopted: the
// kernel alone ever held it, and it drops such a page only at the program's request. A page
// farmem installed and then lost is a record gone wrong: the program is stopped, never given
// zeros. Here both are zapped with no REMOVE event (the uffd has none), as a lazily freed page
// the kernel reclaims would be, or a discard whose zap came after adopt read pagemap.
func TestVanishedPage(t *testing.T) {
	const n = 2
	mem, addr, fd := mapRegistered(t, n)
	be, tb := storeAndTable(t)
	page := fillPages(t, fd, addr, n)
	adopted, installed := addr, addr+ps
	tb.Adopt(adopted)
	tb.Install(installed, pagetable.Written, 0)
	if err := unix.Madvise(mem, unix.MADV_DONTNEED); err != nil {
		t.Fatal(err)
	}

	_, host, stats := serveSelf(t, fd, tb, be)

	select {
	case b := <-readByte(mem):
		if b != 0 {
			t.Fatalf("the adopted page, dropped by the kernel, read %d, want 0", b)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("a fault on an adopted page the kernel dropped was not served (fail: %q)", host.failure())
	}
	tb.Lock()
	e := tb.Get(adopted)
	tb.Unlock()
	if e == nil || e.State != pagetable.Resident || e.Adopted || stats.Vanished.Load() != 1 {
		t.Errorf("after the fault: %+v, vanished %d; want a zero page farmem installed, vanished 1", e, stats.Vanished.Load())
	}
	if host.failure() != "" {
		t.Errorf("the program was stopped for the adopted page: %s", host.failure())
	}

	got := readByte(mem[ps:])
	for end := time.Now().Add(10 * time.Second); host.failure() == "" && time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
	}
	select {
	case b := <-got:
		t.Fatalf("the page farmem installed, lost, was served (%d)", b)
	default:
	}
	if !strings.Contains(host.failure(), "absent") {
		t.Errorf("the page farmem installed, lost: failure %q, want the program stopped", host.failure())
	}
	// The stopped program is gone for farmem; here the test itself lets its reader go, before its
	// memory is unmapped under it.
	if _, err := uffd.Copy(fd, installed, unsafe.Pointer(&page[0]), ps, 0); err != nil {
		t.Fatal(err)
	}
	<-got
}
