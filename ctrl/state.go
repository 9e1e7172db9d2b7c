package ctrl

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/farmem/farmem/fabric"
)

// StateVersion is the version of the State layout; a ctrl refuses state it does not know.
const StateVersion = 1

// State is what the ctrl keeps across a restart: the servers it knows, the open sessions,
// their slabs with replicas and states, the next slab id, the generations. Heartbeat times are
// not kept: after a restart every server and session gets a fresh grace period, since the
// ctrl cannot tell who went quiet while it was down.
type State struct {
	Version  int            `json:"version"`
	NextSlab uint64         `json:"next_slab"`
	Servers  []ServerState  `json:"servers"`
	Sessions []SessionState `json:"sessions"`
}

// ServerState is a known memory server.
type ServerState struct {
	ID            string    `json:"id"`
	Addr          string    `json:"addr"`
	CapacityPages uint64    `json:"capacity_pages"`
	UsedPages     uint64    `json:"used_pages"`
	Reported      []uint64  `json:"reported"` // slabs in its last heartbeat: grants not in it still count against its room
	Dead          bool      `json:"dead,omitempty"`
	DeadAt        time.Time `json:"dead_at,omitzero"`
}

// SessionState is an open session.
type SessionState struct {
	ID         fabric.SessionID `json:"id"`
	Name       string           `json:"name"`
	Generation uint64           `json:"generation"`
	Slabs      []SlabState      `json:"slabs"`
}

// SlabState is a slab as the API shows it (grants included) and what the ctrl needs besides.
type SlabState struct {
	Slab
	Want     int      `json:"want"`            // replicas asked for
	DownFrom []string `json:"down_from"`       // dead servers that held a ready copy since the slab was last whole
	Avoid    []string `json:"avoid,omitempty"` // live servers whose copy was reported bad since the slab was last whole: no replacement there
}

// State returns a deep copy of the cluster's persistent state.
func (c *Cluster) State() State {
	st := State{Version: StateVersion, NextSlab: c.nextSlab, Servers: []ServerState{}, Sessions: []SessionState{}}
	for _, id := range sortedKeys(c.servers) {
		s := c.servers[id]
		st.Servers = append(st.Servers, ServerState{ID: s.id, Addr: s.addr, CapacityPages: s.capacity, UsedPages: s.used,
			Reported: sortedKeys(s.reported), Dead: s.dead, DeadAt: s.deadAt})
	}
	for _, id := range sortedSessions(c.sessions) {
		ss := c.sessions[id]
		out := SessionState{ID: ss.id, Name: ss.name, Generation: ss.gen, Slabs: []SlabState{}}
		for _, sid := range sortedKeys(ss.slabs) {
			sl := ss.slabs[sid]
			out.Slabs = append(out.Slabs, SlabState{Slab: c.render(sl), Want: sl.want, DownFrom: slices.Clone(sl.downFrom), Avoid: slices.Clone(sl.avoid)})
		}
		st.Sessions = append(st.Sessions, out)
	}
	return st
}

// Restore replaces the cluster's state with st, as of now: live servers must heartbeat within
// DeadAfter of now and sessions within SessionTimeout of now — except those this cluster
// already knew, which keep the heartbeat time it saw last (a ctrl that reloads the state another
// writer saved has been hearing them all along). Grants are re-signed with the current token
// rather than trusted from the store. A replica on a server the state does not list as live is
// dropped as if the server had just died.
func (c *Cluster) Restore(now time.Time, st State) error {
	if st.Version != StateVersion {
		return fmt.Errorf("ctrl state has version %d; this ctrl reads version %d", st.Version, StateVersion)
	}
	fresh := NewCluster(c.cfg)
	fresh.events = c.events
	fresh.version = c.version + 1
	for _, s := range st.Servers {
		if s.ID == "" || fresh.servers[s.ID] != nil {
			return fmt.Errorf("ctrl state lists server %q twice or without an id", s.ID)
		}
		srv := &server{id: s.ID, addr: s.Addr, capacity: s.CapacityPages, used: s.UsedPages, reported: map[uint64]struct{}{},
			placed: map[uint64]*slab{}, lastSeen: now, dead: s.Dead, deadAt: s.DeadAt}
		if old := c.servers[s.ID]; old != nil && !old.dead {
			srv.lastSeen = old.lastSeen
		}
		for _, id := range s.Reported {
			srv.reported[id] = struct{}{}
		}
		if srv.dead && srv.deadAt.IsZero() {
			srv.deadAt = now
		}
		fresh.servers[s.ID] = srv
	}
	fresh.nextSlab = max(st.NextSlab, 1)
	for _, ss := range st.Sessions {
		if fresh.sessions[ss.ID] != nil {
			return fmt.Errorf("ctrl state lists session %s twice", ss.ID)
		}
		sess := &session{id: ss.ID, name: ss.Name, gen: max(ss.Generation, 1), lastSeen: now, slabs: map[uint64]*slab{}}
		if old := c.sessions[ss.ID]; old != nil {
			sess.lastSeen = old.lastSeen
		}
		fresh.sessions[ss.ID] = sess
		for _, s := range ss.Slabs {
			if fresh.slabs[s.ID] != nil || s.ID == 0 {
				return fmt.Errorf("ctrl state lists slab %d twice or with id 0", s.ID)
			}
			sl := &slab{id: s.ID, sess: sess, pages: s.Pages, want: max(s.Want, 1), lost: s.Lost,
				lostServers: slices.Clone(s.LostServers), downFrom: slices.Clone(s.DownFrom), avoid: slices.Clone(s.Avoid)}
			fresh.nextSlab = max(fresh.nextSlab, s.ID+1) // never hand out an id that exists
			sess.slabs[sl.id] = sl
			fresh.slabs[sl.id] = sl
			for _, r := range s.Replicas {
				srv := fresh.servers[r.Server]
				if r.State != Ready && r.State != Rebuilding {
					return fmt.Errorf("ctrl state: slab %d has a replica in state %q", s.ID, r.State)
				}
				if srv == nil || srv.dead || srv.placed[sl.id] != nil {
					if r.State == Ready {
						sl.downFrom = append(sl.downFrom, cmp.Or(r.Addr, r.Server))
					}
					sess.gen++
					continue
				}
				fresh.addReplica(sl, srv, r.State)
			}
			switch {
			case sl.lost:
			case sl.ready() == 0:
				fresh.lose(sl, now)
			case len(sl.replicas) < sl.want:
				fresh.degraded[sl.id] = sl
			}
		}
	}
	*c = *fresh
	return nil
}
