package launcher

import (
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/farmem/farmem/evictor"
)

// agentPair returns an agentConn and the other end of its socket, as the shim's agent holds it.
func agentPair(t *testing.T) (*agentConn, int) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fds[0]), "agent")
	nc, err := net.FileConn(f) // what acceptLoop hands handleConn: a netpoller connection
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	a, err := newAgentConn(&conn{c: nc.(*net.UnixConn)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); unix.Close(fds[1]) })
	return a, fds[1]
}

// A request is answered over the blocking socket: the agent's reply comes back whole.
func TestAgentConnExchange(t *testing.T) {
	a, peer := agentPair(t)
	go func() {
		var b [msgSize + maxRuns*16]byte
		n, _ := unix.Read(peer, b[:])
		req, err := decode(b[:n])
		if err != nil || req.Type != msgSyscall {
			return
		}
		var out [msgSize]byte
		unix.Write(peer, (&msg{Type: msgSyscallDone, Version: protoVersion, A: 42}).encode(out[:]))
	}()
	r, err := a.Syscall(unix.SYS_GETPID, [6]uint64{})
	if err != nil || r != 42 {
		t.Fatalf("Syscall = %d, %v; want 42, nil", r, err)
	}
}

// Close ends a request the agent never answers (the process is being retired): ErrGone, not a
// thread blocked for ever, and later requests fail the same way.
func TestAgentConnCloseEndsRequestInFlight(t *testing.T) {
	a, _ := agentPair(t)
	done := make(chan error, 1)
	go func() {
		done <- a.Move([]evictor.Run{{Addr: 1 << 30, Len: pageSize}}, 2<<30, 0, make([]byte, 1))
	}()
	time.Sleep(50 * time.Millisecond) // let Move block in recvmsg (if it has not, Close still ends it)
	a.Close()
	select {
	case err := <-done:
		if !errors.Is(err, evictor.ErrGone) {
			t.Fatalf("Move after Close = %v, want ErrGone", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Move still blocked after Close")
	}
	if _, err := a.Staging(1<<20, 0); !errors.Is(err, evictor.ErrGone) {
		t.Fatalf("Staging after Close = %v, want ErrGone", err)
	}
}

// An agent that exits (its end closed) is ErrGone.
func TestAgentConnPeerGone(t *testing.T) {
	a, peer := agentPair(t)
	unix.Close(peer)
	if err := a.Drop(func() []evictor.Run { return []evictor.Run{{Addr: 1 << 30, Len: pageSize}} }); !errors.Is(err, evictor.ErrGone) {
		t.Fatalf("Drop to a closed agent = %v, want ErrGone", err)
	}
}
