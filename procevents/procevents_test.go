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

func listen(t *testing.T) *Events {
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

// Each child this test starts is told twice, among whatever else the machine does meanwhile: its
// fork, with this process as its parent, and its exec, with its pid.
func TestForkAndExecTold(t *testing.T) {
	e := listen(t)
	want := map[Event]bool{}
	for range 5 {
		c := exec.Command("/bin/true")
		if err := c.Run(); err != nil {
			t.Fatal(err)
		}
		want[Event{Kind: Fork, Pid: c.Process.Pid, Parent: os.Getpid()}] = true
		want[Event{Kind: Exec, Pid: c.Process.Pid}] = true
	}
	got := make(chan Event, 64)
	go func() {
		for {
			ev, err := e.Next()
			if errors.Is(err, ErrLost) {
				continue
			}
			if err != nil {
				close(got)
				return
			}
			got <- ev
		}
	}()
	deadline := time.After(10 * time.Second)
	for len(want) > 0 {
		select {
		case ev, ok := <-got:
			if !ok {
				t.Fatalf("the reader stopped with %d events untold", len(want))
			}
			delete(want, ev)
		case <-deadline:
			t.Fatalf("%v not told within 10 s", want)
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

// parse tells an exec and a fork of a process; a fork that made a thread, another event, another
// connector's message and a short one are none.
func TestParse(t *testing.T) {
	msg := func(idx uint32, what uint32, data ...int32) []byte {
		b := make([]byte, nlmsgHdrLen+cnMsgLen+eventHdrLen+4*len(data))
		c := b[nlmsgHdrLen:]
		le := binary.LittleEndian
		le.PutUint32(c[0:], idx)
		le.PutUint32(c[4:], cnValProc)
		le.PutUint16(c[16:], uint16(eventHdrLen+4*len(data)))
		ev := c[cnMsgLen:]
		le.PutUint32(ev, what)
		for i, d := range data {
			le.PutUint32(ev[eventHdrLen+4*i:], uint32(d))
		}
		return b
	}
	for name, tc := range map[string]struct {
		m    []byte
		want Event
	}{
		"exec": {msg(cnIdxProc, eventExec, 4243, 4242), Event{Kind: Exec, Pid: 4242}},
		"fork": {msg(cnIdxProc, eventFork, 4201, 4200, 4242, 4242), Event{Kind: Fork, Pid: 4242, Parent: 4200}},
	} {
		if got, ok := parse(tc.m); !ok || got != tc.want {
			t.Errorf("%s read as %+v, %v; want %+v", name, got, ok, tc.want)
		}
	}
	for name, m := range map[string][]byte{
		"a thread":          msg(cnIdxProc, eventFork, 4201, 4200, 4242, 4200),
		"an exit":           msg(cnIdxProc, 0x80000000, 4242, 4242, 0, 0),
		"another connector": msg(2, eventExec, 4243, 4242),
		"a short exec":      msg(cnIdxProc, eventExec, 4243),
		"a short fork":      msg(cnIdxProc, eventFork, 4201, 4200, 4242),
	} {
		if ev, ok := parse(m); ok {
			t.Errorf("%s read as %+v", name, ev)
		}
	}
}
