package main

import (
	"cmp"
	"container/heap"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
)

// Params is one simulated scenario. Every duration is simulated time.
type Params struct {
	Servers         int           // memory servers at the start
	RackSize        int           // servers per rack: a rack loss takes this many at once
	Sessions        int           // client sessions kept open (one that ends is replaced)
	CapacityPages   uint64        // each server's capacity
	SlabPages       uint32        // the ctrl's slab size
	SlabsPerSession int           // mean slabs a session holds (each draws 1..2*mean-1)
	Replicas        int           // copies per slab (farmem run --replicas)
	Seed            uint64        // the ctrl's and the scenario's randomness
	Duration        time.Duration // how long the scenario runs
	WarmUp          time.Duration // sessions open spread over [1s, 1s+WarmUp]
	SlabTurnover    time.Duration // mean time between a session freeing its oldest slab and allocating a new one
	SessionLife     time.Duration // mean life of a session; an ended one is replaced by a new one at once
	ChurnFrom       time.Duration // from then on, every ChurnEvery, one server leaves and a new one joins
	ChurnEvery      time.Duration // 0: no churn
	ChurnUntil      time.Duration // churn stops then (0: at the end)
	RackLosses      []time.Duration
	RackReturn      time.Duration // a lost rack comes back (as new server instances) this long after; 0: never
	ServerBW        float64       // bytes/s each server's NIC moves each way
	ClientBW        float64       // bytes/s each client host's NIC moves each way
	SaveEvery       time.Duration // group commit: the changes of this interval are one save
	SavePerChange   bool          // also save after every request that changed the state, as the service does when requests come one at a time
	RowEvery        time.Duration // one row of the time series per interval
	Prefix          string        // the etcd store's key prefix
	ServerInterval  time.Duration // memory-server heartbeats (the ctrl's ServerInterval)
	SessionInterval time.Duration // session heartbeats (the ctrl's SessionInterval)
}

// DefaultParams is the full-scale scenario: 1,000 servers in racks of 40, 10,000 sessions.
func DefaultParams() Params {
	return Params{
		Servers: 1000, RackSize: 40, Sessions: 10000,
		CapacityPages: 16 << 30 / ctrl.PageSize, SlabPages: ctrl.DefaultSlabPages, SlabsPerSession: 6, Replicas: 2,
		Seed: 1, Duration: 120 * time.Second, WarmUp: 20 * time.Second,
		SlabTurnover: 60 * time.Second, SessionLife: 600 * time.Second,
		ChurnFrom: 30 * time.Second, ChurnEvery: 10 * time.Second,
		RackLosses: []time.Duration{45 * time.Second, 95 * time.Second}, RackReturn: 20 * time.Second,
		ServerBW: 1.25e9, ClientBW: 1.25e9,
		SaveEvery: ctrl.TickInterval, RowEvery: time.Second, Prefix: ctrl.DefaultEtcdPrefix,
		ServerInterval: ctrl.ServerInterval, SessionInterval: ctrl.SessionInterval,
	}
}

func (p Params) check() error {
	switch {
	case p.Servers < 1 || p.RackSize < 1 || p.Sessions < 1:
		return fmt.Errorf("servers, rack size and sessions must be at least 1")
	case p.Replicas < 1 || p.Replicas > ctrl.MaxReplicas:
		return fmt.Errorf("replicas must be between 1 and %d", ctrl.MaxReplicas)
	case p.SlabsPerSession < 1:
		return fmt.Errorf("slabs per session must be at least 1")
	case p.CapacityPages < uint64(p.SlabPages) || p.SlabPages == 0:
		return fmt.Errorf("a server's capacity must hold at least one slab")
	case p.Duration <= 0 || p.SaveEvery <= 0 || p.RowEvery <= 0 || p.ServerInterval <= 0 || p.SessionInterval <= 0:
		return fmt.Errorf("durations and intervals must be positive")
	case p.ServerBW <= 0 || p.ClientBW <= 0:
		return fmt.Errorf("bandwidths must be positive")
	}
	return nil
}

var simToken = fabric.Token("farmem-ctrlsim-token-0123456789abcdef")

// epoch is simulated time zero; the ctrl only ever sees differences.
var epoch = time.Unix(1_800_000_000, 0).UTC()

// Sim drives the ctrl's state machine (ctrl.Cluster) with simulated servers and sessions.
// Single goroutine; every choice comes from rnd or the ctrl's own seeded Rand, and every
// iteration is over slices or sorted keys, so a seed gives one run.
type Sim struct {
	p   Params
	c   *ctrl.Cluster
	rnd *rand.Rand
	now time.Duration

	events eventQueue
	seq    uint64

	servers    []*simServer          // every server ever, by join order
	byID       map[string]*simServer // by instance id
	racks      int                   // racks so far (new servers past the first ones fill new racks)
	sessions   []*simSession         // open sessions (order of opening); closed ones removed
	nSessions  int                   // sessions ever opened, for names
	copies     copyModel
	etcd       etcdCounter
	cpu        *cpuMeter
	savedVer   uint64
	interval   intervalCounts
	Rows       []Row
	Losses     []*Loss
	openLoss   []*Loss // losses whose replicas are not all restored yet
	lostSlabs  int     // slabs the ctrl declared lost
	stopped    int     // sessions stopped on a lost slab
	refused    int     // allocations the ctrl refused (no room)
	deaths     int     // servers the ctrl declared dead
	violations []string
	progress   func(format string, a ...any) // a line every 10 simulated seconds; nil: none
}

type simServer struct {
	id, addr string
	rack     int
	capacity uint64
	held     map[uint64]uint32 // slabs it holds, as created by clients (slab → pages)
	used     uint64
	alive    bool // running: heartbeats and serves copies
	heard    bool // the ctrl has had a heartbeat of it
}

type simSession struct {
	id      fabric.SessionID
	name    string
	target  int
	slabs   []uint64 // allocated, oldest first
	gen     uint64   // the generation its slab map was last fetched at
	closed  bool
	copying map[copyKey]bool // copies in flight for it
}

type copyKey struct {
	slab   uint64
	server string
}

// NewSim returns a simulation of p, nothing run yet.
func NewSim(p Params, cpu *cpuMeter) (*Sim, error) {
	if err := p.check(); err != nil {
		return nil, err
	}
	c := ctrl.NewCluster(ctrl.Config{Token: simToken, SlabPages: p.SlabPages, Rand: rand.New(rand.NewChaCha8(seed32(p.Seed)))})
	s := &Sim{p: p, c: c, rnd: rand.New(rand.NewPCG(p.Seed, 0x5eed)), byID: map[string]*simServer{}, cpu: cpu}
	s.copies.init(p.ServerBW, p.ClientBW)
	s.etcd.known = map[string]string{}
	return s, nil
}

func seed32(seed uint64) [32]byte {
	var b [32]byte
	for i := range 4 {
		v := seed*0x9e3779b97f4a7c15 + uint64(i)*0xbf58476d1ce4e5b9
		for j := range 8 {
			b[i*8+j] = byte(v >> (8 * j))
		}
	}
	return b
}

// at schedules fn at simulated time t.
func (s *Sim) at(t time.Duration, fn func()) {
	s.seq++
	heap.Push(&s.events, event{t: t, seq: s.seq, fn: fn})
}

func (s *Sim) wall() time.Time { return epoch.Add(s.now) }

// Run plays the scenario to its end.
func (s *Sim) Run() error {
	p := s.p
	for i := range p.Servers {
		s.addServer(time.Duration(i) * p.ServerInterval / time.Duration(p.Servers))
	}
	for i := range p.Sessions {
		s.at(time.Second+time.Duration(i)*p.WarmUp/time.Duration(p.Sessions), s.openSession)
	}
	if p.ChurnEvery > 0 {
		until := cmp.Or(p.ChurnUntil, p.Duration)
		for t := p.ChurnFrom; t < until; t += p.ChurnEvery {
			s.at(t, s.churn)
		}
	}
	for _, t := range p.RackLosses {
		s.at(t, s.rackLoss)
	}
	for t := p.SaveEvery; t <= p.Duration; t += p.SaveEvery {
		s.at(t, s.tick)
	}
	for t := p.RowEvery; t <= p.Duration; t += p.RowEvery {
		s.at(t, s.row)
	}
	if s.progress != nil {
		start := time.Now()
		for t := 10 * time.Second; t <= p.Duration; t += 10 * time.Second {
			s.at(t, func() {
				slabs := 0
				for _, ss := range s.sessions {
					slabs += len(ss.slabs)
				}
				s.progress("ctrlsim: %v of %v simulated: %d sessions holding %d slabs (%v wall so far)", t, p.Duration, len(s.sessions), slabs, time.Since(start).Round(time.Second))
			})
		}
	}
	for s.events.Len() > 0 {
		ev := heap.Pop(&s.events).(event)
		if ev.t > p.Duration {
			break
		}
		s.now = ev.t
		ev.fn()
	}
	if len(s.violations) > 0 {
		return fmt.Errorf("%d invariant violations, the first: %s", len(s.violations), s.violations[0])
	}
	return nil
}

func (s *Sim) violate(format string, a ...any) {
	s.violations = append(s.violations, fmt.Sprintf("at %v: ", s.now)+fmt.Sprintf(format, a...))
}

// addServer starts a memory server whose first heartbeat is at t.
func (s *Sim) addServer(t time.Duration) *simServer {
	n := len(s.servers)
	rack := n / s.p.RackSize
	s.racks = max(s.racks, rack+1)
	return s.startServer(t, rack)
}

func (s *Sim) startServer(t time.Duration, rack int) *simServer {
	n := len(s.servers)
	var id [8]byte
	for i := range id {
		id[i] = byte(s.rnd.Uint32())
	}
	srv := &simServer{id: fmt.Sprintf("%x", id), addr: fmt.Sprintf("10.%d.%d.%d:7070", rack/256, rack%256, n%250+1),
		rack: rack, capacity: s.p.CapacityPages, held: map[uint64]uint32{}, alive: true}
	s.servers = append(s.servers, srv)
	s.byID[srv.id] = srv
	s.at(t, func() { s.serverHeartbeat(srv) })
	return srv
}

func (s *Sim) serverHeartbeat(srv *simServer) {
	if !srv.alive {
		return
	}
	slabs := make([]uint64, 0, len(srv.held))
	for id := range srv.held {
		slabs = append(slabs, id)
	}
	slices.Sort(slabs)
	rep := ctrl.ServerReport{ID: srv.id, Addr: srv.addr, CapacityPages: srv.capacity, UsedPages: srv.used, Slabs: slabs}
	var reply ctrl.HeartbeatReply
	var err error
	s.decide(kindServerHeartbeat, func(now time.Time) { reply, err = s.c.ServerHeartbeat(now, rep) })
	if err != nil {
		// The ctrl declared this instance dead: it exits, and what it held goes with it.
		s.violate("server %s refused: %v", srv.id, err)
		s.stopServer(srv)
		return
	}
	srv.heard = true
	for _, id := range reply.Free {
		if pages, ok := srv.held[id]; ok {
			srv.used -= uint64(pages)
			delete(srv.held, id)
		}
	}
	s.at(s.now+s.p.ServerInterval, func() { s.serverHeartbeat(srv) })
}

// stopServer ends a server process: its heartbeats stop and its copies are gone.
func (s *Sim) stopServer(srv *simServer) {
	if !srv.alive {
		return
	}
	srv.alive = false
	s.copies.abortServer(s, srv)
}

// churn: one live server leaves (its process stops; to the ctrl a graceful leave is a silent
// server, there being no drain) and a new one joins in its rack.
func (s *Sim) churn() {
	live := s.liveServers()
	if len(live) <= s.p.Replicas {
		return
	}
	srv := live[s.rnd.IntN(len(live))]
	s.startLoss("leave", []*simServer{srv})
	s.startServer(s.now, srv.rack)
}

func (s *Sim) rackLoss() {
	// The rack with the most live servers: a loss that takes a whole rack.
	count := make([]int, s.racks)
	for _, srv := range s.servers {
		if srv.alive {
			count[srv.rack]++
		}
	}
	var full []int
	for r := range count {
		if len(full) == 0 || count[r] > count[full[0]] {
			full = []int{r}
		} else if count[r] == count[full[0]] {
			full = append(full, r)
		}
	}
	best := full[s.rnd.IntN(len(full))]
	var gone []*simServer
	for _, srv := range s.servers {
		if srv.alive && srv.rack == best {
			gone = append(gone, srv)
		}
	}
	s.startLoss(fmt.Sprintf("rack %d lost", best), gone)
	if s.p.RackReturn > 0 {
		n := len(gone)
		s.at(s.now+s.p.RackReturn, func() {
			for i := range n {
				s.startServer(s.now+time.Duration(i)*s.p.ServerInterval/time.Duration(n), best)
			}
		})
	}
}

func (s *Sim) liveServers() []*simServer {
	var out []*simServer
	for _, srv := range s.servers {
		if srv.alive {
			out = append(out, srv)
		}
	}
	return out
}

// Loss is one loss of servers and what it took to make every slab whole again.
type Loss struct {
	Kind         string
	At           time.Duration
	Servers      int
	ReplicasGone int           // slab copies the servers held
	BytesGone    uint64        // their bytes
	DetectedAt   time.Duration // the ctrl declared the last of them dead
	PlacedAt     time.Duration // the last replacement was placed (-1: none)
	RestoredAt   time.Duration // every slab had its replicas, all ready (-1: not by the end)
	SlabsLost    int           // slabs with no copy left
	CopyBytes    uint64        // bytes copied while it was open
	Copies       int
	MaxTxnOps    int // the largest transaction while it was open
	MaxTxnBytes  int
	dead         map[string]bool
	deadSeen     int
}

func (s *Sim) startLoss(kind string, gone []*simServer) {
	l := &Loss{Kind: kind, At: s.now, Servers: len(gone), PlacedAt: -1, RestoredAt: -1, DetectedAt: -1, dead: map[string]bool{}}
	for _, srv := range gone {
		l.ReplicasGone += len(srv.held)
		l.BytesGone += srv.used * ctrl.PageSize
		if srv.heard { // one that never reported is unknown to the ctrl: nothing to declare dead
			l.dead[srv.id] = true
		}
		s.stopServer(srv)
	}
	s.Losses = append(s.Losses, l)
	s.openLoss = append(s.openLoss, l)
}

func (s *Sim) openSession() {
	var sess ctrl.Session
	s.nSessions++
	name := fmt.Sprintf("client%05d pid %d redis-server", s.rnd.IntN(100000), 1000+s.nSessions)
	s.decide(kindOpen, func(now time.Time) { sess = s.c.OpenSession(now, name) })
	ss := &simSession{id: sess.ID, name: name, target: 1 + s.rnd.IntN(2*s.p.SlabsPerSession-1), gen: 1, copying: map[copyKey]bool{}}
	s.sessions = append(s.sessions, ss)
	s.at(s.now, func() { s.grow(ss) })
	s.at(s.now+s.p.SessionInterval, func() { s.sessionHeartbeat(ss) })
	s.at(s.now+s.exp(s.p.SlabTurnover), func() { s.turnover(ss) })
	s.at(s.now+s.exp(s.p.SessionLife), func() { s.endSession(ss, "closed") })
}

func (s *Sim) exp(mean time.Duration) time.Duration {
	return time.Duration(s.rnd.ExpFloat64() * float64(mean))
}

// grow allocates one slab a second until the session holds its target, as a program filling
// its memory does.
func (s *Sim) grow(ss *simSession) {
	if ss.closed || len(ss.slabs) >= ss.target {
		return
	}
	s.alloc(ss)
	s.at(s.now+time.Second, func() { s.grow(ss) })
}

func (s *Sim) alloc(ss *simSession) {
	var sl ctrl.Slab
	var err error
	s.decide(kindAlloc, func(now time.Time) { sl, err = s.c.AllocSlab(now, ss.id, s.p.Replicas) })
	if errors.Is(err, ctrl.ErrNoRoom) {
		s.refused++
		return
	}
	if err != nil {
		s.violate("alloc for session %s: %v", ss.id, err)
		return
	}
	ss.slabs = append(ss.slabs, sl.ID)
	for _, r := range sl.Replicas {
		s.create(s.byID[r.Server], sl.ID, sl.Pages)
	}
}

// create is a client creating a slab on a server with its grant.
func (s *Sim) create(srv *simServer, slab uint64, pages uint32) {
	if srv == nil || !srv.alive {
		return
	}
	if _, ok := srv.held[slab]; !ok {
		srv.held[slab] = pages
		srv.used += uint64(pages)
		if srv.used > srv.capacity {
			s.violate("server %s holds %d pages, over its capacity %d", srv.id, srv.used, srv.capacity)
		}
	}
}

func (s *Sim) turnover(ss *simSession) {
	if ss.closed {
		return
	}
	if len(ss.slabs) > 0 {
		id := ss.slabs[0]
		var err error
		s.decide(kindFree, func(now time.Time) { err = s.c.FreeSlab(now, ss.id, id) })
		if err != nil {
			s.violate("free slab %d: %v", id, err)
		}
		ss.slabs = ss.slabs[1:]
		s.alloc(ss)
	}
	s.at(s.now+s.exp(s.p.SlabTurnover), func() { s.turnover(ss) })
}

// endSession closes a session (its program ended, or stopped on a lost slab) and opens the
// next in its place.
func (s *Sim) endSession(ss *simSession, why string) {
	if ss.closed {
		return
	}
	ss.closed = true
	var err error
	s.decide(kindClose, func(now time.Time) { err = s.c.CloseSession(now, ss.id) })
	if err != nil {
		s.violate("close session %s (%s): %v", ss.id, why, err)
	}
	s.copies.abortSession(s, ss)
	i := slices.Index(s.sessions, ss)
	s.sessions = slices.Delete(s.sessions, i, i+1)
	s.at(s.now, s.openSession)
}

// sessionHeartbeat is the client's: when the generation moved it refetches its slab map and
// fills every replacement replica from a ready copy, as remote/maintain.go does; a lost slab
// stops the program.
func (s *Sim) sessionHeartbeat(ss *simSession) {
	if ss.closed {
		return
	}
	var gen uint64
	var err error
	s.decide(kindSessionHeartbeat, func(now time.Time) { gen, err = s.c.SessionHeartbeat(now, ss.id) })
	if err != nil {
		s.violate("session heartbeat %s: %v", ss.id, err)
		return
	}
	s.at(s.now+s.p.SessionInterval, func() { s.sessionHeartbeat(ss) })
	if gen == ss.gen {
		return
	}
	var slabs []ctrl.Slab
	s.decide(kindSlabs, func(now time.Time) { gen, slabs, err = s.c.Slabs(now, ss.id) })
	if err != nil {
		s.violate("slab map of %s: %v", ss.id, err)
		return
	}
	ss.gen = gen
	for _, sl := range slabs {
		if sl.Lost {
			s.stopped++
			s.endSession(ss, "lost slab")
			return
		}
		var src *simServer
		for _, r := range sl.Replicas {
			if r.State == ctrl.Ready && s.byID[r.Server].alive {
				src = s.byID[r.Server]
				break
			}
		}
		for _, r := range sl.Replicas {
			k := copyKey{sl.ID, r.Server}
			if r.State != ctrl.Rebuilding || ss.copying[k] || src == nil {
				continue
			}
			dst := s.byID[r.Server]
			if !dst.alive {
				continue
			}
			s.create(dst, sl.ID, sl.Pages)
			ss.copying[k] = true
			s.copies.start(s, &copyJob{sess: ss, slab: sl.ID, src: src, dst: dst, bytes: float64(sl.Pages) * ctrl.PageSize})
		}
	}
}

// copied is a finished copy: the client tells the ctrl the replica is ready.
func (s *Sim) copied(j *copyJob) {
	delete(j.sess.copying, copyKey{j.slab, j.dst.id})
	var err error
	s.decide(kindReady, func(now time.Time) { err = s.c.ReplicaReady(now, j.sess.id, j.slab, j.dst.id) })
	if err != nil && !errors.Is(err, ctrl.ErrConflict) && !errors.Is(err, ctrl.ErrNotFound) {
		s.violate("replica ready: %v", err)
	}
	for _, l := range s.openLoss {
		l.CopyBytes += uint64(j.bytes)
		l.Copies++
	}
}

// decide runs one call of the state machine, timing it, and takes what it decided.
func (s *Sim) decide(k kind, fn func(now time.Time)) {
	before := s.c.Version()
	s.cpu.time(k, func() { fn(s.wall()) })
	if s.c.Version() != before {
		s.interval.changes++
		if s.p.SavePerChange && k != kindTick {
			s.save() // the service answers a request that changed the state once it is saved
		}
	}
	s.takeEvents()
}

func (s *Sim) takeEvents() {
	for _, ev := range s.c.TakeEvents() {
		switch {
		case strings.Contains(ev.Msg, " is dead: "):
			s.deaths++
			for _, l := range s.openLoss {
				for id := range l.dead {
					if strings.Contains(ev.Msg, "("+id+")") {
						l.deadSeen++
						l.DetectedAt = s.now
					}
				}
			}
		case strings.Contains(ev.Msg, "replacement replica placed"):
			for _, l := range s.openLoss {
				l.PlacedAt = s.now
			}
		case strings.Contains(ev.Msg, " is lost: "):
			s.lostSlabs++
			for _, l := range s.openLoss {
				l.SlabsLost++
			}
		}
	}
}

// tick is the service's: advance the machine, and save what changed as one transaction.
func (s *Sim) tick() {
	s.decide(kindTick, func(now time.Time) { s.c.Tick(now) })
	s.save()
	s.checkRestored()
}

// save counts the transaction the etcd store would issue for what changed since the last save.
func (s *Sim) save() {
	v := s.c.Version()
	if v == s.savedVer {
		return
	}
	s.savedVer = v
	var kv map[string]string
	var ops []ctrl.EtcdOp
	var err error
	s.cpu.time(kindSave, func() { kv, ops, err = ctrl.EtcdSaveTxn(s.p.Prefix, s.etcd.known, s.c.State()) })
	if err != nil {
		s.violate("encoding the state: %v", err)
		return
	}
	s.etcd.known = kv
	n, b := s.etcd.count(ops)
	s.interval.txns++
	s.interval.ops += n
	s.interval.bytes += b
	s.interval.maxOps = max(s.interval.maxOps, n)
	s.interval.maxBytes = max(s.interval.maxBytes, b)
	for _, l := range s.openLoss {
		l.MaxTxnOps = max(l.MaxTxnOps, n)
		l.MaxTxnBytes = max(l.MaxTxnBytes, b)
	}
}

// checkRestored closes the open losses once every live slab is whole: as many replicas as
// asked for, all ready, and every server of the losses declared dead.
func (s *Sim) checkRestored() {
	if len(s.openLoss) == 0 {
		return
	}
	for _, l := range s.openLoss {
		if l.deadSeen < len(l.dead) {
			return
		}
	}
	if s.copies.active() > 0 {
		return
	}
	var st ctrl.Status
	s.decide(kindStatus, func(now time.Time) { st = s.c.Status(now) })
	if st.Totals.Degraded > 0 || st.Totals.Rebuilding > 0 {
		return
	}
	for _, l := range s.openLoss {
		l.RestoredAt = s.now
	}
	s.openLoss = nil
}

// Row is one interval of the time series.
type Row struct {
	T               time.Duration
	Servers         int // live, as the ctrl sees them
	Sessions        int
	Slabs           int
	Degraded        int
	Rebuilding      int
	LostSlabs       int // slabs lost so far
	Stopped         int // sessions stopped on a lost slab so far
	UsedMeanPages   float64
	UsedMaxPages    uint64
	Balance         float64 // max/mean used per live server
	Changes         int     // decisions that changed the persisted state
	Txns            int     // etcd transactions (saves)
	Ops             int     // their puts and deletes
	Bytes           int     // their keys and values
	MaxTxnOps       int
	MaxTxnBytes     int
	StateBytes      int // every key and value the store holds after the interval
	CopiesActive    int
	CopyBytes       uint64 // copied in the interval
	RefusedAllocs   int    // so far
	ServersDeclDead int    // so far
}

type intervalCounts struct {
	changes, txns, ops, bytes, maxOps, maxBytes int
}

func (s *Sim) row() {
	var st ctrl.Status
	s.decide(kindStatus, func(now time.Time) { st = s.c.Status(now) })
	r := Row{T: s.now, Servers: st.Totals.HealthyServers, Sessions: st.Totals.Sessions, Slabs: st.Totals.Slabs,
		Degraded: st.Totals.Degraded, Rebuilding: st.Totals.Rebuilding, LostSlabs: s.lostSlabs, Stopped: s.stopped,
		Changes: s.interval.changes, Txns: s.interval.txns, Ops: s.interval.ops, Bytes: s.interval.bytes,
		MaxTxnOps: s.interval.maxOps, MaxTxnBytes: s.interval.maxBytes, StateBytes: s.etcd.size(),
		CopiesActive: s.copies.active(), CopyBytes: s.copies.takeDone(), RefusedAllocs: s.refused, ServersDeclDead: s.deaths}
	// Balance from what the servers hold (what they report), over the ctrl's live servers.
	var sum uint64
	n := 0
	for _, srv := range st.Servers {
		if !srv.Healthy {
			continue
		}
		if srv.UsedPages > srv.CapacityPages {
			s.violate("server %s reports %d used pages over its capacity %d", srv.ID, srv.UsedPages, srv.CapacityPages)
		}
		sum += srv.UsedPages
		r.UsedMaxPages = max(r.UsedMaxPages, srv.UsedPages)
		n++
	}
	if n > 0 && sum > 0 {
		r.UsedMeanPages = float64(sum) / float64(n)
		r.Balance = float64(r.UsedMaxPages) / r.UsedMeanPages
	}
	s.Rows = append(s.Rows, r)
	s.interval = intervalCounts{}
}

// etcdCounter keeps what the store would hold, to diff each save against, as EtcdStore does.
type etcdCounter struct {
	known map[string]string
}

// count is a transaction's operations and bytes: keys and values (etcd adds its framing and
// the revision compare, and every member writes the entry to its log).
func (e *etcdCounter) count(ops []ctrl.EtcdOp) (n, bytes int) {
	for _, op := range ops {
		bytes += len(op.Key) + len(op.Value)
	}
	return len(ops), bytes
}

func (e *etcdCounter) size() int {
	n := 0
	for k, v := range e.known {
		n += len(k) + len(v)
	}
	return n
}

// event queue: by time, then by scheduling order.
type event struct {
	t   time.Duration
	seq uint64
	fn  func()
}

type eventQueue []event

func (q eventQueue) Len() int { return len(q) }
func (q eventQueue) Less(i, j int) bool {
	if q[i].t != q[j].t {
		return q[i].t < q[j].t
	}
	return q[i].seq < q[j].seq
}
func (q eventQueue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }
func (q *eventQueue) Push(x any)   { *q = append(*q, x.(event)) }
func (q *eventQueue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
}
