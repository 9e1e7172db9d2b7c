package ctrl

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/fabric"
)

// ServiceConfig configures the ctrl service.
type ServiceConfig struct {
	Config                               // the state machine's; Rand nil: seeded from crypto/rand
	Store  Store                         // where the state is kept; required
	Logf   func(format string, a ...any) // membership changes and trouble, one line each; nil: discarded
	// Now is the state machine's clock (heartbeat ages, expiries); nil: time.Now. Tests move
	// it by hand.
	Now func() time.Time
	// Election, with an EtcdStore: this ctrl is one of several on the store, and decides only
	// while it leads (election.go). nil: the only ctrl.
	Election *ElectionConfig
}

// Service is the ctrl's HTTP edge: it authenticates requests, runs them on the Cluster under
// one mutex, persists what changed placement before it replies, and ticks the cluster.
type Service struct {
	token    fabric.Token
	store    Store
	logf     func(format string, a ...any)
	now      func() time.Time
	election *ElectionConfig // nil: the only ctrl, always deciding

	leading    atomic.Bool  // with an election: this ctrl leads and decides
	leaderName atomic.Value // with an election: the leader's address (string), for refusals

	mu      sync.Mutex
	cluster *Cluster // guarded by mu
	// epoch counts the times the cluster was replaced by a fresh load of the store (another
	// writer had saved): a change made on an older epoch was discarded and must be made again.
	// Written under saveMu and mu; read under either.
	epoch uint64

	saveMu      sync.Mutex
	rev         Revision      // guarded by saveMu: the store revision the cluster derives from
	saveFailing bool          // guarded by saveMu: the last save failed (logged once per streak)
	saved       atomic.Uint64 // cluster version last in the store; written under saveMu, read anywhere

	lastAuthLog atomic.Int64 // unix nanos of the last logged 401: one line a minute, not one per request
}

// maxBody bounds a request body: a heartbeat lists every slab a server holds (a 1 TiB server of
// 1 MiB slabs lists a million ids, ~8 MB of JSON).
const maxBody = 16 << 20

// slowSave is how long a state save may take before the ctrl logs it: a local fsync takes
// milliseconds, and clients give a whole request 15 s.
const slowSave = time.Second

// storeTimeout bounds one Load or Save: under the clients' 15 s, so that a stalled store is
// reported as the ctrl's error rather than as a ctrl that did not answer.
const storeTimeout = 10 * time.Second

// maxAttempts bounds how often a request is decided again after losing to another writer.
// Writers at once are safe but not fair — the one that just won decides its next request
// without a reload, so it tends to win again — and this bound is what a busy other writer can
// make a request wait through. Several ctrls on one etcd have one writer, the leader
// (election.go); this covers other writers of one store (two services on one FileStore).
const maxAttempts = 32

// errRetry is a change that was decided on a state since replaced by a fresh load: decide again.
var errRetry = errors.New("decided on a replaced state")

// NewService loads the saved state, if any, and returns a service ready to Serve.
func NewService(cfg ServiceConfig) (*Service, error) {
	if len(cfg.Token) < fabric.MinTokenBytes {
		return nil, fmt.Errorf("ctrl: a cluster token of at least %d bytes is required", fabric.MinTokenBytes)
	}
	if err := checkBearer(cfg.Token); err != nil {
		return nil, err
	}
	if cfg.Store == nil {
		return nil, fmt.Errorf("ctrl: a Store is required")
	}
	if cfg.Rand == nil {
		var seed [32]byte
		crand.Read(seed[:])
		cfg.Rand = rand.New(rand.NewChaCha8(seed))
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	s := &Service{token: cfg.Token, store: cfg.Store, logf: cfg.Logf, now: cfg.Now, cluster: NewCluster(cfg.Config), election: cfg.Election}
	if cfg.Election != nil {
		if _, ok := cfg.Store.(*EtcdStore); !ok {
			return nil, fmt.Errorf("ctrl: several ctrls need their state in etcd")
		}
		if cfg.Election.Advertise == "" {
			return nil, fmt.Errorf("ctrl: a ctrl in an election needs the address clients reach it at")
		}
		if ttl := cfg.Election.LeaseTTL; ttl != 0 && (ttl < 2*time.Second || ttl%time.Second != 0) {
			return nil, fmt.Errorf("ctrl: the leader's lease TTL %v must be whole seconds, at least 2s", ttl)
		}
		return s, nil // it loads the state when it wins the election
	}
	s.leading.Store(true)
	for attempt := 0; ; attempt++ {
		ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
		st, rev, ok, err := cfg.Store.Load(ctx)
		cancel()
		if err != nil {
			return nil, err
		}
		if ok {
			if err := s.cluster.Restore(s.now(), st); err != nil {
				return nil, err
			}
			if attempt == 0 {
				slabs := 0
				for _, ss := range st.Sessions {
					slabs += len(ss.Slabs)
				}
				s.logf("restored %d servers, %d sessions, %d slabs; servers have %v to heartbeat, sessions %v",
					len(st.Servers), len(st.Sessions), slabs, s.cluster.cfg.DeadAfter, s.cluster.cfg.SessionTimeout)
			}
			s.logEvents(s.cluster.TakeEvents())
		}
		// Save at once: a store that cannot be written is found now, not at the first
		// allocation, and whatever Restore had to repair is saved.
		ctx, cancel = context.WithTimeout(context.Background(), storeTimeout)
		rev, err = s.store.Save(ctx, s.cluster.State(), rev)
		cancel()
		if errors.Is(err, ErrStale) && attempt < maxAttempts {
			continue // another ctrl wrote in between: start from what it wrote
		}
		if err != nil {
			return nil, err
		}
		s.rev = rev
		s.saved.Store(s.cluster.Version())
		return s, nil
	}
}

// Serve answers the API on ln and ticks the cluster every TickInterval until ctx is done, then
// shuts down and makes sure the last state is saved. For TLS, ln is a tls.NewListener.
func (s *Service) Serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          log.New(logWriter{s.logf}, "", 0),
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	campaigned := make(chan struct{})
	cctx, stopCampaign := context.WithCancel(ctx)
	defer stopCampaign()
	if s.election != nil {
		go func() { s.campaign(cctx); close(campaigned) }()
	} else {
		close(campaigned)
	}
	t := time.NewTicker(TickInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			s.Tick()
		case err := <-errc:
			stopCampaign()
			<-campaigned
			return fmt.Errorf("ctrl: serving the API: %w", err)
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			hs.Shutdown(sctx)
			<-errc
			<-campaigned // a leader saves what is pending and resigns
			if s.election != nil {
				return nil
			}
			return s.flush()
		}
	}
}

// Tick advances the cluster to the service's clock and saves what that changed (or what an
// earlier failed save left unsaved). Serve calls it every TickInterval.
func (s *Service) Tick() {
	if !s.leading.Load() {
		return
	}
	s.mu.Lock()
	s.cluster.Tick(s.now())
	epoch := s.epoch
	ver, st := s.snapshotLocked(s.saved.Load())
	ev := s.cluster.TakeEvents()
	s.mu.Unlock()
	s.logEvents(ev)
	if st != nil {
		s.persist(epoch, ver, st) // a lost race reloaded the state: the next tick decides on it
	}
}

func (s *Service) flush() error {
	for range maxAttempts {
		s.mu.Lock()
		epoch := s.epoch
		ver, st := s.snapshotLocked(s.saved.Load())
		s.mu.Unlock()
		if st == nil {
			return nil
		}
		if err := s.persist(epoch, ver, st); !errors.Is(err, errRetry) {
			return err
		}
	}
	return nil
}

// snapshotLocked copies the state if the cluster's version moved past since. Called with mu held.
func (s *Service) snapshotLocked(since uint64) (uint64, *State) {
	ver := s.cluster.Version()
	if ver <= since {
		return ver, nil
	}
	st := s.cluster.State()
	return ver, &st
}

// persist saves a snapshot taken in epoch unless a newer one is already saved (it includes
// this one). errRetry: the change was decided on a state that another writer's save made
// stale; the cluster now holds the fresh state, and the change must be decided again on it.
func (s *Service) persist(epoch, ver uint64, st *State) error {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	if epoch != s.epoch {
		return errRetry
	}
	if ver <= s.saved.Load() {
		return nil
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	rev, err := s.store.Save(ctx, *st, s.rev)
	cancel()
	if d := time.Since(start); d > slowSave {
		// Every change waits for its save before it is answered, so a slow store is a slow
		// ctrl: say so where the operator looks, rather than leave clients timing out unexplained.
		s.logf("saving the ctrl state took %s; requests that change the state wait for it", d.Round(time.Millisecond))
	}
	if errors.Is(err, ErrNotLeader) {
		s.stepDown("a save was refused: another ctrl leads now")
		return err
	}
	if errors.Is(err, ErrStale) {
		if rerr := s.reloadLocked(); rerr != nil {
			err = rerr
		} else {
			return errRetry
		}
	}
	if err != nil {
		if !s.saveFailing {
			s.logf("cannot save the ctrl state (retrying every tick): %v", err)
		}
		s.saveFailing = true
		return errorf(ErrInternal, "the ctrl cannot write its state: %v", err)
	}
	if s.saveFailing {
		s.logf("ctrl state saved again")
	}
	s.saveFailing = false
	s.rev = rev
	s.saved.Store(ver)
	return nil
}

// reloadLocked replaces the cluster with the store's state, after another writer saved over
// the revision this ctrl's decisions were based on. Called with saveMu held; takes mu only for
// the in-memory Restore.
func (s *Service) reloadLocked() error {
	ctx, cancel := context.WithTimeout(context.Background(), storeTimeout)
	st, rev, ok, err := s.store.Load(ctx)
	cancel()
	if err != nil {
		return err
	}
	if !ok {
		st = State{Version: StateVersion}
	}
	s.mu.Lock()
	err = s.cluster.Restore(s.now(), st)
	if err == nil {
		s.epoch++
		s.rev = rev
		s.saved.Store(s.cluster.Version())
	}
	ev := s.cluster.TakeEvents()
	s.mu.Unlock()
	s.logf("the ctrl state was changed by another writer: reloaded it (revision %d) and deciding again", rev)
	s.logEvents(ev)
	return err
}

// apply runs fn on the cluster and, if fn changed what is persisted, saves before returning:
// the caller replies only once the change would survive a crash. A change that lost the race
// to another writer is decided again on the state that writer saved.
//
// The cluster is ticked to now first, and what that tick decided (a server's death, a
// replacement replica) is saved by the service's next Tick, not waited for here: a request
// that changes nothing itself — a heartbeat — never waits on the store, so a store that
// stalls for a moment does not make the ctrl miss the heartbeats of live servers.
func (s *Service) apply(fn func(c *Cluster, now time.Time) (any, error)) (any, error) {
	for attempt := 1; ; attempt++ {
		if !s.leading.Load() {
			return nil, s.notLeader()
		}
		s.mu.Lock()
		epoch := s.epoch
		now := s.now()
		s.cluster.Tick(now)
		before := s.cluster.Version()
		out, err := fn(s.cluster, now)
		ver, st := s.snapshotLocked(before)
		ev := s.cluster.TakeEvents()
		s.mu.Unlock()
		if st == nil {
			s.logEvents(ev)
			return out, err
		}
		serr := s.persist(epoch, ver, st)
		if errors.Is(serr, errRetry) {
			if attempt < maxAttempts {
				continue
			}
			serr = errorf(ErrInternal, "the ctrl state kept changing under this ctrl (%d attempts): is another ctrl writing it?", attempt)
		}
		s.logEvents(ev)
		if serr != nil && err == nil {
			return out, serr
		}
		return out, err
	}
}

func (s *Service) logEvents(ev []Event) {
	for _, e := range ev {
		s.logf("%s", e.Msg)
	}
}

// Handler is the API, authenticated.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/servers/heartbeat", func(w http.ResponseWriter, r *http.Request) {
		var rep ServerReport
		if !decode(w, r, &rep) {
			return
		}
		out, err := s.apply(func(c *Cluster, now time.Time) (any, error) { return c.ServerHeartbeat(now, rep) })
		if hr, ok := out.(HeartbeatReply); ok && err == nil && len(hr.Free) > 0 {
			// The server is about to free slabs: only once what released them is saved, so
			// that a restarted ctrl cannot place them there again.
			if ferr := s.flush(); ferr != nil {
				out, err = nil, ferr
			}
		}
		respond(w, out, err)
	})
	mux.HandleFunc("POST /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Name string `json:"name"`
		}
		if !decode(w, r, &req) {
			return
		}
		s.reply(w, func(c *Cluster, now time.Time) (any, error) { return c.OpenSession(now, req.Name), nil })
	})
	mux.HandleFunc("POST /v1/sessions/{id}/heartbeat", func(w http.ResponseWriter, r *http.Request) {
		id, ok := sessionParam(w, r)
		if !ok {
			return
		}
		s.reply(w, func(c *Cluster, now time.Time) (any, error) {
			gen, err := c.SessionHeartbeat(now, id)
			return map[string]uint64{"generation": gen}, err
		})
	})
	mux.HandleFunc("POST /v1/sessions/{id}/slabs", func(w http.ResponseWriter, r *http.Request) {
		id, ok := sessionParam(w, r)
		var req struct {
			Replicas int `json:"replicas"`
		}
		if !ok || !decode(w, r, &req) {
			return
		}
		out, err := s.apply(func(c *Cluster, now time.Time) (any, error) { return c.AllocSlab(now, id, req.Replicas) })
		if sl, placed := out.(Slab); placed && errors.Is(err, ErrInternal) {
			// Not on disk: a restarted ctrl would not know the slab and could reuse its id. Take
			// it back rather than hand out a grant the ctrl may forget.
			// In memory only: the store is failing, and the client should hear now; the next
			// tick saves the release with whatever else is pending.
			s.mu.Lock()
			s.cluster.FreeSlab(s.now(), id, sl.ID)
			s.mu.Unlock()
			err = errorf(ErrInternal, "%v: slab not allocated", err)
		}
		respond(w, out, err)
	})
	mux.HandleFunc("GET /v1/sessions/{id}/slabs", func(w http.ResponseWriter, r *http.Request) {
		id, ok := sessionParam(w, r)
		if !ok {
			return
		}
		s.reply(w, func(c *Cluster, now time.Time) (any, error) {
			gen, slabs, err := c.Slabs(now, id)
			return SlabMap{Generation: gen, Slabs: slabs}, err
		})
	})
	mux.HandleFunc("POST /v1/sessions/{id}/slabs/{slab}/ready", func(w http.ResponseWriter, r *http.Request) {
		id, ok := sessionParam(w, r)
		slab, ok2 := slabParam(w, r, ok)
		var req struct {
			Server string `json:"server"`
		}
		if !ok2 || !decode(w, r, &req) {
			return
		}
		s.reply(w, func(c *Cluster, now time.Time) (any, error) {
			return struct{}{}, c.ReplicaReady(now, id, slab, req.Server)
		})
	})
	mux.HandleFunc("POST /v1/sessions/{id}/bad", func(w http.ResponseWriter, r *http.Request) {
		id, ok := sessionParam(w, r)
		var req struct {
			Replicas []BadReplica `json:"replicas"`
		}
		if !ok || !decode(w, r, &req) {
			return
		}
		if len(req.Replicas) == 0 {
			respond(w, nil, errorf(ErrBadRequest, `a replica-bad report names the copies: {"replicas": [{"slab": N, "server": "ID"}, ...]}`))
			return
		}
		for _, b := range req.Replicas {
			if b.Server == "" || b.Slab == 0 {
				respond(w, nil, errorf(ErrBadRequest, "a replica-bad report names each copy by slab and server instance id: got slab %d, server %q", b.Slab, b.Server))
				return
			}
		}
		s.reply(w, func(c *Cluster, now time.Time) (any, error) {
			kept, err := c.ReplicasBad(now, id, req.Replicas)
			return BadReply{Kept: kept}, err
		})
	})
	mux.HandleFunc("DELETE /v1/sessions/{id}/slabs/{slab}", func(w http.ResponseWriter, r *http.Request) {
		id, ok := sessionParam(w, r)
		slab, ok2 := slabParam(w, r, ok)
		if !ok2 {
			return
		}
		s.reply(w, func(c *Cluster, now time.Time) (any, error) { return struct{}{}, c.FreeSlab(now, id, slab) })
	})
	mux.HandleFunc("DELETE /v1/sessions/{id}", func(w http.ResponseWriter, r *http.Request) {
		id, ok := sessionParam(w, r)
		if !ok {
			return
		}
		s.reply(w, func(c *Cluster, now time.Time) (any, error) { return struct{}{}, c.CloseSession(now, id) })
	})
	mux.HandleFunc("GET /v1/status", func(w http.ResponseWriter, r *http.Request) {
		s.reply(w, func(c *Cluster, now time.Time) (any, error) {
			st := c.Status(now)
			if s.election != nil {
				st.Leader = s.election.Advertise
			}
			return st, nil
		})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		respond(w, nil, errorf(ErrNotFound, "the farmem ctrl has no %s %s", r.Method, r.URL.Path))
	})
	return s.authenticate(mux)
}

func (s *Service) reply(w http.ResponseWriter, fn func(c *Cluster, now time.Time) (any, error)) {
	out, err := s.apply(fn)
	respond(w, out, err)
}

// authenticate lets through only requests bearing the cluster token.
func (s *Service) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ok, why := checkRequest(s.token, r.Header.Get("Authorization")); !ok {
			now := time.Now()
			if last := s.lastAuthLog.Load(); now.UnixNano()-last > int64(time.Minute) && s.lastAuthLog.CompareAndSwap(last, now.UnixNano()) {
				s.logf("refused %s %s from %s: %s", r.Method, r.URL.Path, r.RemoteAddr, why)
			}
			writeJSON(w, http.StatusUnauthorized, errorBody{Error: why})
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				writeJSON(w, http.StatusRequestEntityTooLarge, errorBody{Error: fmt.Sprintf("request body over %d bytes", maxBody)})
				return
			}
			respond(w, nil, errorf(ErrBadRequest, "reading the request: %v", err))
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		next.ServeHTTP(w, r)
	})
}

type errorBody struct {
	Error  string `json:"error"`
	Leader string `json:"leader,omitempty"` // with 421: the leading ctrl's address
}

func respond(w http.ResponseWriter, out any, err error) {
	if err != nil {
		eb := errorBody{Error: err.Error()}
		var e *Error
		if errors.As(err, &e) {
			eb.Leader = e.Leader
		}
		writeJSON(w, httpStatus(err), eb)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = 500, []byte(`{"error":"encoding the reply failed"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	b, _ := io.ReadAll(r.Body) // already read and bounded by authenticate
	if len(bytes.TrimSpace(b)) == 0 {
		b = []byte("{}")
	}
	if err := json.Unmarshal(b, v); err != nil {
		respond(w, nil, errorf(ErrBadRequest, "%s %s: the body is not the expected JSON: %v", r.Method, r.URL.Path, err))
		return false
	}
	return true
}

func sessionParam(w http.ResponseWriter, r *http.Request) (fabric.SessionID, bool) {
	var id fabric.SessionID
	if err := id.UnmarshalText([]byte(r.PathValue("id"))); err != nil {
		respond(w, nil, errorf(ErrBadRequest, "%q is not a session id (%d hex digits)", r.PathValue("id"), 2*len(id)))
		return id, false
	}
	return id, true
}

func slabParam(w http.ResponseWriter, r *http.Request, ok bool) (uint64, bool) {
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(r.PathValue("slab"), 10, 64)
	if err != nil {
		respond(w, nil, errorf(ErrBadRequest, "%q is not a slab id", r.PathValue("slab")))
		return 0, false
	}
	return n, true
}

// logWriter sends net/http's own complaints (e.g. a client that hung up) to Logf.
type logWriter struct{ logf func(string, ...any) }

func (l logWriter) Write(p []byte) (int, error) {
	l.logf("%s", bytes.TrimRight(p, "\n"))
	return len(p), nil
}
