package remote

import (
	"strings"
	"testing"
	"time"
)

// A replacement copy whose filling fails because the copy it is filled from cannot be read
// (its server stopped answering for a while, alive to the ctrl) is filled once that server
// answers again: the slab is whole, and the replacement holds every page.
func TestReplacementFilledOnceItsSourceAnswers(t *testing.T) {
	c := newCluster(t, 0)
	src, stalled := c.addStallServer()
	other := c.addServer()
	failed := make(chan struct{}, 1)
	s, err := Open(Config{Ctrl: c.ctrl, Token: token, Replicas: 2, Name: t.Name(), Timeout: 300 * time.Millisecond,
		Logf: func(format string, args ...any) {
			t.Logf(format, args...)
			if strings.HasPrefix(format, "farmem: filling the replacement copy of slab") {
				select {
				case failed <- struct{}{}:
				default:
				}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	pages := storePages(t, s, 54, 600) // 3 slabs, every one on both servers
	waitSpare(t, s)
	c.addServer() // where the replacements go

	stalled.stall(true)
	other.kill()
	select {
	case <-failed:
	case <-time.After(30 * time.Second):
		t.Fatalf("no replacement copy was filled from %s, which does not answer", src.addr)
	}
	stalled.stall(false)
	c.whole(s, 2)
	// The replacements hold every page: read them with the first server stalled again.
	stalled.stall(true)
	verify(t, s, pages)
}
