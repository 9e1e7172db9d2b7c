package procevents

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func listen(t *testing.T) *Execs {
	t.Helper()
	e, err := Listen()
	if errors.Is(err, unix.EPERM) && os.Geteuid() != 0 {
		t.Skip("listening to process events needs CAP_NET_ADMIN: run as root")
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e
}

// An exec is told with the pid of the process that made it: every child this test starts, among
// whatever else the machine execs meanwhile.
func TestExecTold(t *testing.T) {
	e := listen(t)
	want := map[int]bool{}
	for range 5 {
		c := exec.Command("/bin/true")
		if err := c.Run(); err != nil {
			t.Fatal(err)
		}
		want[c.Process.Pid] = true
	}
	got := make(chan int, 64)
	go func() {
		for {
			pid, err := e.Next()
			if errors.Is(err, ErrLost) {
				continue
			}
			if err != nil {
				close(got)
				return
			}
			got <- pid
		}
	}()
	deadline := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case pid, ok := <-got:
			if !ok {
				t.Fatalf("the reader stopped with %d execs untold", len(want))
			}
			delete(want, pid)
		case <-deadline:
			t.Fatalf("execs of %v not told within 10 s", want)
		}
	}
}

// Close ends a Next that waits, with os.ErrClosed.
func TestCloseEndsNext(t *testing.T) {
	e := listen(t)
	done := make(chan error, 1)
	go func() {
		for {
			if _, err := e.Next(); err != nil && !errors.Is(err, ErrLost) {
				done <- err
				return
			}
		}
	}()
	time.Sleep(50 * time.Millisecond)
	e.Close()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrClosed) {
			t.Fatalf("Next after Close: %v, want os.ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Next still waits 10 s after Close")
	}
}

// A message that is not an exec event is none: another event, another connector, a short one.
func TestExecOfOthers(t *testing.T) {
	msg := func(idx uint32, what uint32, tgid int32) []byte {
		b := make([]byte, nlmsgHdrLen+cnMsgLen+execLen)
		c := b[nlmsgHdrLen:]
		le := binary.LittleEndian
		le.PutUint32(c[0:], idx)
		le.PutUint32(c[4:], cnValProc)
		le.PutUint16(c[16:], execLen)
		ev := c[cnMsgLen:]
		le.PutUint32(ev, what)
		le.PutUint32(ev[eventHdrLen+4:], uint32(tgid))
		return b
	}
	if tgid, ok := execOf(msg(cnIdxProc, eventExec, 4242)); !ok || tgid != 4242 {
		t.Fatalf("an exec of 4242 read as %d, %v", tgid, ok)
	}
	for name, m := range map[string][]byte{
		"fork":              msg(cnIdxProc, 0x1, 4242),
		"another connector": msg(2, eventExec, 4242),
		"short":             msg(cnIdxProc, eventExec, 4242)[:nlmsgHdrLen+cnMsgLen+8],
	} {
		if _, ok := execOf(m); ok {
			t.Errorf("%s read as an exec", name)
		}
	}
}
