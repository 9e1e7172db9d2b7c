package remote

import (
	"net"
	"sync"
	"testing"
)

// stallProxy forwards tcp connections to a memory server. Stalled, it forwards nothing (nor
// drops anything) until it is resumed: the server stops answering, as one stuck or cut off
// behind a congested link would, while it, its memory and its heartbeats to the ctrl live on.
// A request made meanwhile times out; a connection that carried none works again on resume.
type stallProxy struct {
	ln net.Listener
	to string

	mu      sync.Mutex
	flowing *sync.Cond        // on mu: broadcast when stalled or closed changes
	stalled bool              // protected by mu
	closed  bool              // protected by mu
	conns   map[net.Conn]bool // protected by mu: both ends of every forwarded connection
}

// addStallServer adds a memory server that the ctrl and clients reach through a stallProxy.
func (c *cluster) addStallServer() (*memserver, *stallProxy) {
	var p *stallProxy
	m := c.addServerVia(func(addr string) string {
		p = newStallProxy(c.t, addr)
		return p.ln.Addr().String()
	})
	return m, p
}

func newStallProxy(t *testing.T, to string) *stallProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &stallProxy{ln: ln, to: to, conns: map[net.Conn]bool{}}
	p.flowing = sync.NewCond(&p.mu)
	go p.serve()
	t.Cleanup(p.close)
	return p
}

func (p *stallProxy) serve() {
	for {
		in, err := p.ln.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.to)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			in.Close()
			out.Close()
			return
		}
		p.conns[in], p.conns[out] = true, true
		p.mu.Unlock()
		go p.pipe(in, out)
		go p.pipe(out, in)
	}
}

// pipe copies src to dst, holding what it read while the proxy is stalled.
func (p *stallProxy) pipe(dst, src net.Conn) {
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled && !p.closed {
				p.flowing.Wait()
			}
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// stall stops forwarding, or resumes it.
func (p *stallProxy) stall(stalled bool) {
	p.mu.Lock()
	p.stalled = stalled
	p.flowing.Broadcast()
	p.mu.Unlock()
}

func (p *stallProxy) close() {
	p.ln.Close()
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.flowing.Broadcast()
	p.mu.Unlock()
}
