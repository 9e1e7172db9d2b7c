package ctrl

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/farmem/farmem/fabric"
)

// ServeHeartbeats reports srv to the ctrl every interval the ctrl asks for, frees the slabs the
// ctrl says are no longer placed on it, and returns when ctx ends or the ctrl has declared this
// server instance dead (ErrGone: its slabs were given up, so it must not serve them again).
// An unreachable ctrl is logged once per outage and retried; the server keeps serving pages
// meanwhile (the ctrl is not on the data path).
func ServeHeartbeats(ctx context.Context, c *Client, advertise string, srv *fabric.Server, logf func(string, ...any)) error {
	interval := ServerInterval
	var outage error
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		reply, err := c.ServerHeartbeat(rctx, ServerReport{ID: srv.Instance(), Addr: advertise,
			CapacityPages: uint64(srv.CapacityPages()), UsedPages: uint64(srv.UsedPages()), Slabs: srv.Slabs()})
		cancel()
		switch {
		case errors.Is(err, ErrGone):
			return fmt.Errorf("the ctrl declared this memory server dead (its slabs were re-placed elsewhere): %w", err)
		case errors.Is(err, ErrUnauthorized), errors.Is(err, ErrBadRequest):
			return err // a wrong token, or the ctrl cannot be spoken to as asked: retrying changes nothing
		case err != nil:
			if outage == nil && ctx.Err() == nil {
				logf("farmem memserver: cannot reach the ctrl, retrying: %v", err)
			}
			outage = err
		default:
			if outage != nil {
				logf("farmem memserver: the ctrl is reachable again")
				outage = nil
			}
			for _, id := range reply.Free {
				srv.FreeSlab(id)
			}
			if d := reply.Interval(); d > 0 {
				interval = d
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(interval):
		}
	}
}
