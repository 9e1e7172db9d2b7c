package ctrl

import (
	"bytes"
	"cmp"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/farmem/farmem/fabric"
)

// Config is what the state machine needs to decide.
type Config struct {
	Token          fabric.Token  // signs the grants
	SlabPages      uint32        // size of new slabs (0: DefaultSlabPages)
	DeadAfter      time.Duration // a server without a heartbeat this long is dead (0: DefaultDeadAfter)
	SessionTimeout time.Duration // a session without a heartbeat this long has ended (0: DefaultSessionTimeout)
	DeadRetention  time.Duration // a dead server is listed this long, then forgotten (0: DefaultDeadRetention)
	Rand           *rand.Rand    // every random choice; required
}

func (c Config) withDefaults() Config {
	if c.SlabPages == 0 {
		c.SlabPages = DefaultSlabPages
	}
	if c.DeadAfter == 0 {
		c.DeadAfter = DefaultDeadAfter
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultSessionTimeout
	}
	if c.DeadRetention == 0 {
		c.DeadRetention = DefaultDeadRetention
	}
	return c
}

// Event is a decision worth a log line: a server joined or died, a replica was placed to
// replace a lost one, a slab was lost, a session ended.
type Event struct {
	Time time.Time
	Msg  string
}

// Cluster is the control plane's state machine: membership, sessions, slabs and their
// replicas. Plain values in, decisions out. It never reads the clock — every method takes the
// time, and first advances the machine to it as Tick does, so an expiry depends only on the
// times it was given — and it draws randomness only from Config.Rand, iterating maps in sorted
// order so that the same inputs make the same decisions.
//
// A Cluster is not safe for concurrent use; the Service serializes it under Service.mu.
type Cluster struct {
	cfg Config // immutable

	// Every field below is guarded by Service.mu when a Service runs the cluster.

	servers  map[string]*server            // by instance id, live and dead (until DeadRetention)
	sessions map[fabric.SessionID]*session // open sessions
	slabs    map[uint64]*slab              // every slab of every open session
	// degraded holds the slabs with fewer replicas placed than asked for and a ready copy to
	// rebuild from; every tick tries to place the missing ones.
	degraded map[uint64]*slab
	nextSlab uint64 // never reused, so a stale report or grant can never name a newer slab

	// version counts changes worth persisting (placement, membership, sessions, generations);
	// the Service saves when it moves, not on every heartbeat.
	version uint64
	events  []Event // decisions not yet taken by TakeEvents
}

type server struct {
	id, addr       string
	capacity, used uint64 // pages, as last reported
	// reported is the slab ids in its last heartbeat, placed the slabs with a replica here as
	// the ctrl decided, and unreported the pages of those placed that are not reported yet:
	// kept by place, unplace and setReported, which alone change the three, so that placement
	// (free) reads it at once instead of walking every slab of every server at each decision.
	reported         map[uint64]struct{}
	placed           map[uint64]*slab
	unreported       uint64
	lastSeen, deadAt time.Time
	dead             bool
}

// place records a replica of sl here.
func (s *server) place(sl *slab) {
	if s.placed[sl.id] == nil {
		if _, ok := s.reported[sl.id]; !ok {
			s.unreported += uint64(sl.pages)
		}
	}
	s.placed[sl.id] = sl
}

// unplace forgets the replica of slab id here.
func (s *server) unplace(id uint64) {
	sl := s.placed[id]
	if sl == nil {
		return
	}
	if _, ok := s.reported[id]; !ok {
		s.unreported -= uint64(sl.pages)
	}
	delete(s.placed, id)
}

// setReported takes the slab ids of the server's latest report.
func (s *server) setReported(r map[uint64]struct{}) {
	s.reported = r
	s.unreported = 0
	for id, sl := range s.placed {
		if _, ok := r[id]; !ok {
			s.unreported += uint64(sl.pages)
		}
	}
}

type session struct {
	id       fabric.SessionID
	name     string
	gen      uint64 // bumped when the slab map changes behind the client's back
	lastSeen time.Time
	slabs    map[uint64]*slab
}

type slab struct {
	id       uint64
	sess     *session
	pages    uint32
	want     int       // replicas asked for
	replicas []replica // in placement order, on distinct servers
	lost     bool
	// downFrom names (by address) the dead servers that held a ready copy since the slab was
	// last whole, and the servers whose ready copy was reported bad: if no copy survives they
	// are what the client names when it stops.
	downFrom    []string
	lostServers []string
	stuck       bool // a replacement found no room; logged once until it is placed
	// avoid names (by instance id) the live servers whose copy the client reported bad since
	// the slab was last whole: a replacement is not placed there again. Dead servers need no
	// entry, they are never candidates.
	avoid []string
}

type replica struct {
	server string
	state  string
}

// NewCluster returns an empty cluster.
func NewCluster(cfg Config) *Cluster {
	if cfg.Rand == nil {
		panic("ctrl: Config.Rand is required")
	}
	return &Cluster{
		cfg:      cfg.withDefaults(),
		servers:  map[string]*server{},
		sessions: map[fabric.SessionID]*session{},
		slabs:    map[uint64]*slab{},
		degraded: map[uint64]*slab{},
		nextSlab: 1,
	}
}

// Version moves whenever something worth persisting changed.
func (c *Cluster) Version() uint64 { return c.version }

// TakeEvents returns the decisions made since the last call.
func (c *Cluster) TakeEvents() []Event {
	ev := c.events
	c.events = nil
	return ev
}

func (c *Cluster) changed() { c.version++ }

func (c *Cluster) eventf(now time.Time, format string, a ...any) {
	c.events = append(c.events, Event{Time: now, Msg: fmt.Sprintf(format, a...)})
}

// Tick advances the machine to now: servers silent for DeadAfter die (their replicas are
// replaced or their slabs lost), sessions silent for SessionTimeout end, degraded slabs get
// replacement replicas where there is room, long-dead servers are forgotten.
//
// Every request ticks, so a tick with nothing due must cost little: the loops that act, in
// sorted order for determinism, run only when an unordered look finds something due.
func (c *Cluster) Tick(now time.Time) {
	if c.anyServerDue(now) {
		for _, id := range sortedKeys(c.servers) {
			s := c.servers[id]
			if !s.dead && now.Sub(s.lastSeen) > c.cfg.DeadAfter {
				c.serverDied(s, now)
			}
		}
	}
	if c.anySessionDue(now) {
		for _, id := range sortedSessions(c.sessions) {
			ss := c.sessions[id]
			if now.Sub(ss.lastSeen) > c.cfg.SessionTimeout {
				n := c.endSession(ss)
				c.eventf(now, "session %s (%s) expired: no heartbeat for %v; %d slabs released", ss.id, ss.name, c.cfg.SessionTimeout, n)
			}
		}
	}
	c.rereplicate(now)
	if c.anyServerDue(now) {
		for _, id := range sortedKeys(c.servers) {
			if s := c.servers[id]; s.dead && now.Sub(s.deadAt) > c.cfg.DeadRetention {
				delete(c.servers, id)
				c.changed()
			}
		}
	}
}

// anyServerDue: a live server is silent past DeadAfter, or a dead one listed past DeadRetention.
func (c *Cluster) anyServerDue(now time.Time) bool {
	for _, s := range c.servers {
		if (!s.dead && now.Sub(s.lastSeen) > c.cfg.DeadAfter) || (s.dead && now.Sub(s.deadAt) > c.cfg.DeadRetention) {
			return true
		}
	}
	return false
}

func (c *Cluster) anySessionDue(now time.Time) bool {
	for _, ss := range c.sessions {
		if now.Sub(ss.lastSeen) > c.cfg.SessionTimeout {
			return true
		}
	}
	return false
}

// serverDied gives up every replica on s. A slab that still has a ready copy gets a
// replacement (now if there is room, else on a later tick); one that has none is lost.
func (c *Cluster) serverDied(s *server, now time.Time) {
	s.dead, s.deadAt = true, now
	ids := sortedKeys(s.placed)
	c.eventf(now, "server %s (%s) is dead: no heartbeat for %v; %d replicas on it dropped", s.addr, s.id, c.cfg.DeadAfter, len(ids))
	for _, id := range ids {
		sl := s.placed[id]
		if c.dropReplica(sl, s) == Ready {
			sl.downFrom = append(sl.downFrom, s.addr)
		}
		sl.sess.gen++
		if sl.ready() == 0 {
			c.lose(sl, now)
		} else {
			c.degraded[sl.id] = sl
		}
	}
	s.setReported(nil)
	c.changed()
}

// lose marks a slab lost: nothing to rebuild from, so its rebuilding replicas go too.
func (c *Cluster) lose(sl *slab, now time.Time) {
	for len(sl.replicas) > 0 {
		c.dropReplica(sl, c.servers[sl.replicas[0].server])
	}
	sl.lost = true
	sl.lostServers = dedupe(sl.downFrom)
	delete(c.degraded, sl.id)
	c.eventf(now, "slab %d of session %s (%s) is lost: no copy survives (it was on %s)", sl.id, sl.sess.id, sl.sess.name, strings.Join(sl.lostServers, ", "))
}

// dropReplica removes sl's replica on s and returns its state.
func (c *Cluster) dropReplica(sl *slab, s *server) string {
	for i, r := range sl.replicas {
		if r.server == s.id {
			sl.replicas = slices.Delete(sl.replicas, i, i+1)
			s.unplace(sl.id)
			return r.state
		}
	}
	return ""
}

func (c *Cluster) rereplicate(now time.Time) {
	for _, id := range sortedKeys(c.degraded) {
		sl := c.degraded[id]
		for len(sl.replicas) < sl.want {
			s := c.choose(c.candidates(sl))
			if s == nil {
				if !sl.stuck {
					sl.stuck = true
					c.eventf(now, "slab %d of session %s (%s) has %d of %d replicas: no live server has room for another; retrying", sl.id, sl.sess.id, sl.sess.name, len(sl.replicas), sl.want)
				}
				break
			}
			c.addReplica(sl, s, Rebuilding)
			sl.sess.gen++
			c.changed()
			c.eventf(now, "slab %d of session %s (%s): replacement replica placed on %s (%s), to be filled from %s", sl.id, sl.sess.id, sl.sess.name, s.addr, s.id, c.readyAddrs(sl))
		}
		if len(sl.replicas) >= sl.want {
			sl.stuck = false
			delete(c.degraded, id)
		}
	}
}

func (c *Cluster) addReplica(sl *slab, s *server, state string) {
	sl.replicas = append(sl.replicas, replica{server: s.id, state: state})
	s.place(sl)
}

// free is what placement sees of a server: capacity − used − pages granted there but not yet
// in its reports. Counting our own grants keeps a burst of allocations, all made between two
// heartbeats, from landing on the one server that looked emptiest.
func (c *Cluster) free(s *server) uint64 {
	used := s.used + s.unreported
	if used >= s.capacity {
		return 0
	}
	return s.capacity - used
}

// candidates are the live servers, in id order, that do not hold sl and have room for it.
func (c *Cluster) candidates(sl *slab) []*server {
	var out []*server
	for _, id := range sortedKeys(c.servers) {
		s := c.servers[id]
		if s.dead || s.placed[sl.id] != nil || c.free(s) < uint64(sl.pages) || slices.Contains(sl.avoid, s.id) {
			continue
		}
		out = append(out, s)
	}
	return out
}

// choose is power of two choices (Infiniswap, Leap): two distinct random candidates, the one
// with more free memory wins. Nearly as well balanced as always taking the emptiest, without
// every allocation herding onto the same server.
func (c *Cluster) choose(cands []*server) *server {
	switch len(cands) {
	case 0:
		return nil
	case 1:
		return cands[0]
	}
	i := c.cfg.Rand.IntN(len(cands))
	j := c.cfg.Rand.IntN(len(cands) - 1)
	if j >= i {
		j++
	}
	if c.free(cands[j]) > c.free(cands[i]) {
		return cands[j]
	}
	return cands[i]
}

// ServerHeartbeat registers a server (its first heartbeat) or refreshes it, and tells it which
// of the slabs it holds to free. A server the ctrl declared dead gets ErrGone: its slabs were
// given up, so that incarnation must not serve them; restarted, it is a new server.
func (c *Cluster) ServerHeartbeat(now time.Time, r ServerReport) (HeartbeatReply, error) {
	if r.ID == "" || r.Addr == "" {
		return HeartbeatReply{}, errorf(ErrBadRequest, "a server heartbeat needs an id and an addr")
	}
	c.Tick(now)
	s := c.servers[r.ID]
	if s != nil && s.dead {
		return HeartbeatReply{}, errorf(ErrGone, "memory server %s (%s) was declared dead %v ago after %v without a heartbeat and its slabs were given up: this process must exit; restarted, it joins as a new server", r.ID, s.addr, now.Sub(s.deadAt).Round(time.Millisecond), c.cfg.DeadAfter)
	}
	joined := s == nil
	if joined {
		s = &server{id: r.ID, placed: map[uint64]*slab{}}
		c.servers[r.ID] = s
		c.changed()
	} else if s.addr != r.Addr {
		c.changed()
	}
	s.addr, s.capacity, s.used, s.lastSeen = r.Addr, r.CapacityPages, r.UsedPages, now
	reported := make(map[uint64]struct{}, len(r.Slabs))
	free := []uint64{}
	for _, id := range r.Slabs {
		reported[id] = struct{}{}
		if s.placed[id] == nil {
			free = append(free, id)
		}
	}
	s.setReported(reported)
	slices.Sort(free)
	free = slices.Compact(free)
	if joined {
		c.eventf(now, "server %s (%s) joined: %s capacity, %s used", s.addr, s.id, fmtPages(s.capacity), fmtPages(s.used))
		c.rereplicate(now) // degraded slabs may fit on it
	}
	return HeartbeatReply{IntervalMs: ServerInterval.Milliseconds(), Free: free}, nil
}

// OpenSession starts a session named for a person (host, pid, program).
func (c *Cluster) OpenSession(now time.Time, name string) Session {
	c.Tick(now)
	if len(name) > 256 {
		name = name[:256]
	}
	var id fabric.SessionID
	for {
		for i := range id {
			id[i] = byte(c.cfg.Rand.Uint32())
		}
		if c.sessions[id] == nil {
			break
		}
	}
	// Generations start at 1 so that a client's zero means "never fetched".
	c.sessions[id] = &session{id: id, name: name, gen: 1, lastSeen: now, slabs: map[uint64]*slab{}}
	c.changed()
	c.eventf(now, "session %s (%s) opened", id, name)
	return Session{ID: id, IntervalMs: SessionInterval.Milliseconds(), SlabPages: c.cfg.SlabPages}
}

// session looks a session up and counts the request as its heartbeat.
func (c *Cluster) session(now time.Time, id fabric.SessionID) (*session, error) {
	c.Tick(now)
	ss := c.sessions[id]
	if ss == nil {
		return nil, errorf(ErrNotFound, "session %s is not open on this ctrl: it was closed, or it expired after %v without a heartbeat and its slabs were released", id, c.cfg.SessionTimeout)
	}
	ss.lastSeen = now
	return ss, nil
}

// SessionHeartbeat keeps a session open and returns its generation: the client refetches its
// slab map when the generation moves.
func (c *Cluster) SessionHeartbeat(now time.Time, id fabric.SessionID) (uint64, error) {
	ss, err := c.session(now, id)
	if err != nil {
		return 0, err
	}
	return ss.gen, nil
}

// AllocSlab places a new slab of the session on `replicas` distinct servers, each chosen by
// power of two choices. All or nothing: if fewer live servers have room than replicas asked
// for, nothing is placed and the error says what there is.
//
// The generation does not move: the client learns of the slab from the reply. It moves only
// for changes the client did not make itself.
func (c *Cluster) AllocSlab(now time.Time, id fabric.SessionID, replicas int) (Slab, error) {
	if replicas < 1 || replicas > MaxReplicas {
		return Slab{}, errorf(ErrBadRequest, "replicas must be between 1 and %d, not %d", MaxReplicas, replicas)
	}
	ss, err := c.session(now, id)
	if err != nil {
		return Slab{}, err
	}
	sl := &slab{id: c.nextSlab, sess: ss, pages: c.cfg.SlabPages, want: replicas}
	if cands := c.candidates(sl); len(cands) < replicas {
		return Slab{}, c.noRoom(sl)
	}
	for range replicas {
		c.addReplica(sl, c.choose(c.candidates(sl)), Ready)
	}
	c.nextSlab++
	ss.slabs[sl.id] = sl
	c.slabs[sl.id] = sl
	c.changed()
	return c.render(sl), nil
}

func (c *Cluster) noRoom(sl *slab) error {
	var live []string
	roomy := 0
	for _, id := range sortedKeys(c.servers) {
		s := c.servers[id]
		if s.dead {
			continue
		}
		f := c.free(s)
		if f >= uint64(sl.pages) {
			roomy++
		}
		live = append(live, fmt.Sprintf("%s %s free", s.addr, fmtPages(f)))
	}
	size := fmtPages(uint64(sl.pages))
	switch {
	case len(live) == 0:
		return errorf(ErrNoRoom, "cannot place a %s slab: no memory server is live (start `farmem memserver --ctrl` on the hosts that lend memory)", size)
	case len(live) < sl.want:
		return errorf(ErrNoRoom, "cannot place %d replicas of a %s slab on distinct servers: only %d memory servers are live (%s)", sl.want, size, len(live), strings.Join(live, ", "))
	}
	return errorf(ErrNoRoom, "cannot place %d replicas of a %s slab: %d memory servers are live but only %d have room for it (%s)", sl.want, size, len(live), roomy, strings.Join(live, ", "))
}

// Slabs returns the session's generation and slab map, in slab id order.
func (c *Cluster) Slabs(now time.Time, id fabric.SessionID) (uint64, []Slab, error) {
	ss, err := c.session(now, id)
	if err != nil {
		return 0, nil, err
	}
	out := make([]Slab, 0, len(ss.slabs))
	for _, sid := range sortedKeys(ss.slabs) {
		out = append(out, c.render(ss.slabs[sid]))
	}
	return ss.gen, out, nil
}

func (c *Cluster) sessionSlab(now time.Time, id fabric.SessionID, slabID uint64) (*slab, error) {
	ss, err := c.session(now, id)
	if err != nil {
		return nil, err
	}
	sl := ss.slabs[slabID]
	if sl == nil {
		return nil, errorf(ErrNotFound, "session %s (%s) has no slab %d", id, ss.name, slabID)
	}
	return sl, nil
}

// ReplicaReady records that the client filled the rebuilding replica of a slab on a server
// from a ready copy. Saying it twice is harmless.
func (c *Cluster) ReplicaReady(now time.Time, id fabric.SessionID, slabID uint64, serverID string) error {
	sl, err := c.sessionSlab(now, id, slabID)
	if err != nil {
		return err
	}
	if sl.lost {
		return errorf(ErrConflict, "slab %d is lost (it was on %s): no replica of it can become ready", slabID, strings.Join(sl.lostServers, ", "))
	}
	for i, r := range sl.replicas {
		if r.server != serverID {
			continue
		}
		if r.state != Ready {
			sl.replicas[i].state = Ready
			if sl.ready() >= sl.want {
				sl.downFrom, sl.avoid = nil, nil
			}
			c.changed()
		}
		return nil
	}
	return errorf(ErrConflict, "slab %d has no replica on server %s any more (the server died or the replica was re-placed): refetch the slab map", slabID, serverID)
}

// ReplicasBad drops copies of the session's slabs on live servers after the client failed to
// write them there, or to create them (their servers may stay up, so no death will drop them):
// those copies miss pages. Each slab gets a replacement on another server as if the copy's
// server had died — placed now if there is room — and the client fills it from a good copy.
// The servers are told to free the bad copies in their next heartbeat reply. One call takes
// every copy a client found bad since its last, so that a server's failure costs one save, not
// one per slab. Saying it twice is harmless: a copy already dropped (its server died, an
// earlier report, its slab freed) is not there to drop. The last ready copy of a slab is never
// dropped — with nothing to rebuild from the slab would be lost, and a copy that missed one
// write still holds every other page — and comes back in kept.
func (c *Cluster) ReplicasBad(now time.Time, id fabric.SessionID, bad []BadReplica) (kept []BadReplica, err error) {
	ss, err := c.session(now, id)
	if err != nil {
		return nil, err
	}
	kept = []BadReplica{}
	for _, b := range bad {
		sl := ss.slabs[b.Slab]
		s := c.servers[b.Server]
		if sl == nil || sl.lost || s == nil || s.placed[sl.id] != sl {
			continue
		}
		if sl.ready() == 1 && slices.Contains(sl.replicas, replica{server: s.id, state: Ready}) {
			kept = append(kept, b)
			continue
		}
		if c.dropReplica(sl, s) == Ready {
			// Should the other copies go too, this one is among those the client names: it may
			// be gone with its server (a dying server's writes fail first), or it misses pages.
			sl.downFrom = append(sl.downFrom, s.addr)
		}
		if !slices.Contains(sl.avoid, s.id) {
			sl.avoid = append(sl.avoid, s.id)
		}
		sl.sess.gen++
		c.degraded[sl.id] = sl
		c.changed()
		c.eventf(now, "slab %d of session %s (%s): its copy on %s (%s) was reported bad (a write to it or its creation failed); placing a replacement", sl.id, sl.sess.id, sl.sess.name, s.addr, s.id)
	}
	c.rereplicate(now)
	return kept, nil
}

// FreeSlab releases a slab: its servers are told to free it in their next heartbeat reply.
func (c *Cluster) FreeSlab(now time.Time, id fabric.SessionID, slabID uint64) error {
	sl, err := c.sessionSlab(now, id, slabID)
	if err != nil {
		return err
	}
	c.release(sl)
	c.changed()
	return nil
}

// CloseSession ends a session cleanly, releasing its slabs.
func (c *Cluster) CloseSession(now time.Time, id fabric.SessionID) error {
	ss, err := c.session(now, id)
	if err != nil {
		return err
	}
	n := c.endSession(ss)
	c.eventf(now, "session %s (%s) closed: %d slabs released", ss.id, ss.name, n)
	return nil
}

func (c *Cluster) endSession(ss *session) int {
	n := len(ss.slabs)
	for _, id := range sortedKeys(ss.slabs) {
		c.release(ss.slabs[id])
	}
	delete(c.sessions, ss.id)
	c.changed()
	return n
}

// release forgets a slab; it then shows up in the `free` list of every server that reports it.
func (c *Cluster) release(sl *slab) {
	for _, r := range sl.replicas {
		if s := c.servers[r.server]; s != nil {
			s.unplace(sl.id)
		}
	}
	sl.replicas = nil
	delete(sl.sess.slabs, sl.id)
	delete(c.slabs, sl.id)
	delete(c.degraded, sl.id)
}

func (sl *slab) ready() int {
	n := 0
	for _, r := range sl.replicas {
		if r.state == Ready {
			n++
		}
	}
	return n
}

func (c *Cluster) readyAddrs(sl *slab) string {
	var a []string
	for _, r := range sl.replicas {
		if r.state == Ready {
			a = append(a, c.servers[r.server].addr)
		}
	}
	return strings.Join(a, ", ")
}

// render is the API's view of a slab, with freshly signed grants (HMAC is deterministic).
func (c *Cluster) render(sl *slab) Slab {
	out := Slab{ID: sl.id, Pages: sl.pages, Replicas: []Replica{}, Lost: sl.lost, LostServers: []string{}}
	out.LostServers = append(out.LostServers, sl.lostServers...)
	for _, r := range sl.replicas {
		g := fabric.Grant{Slab: sl.id, Session: sl.sess.id, Server: r.server, Pages: sl.pages}
		c.cfg.Token.Sign(&g)
		out.Replicas = append(out.Replicas, Replica{Server: r.server, Addr: c.servers[r.server].addr, State: r.state, Grant: g})
	}
	return out
}

// Status is the cluster as `farmem status` shows it.
func (c *Cluster) Status(now time.Time) Status {
	c.Tick(now)
	st := Status{SlabPages: c.cfg.SlabPages, Servers: []ServerStatus{}, Sessions: []SessionStatus{}}
	for _, id := range sortedKeys(c.servers) {
		s := c.servers[id]
		ss := ServerStatus{ID: s.id, Addr: s.addr, CapacityPages: s.capacity, UsedPages: s.used, Healthy: !s.dead,
			MsSinceHeartbeat: now.Sub(s.lastSeen).Milliseconds(), Slabs: len(s.placed)}
		if !s.dead {
			ss.FreePages = c.free(s)
			st.Totals.HealthyServers++
			st.Totals.CapacityPages += s.capacity
			st.Totals.UsedPages += s.used
		}
		st.Servers = append(st.Servers, ss)
	}
	slices.SortStableFunc(st.Servers, func(a, b ServerStatus) int { return cmp.Compare(a.Addr, b.Addr) })
	for _, id := range sortedSessions(c.sessions) {
		ss := c.sessions[id]
		out := SessionStatus{ID: ss.id, Name: ss.name, Slabs: len(ss.slabs), Generation: ss.gen, MsSinceHeartbeat: now.Sub(ss.lastSeen).Milliseconds()}
		for _, sl := range ss.slabs {
			out.Replicas = max(out.Replicas, sl.want)
			switch {
			case sl.lost:
				out.Lost++
			case sl.ready() < sl.want:
				out.Degraded++
			}
			out.Rebuilding += len(sl.replicas) - sl.ready()
		}
		st.Totals.Slabs += out.Slabs
		st.Totals.Degraded += out.Degraded
		st.Totals.Rebuilding += out.Rebuilding
		st.Totals.Lost += out.Lost
		st.Sessions = append(st.Sessions, out)
	}
	st.Totals.Servers = len(st.Servers)
	st.Totals.Sessions = len(st.Sessions)
	return st
}

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func sortedSessions[V any](m map[fabric.SessionID]V) []fabric.SessionID {
	keys := make([]fabric.SessionID, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	// bytes.Compare orders as strings.Compare would, without a string per comparison.
	slices.SortFunc(keys, func(a, b fabric.SessionID) int { return bytes.Compare(a[:], b[:]) })
	return keys
}

func dedupe(s []string) []string {
	var out []string
	for _, v := range s {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}
