package remote

import (
	"fmt"
	"strings"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/fabric"
)

// DescribeLoad says which copy of slot a read prefers now: the memory server, how it is reached
// (tcp, shm or rdma) and the replica's index in the slab. The tracer asks this after a fault
// kept for being slow, so it names the copy a read would take at that moment: the one the fault
// read unless it failed over meanwhile. A head-sampled fault knows which copy answered
// (LoadTraced) and does not ask.
func (s *Store) DescribeLoad(slot backend.Slot) (server, transport string, replica int, ok bool) {
	sl, _, err := s.slot(slot)
	if err != nil {
		return "", "", 0, false
	}
	sl.mu.RLock()
	defer sl.mu.RUnlock()
	best := -1
	for i, r := range sl.replicas {
		if r.usable() && (best < 0 || preferred(r.srv, sl.replicas[best].srv)) {
			best = i
		}
	}
	if best < 0 {
		return "", "", 0, false
	}
	srv := sl.replicas[best].srv
	transport = srv.transportName()
	if transport == "" {
		transport = "unknown" // not dialed yet
	}
	return srv.addr, transport, best, true
}

// transportName names a transport after its type: *fabric.TCPClient -> "tcp". By type name,
// not by a type switch, because the rdma transport's type exists only in builds with it.
func transportName(t fabric.Transport) string {
	name := strings.ToLower(strings.TrimPrefix(fmt.Sprintf("%T", t), "*fabric."))
	for _, k := range []string{"shm", "rdma", "tcp"} {
		if strings.Contains(name, k) {
			return k
		}
	}
	return name
}

// Health returns how many memory servers this session uses and how many of them are up (not
// marked down after a failed request): the backend-health gauge.
func (s *Store) Health() (up, total int) {
	s.servers.mu.Lock()
	defer s.servers.mu.Unlock()
	for _, sv := range s.servers.byID {
		total++
		if !sv.isDown() {
			up++
		}
	}
	return up, total
}
