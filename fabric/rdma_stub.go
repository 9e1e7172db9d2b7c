//go:build !rdma

package fabric

// Without the build tag rdma there is no DialRDMA (asking for the transport gets ErrNoRDMA
// from the caller, e.g. `farmem run --transport rdma`), and a memory server refuses
// RDMAConnect and RDMARegister with StatusUnsupported: the client learns why, and the
// connection stays usable.

// RDMACompiled says whether this build has the rdma transport.
const RDMACompiled = false

// rdmaConn is a connection's RDMA state: none in this build.
type rdmaConn struct{}

// serveRDMA refuses an rdma request (after reading its payload: the stream stays in step).
func (c *serverConn) serveRDMA(h Header) error {
	if _, err := c.readPayload(h.Len); err != nil {
		return err
	}
	return c.refuse(h, StatusUnsupported, "this memory server was built without the rdma transport (build with -tags rdma)")
}

func (c *serverConn) closeRDMA()   {}
func (s *Server) revokeRDMA(*slab) {}
