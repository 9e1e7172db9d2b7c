package fetcher

import (
	"errors"
	"sync/atomic"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/pubtable"
	"github.com/farmem/farmem/uffd"
)

// Once the agent reads the uffd, its read of an event lifts the kernel's fence before farmem
// has applied the event, so everything farmem asks the kernel about the process's layout goes
// through the gate its installs do: ZeroPage, which the runtime's adopt uses to ask whether a
// present page lies in a registered mapping (EEXIST), says EAGAIN while an event the agent read
// is not applied, as the kernel says while one is not read, and EEXIST again once it is.
func TestZeroPageWaitsForTheAgentsEvents(t *testing.T) {
	_, addr, fd := mapRegistered(t, 1)
	if _, err := uffd.ZeroPage(fd, addr, ps, uffd.ZeroPageDontWake); err != nil {
		t.Fatal(err) // the page is present from now on
	}
	words, err := pubtable.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(words.Close)
	be, tb := storeAndTable(t)
	f, err := New(Config{UFFD: fd, Table: tb, Backend: be, Host: &selfHost{}, Stats: &Stats{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	f.installCtl.Store(words.Ctl())

	// The control page as the agent maps it: its second word counts the events it read.
	b, err := unix.Mmap(words.FD(), pubtable.CtlOffset, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	ctl := (*[8]atomic.Uint64)(unsafe.Pointer(&b[0]))

	if _, err := f.ZeroPage(addr, ps, uffd.ZeroPageDontWake); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("no event outstanding: %v, want EEXIST", err)
	}
	ctl[1].Add(1) // the agent read an event
	if _, err := f.ZeroPage(addr, ps, uffd.ZeroPageDontWake); !errors.Is(err, unix.EAGAIN) {
		t.Fatalf("an event read by the agent and not applied: %v, want EAGAIN", err)
	}
	words.Ctl().Applied(1)
	if _, err := f.ZeroPage(addr, ps, uffd.ZeroPageDontWake); !errors.Is(err, unix.EEXIST) {
		t.Fatalf("the event applied: %v, want EEXIST", err)
	}
	if ctl[0].Load() != 0 {
		t.Fatal("the control page's lock is still held")
	}
}
