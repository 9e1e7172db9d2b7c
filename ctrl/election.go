package ctrl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Several ctrls on one etcd: each campaigns in an etcd election (a lease kept alive by the
// ctrl, and a key under PREFIX/leader/ bound to it; the oldest key leads), and its value is the
// ctrl's advertised address. The leader runs the state machine; the others answer every
// request with ErrNotLeader naming the leader, and clients move to it.
//
// The leader's writes are fenced: every Save also requires the leader key it won with to still
// exist at the revision it was created, so once its lease has ended — expired while it was cut
// off from etcd, or revoked — no write of it lands, even in the moment before it hears that it
// lost. A save refused so makes the ctrl step down at once; so does the lease ending.

// DefaultLeaseTTL is how long a leader that stopped renewing its lease (crashed, or cut off
// from etcd) keeps the others from taking over.
const DefaultLeaseTTL = 5 * time.Second

// etcdLeader is the election's prefix under the store's: its keys are PREFIX/leader/LEASE.
const etcdLeader = "leader"

// ElectionConfig makes a Service one of several ctrls on an EtcdStore.
type ElectionConfig struct {
	Advertise string        // the address clients reach this ctrl at, told to them by the others
	LeaseTTL  time.Duration // 0: DefaultLeaseTTL; whole seconds, at least 2
}

// campaign runs this ctrl's part in the election until ctx ends: campaign, lead until the
// lease ends, campaign again. Followers keep the current leader's name for their refusals.
func (s *Service) campaign(ctx context.Context) {
	es := s.store.(*EtcdStore)
	ttl := int(cmp.Or(s.election.LeaseTTL, DefaultLeaseTTL).Seconds())
	var outage error
	for ctx.Err() == nil {
		// With ctx, so that stopping does not wait on an etcd that does not answer.
		sess, err := concurrency.NewSession(es.cli, concurrency.WithTTL(ttl), concurrency.WithContext(ctx))
		if err != nil {
			if outage == nil && ctx.Err() == nil {
				s.logf("cannot join the ctrl election in etcd at %s, retrying: %v", es.endpoints, err)
			}
			outage = err
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		outage = nil
		s.leadOnce(ctx, es, sess)
		sess.Close() // revokes the lease if it can (after ctx ended, the leader has resigned)
	}
}

// leadOnce campaigns with one lease and leads while it lasts.
func (s *Service) leadOnce(ctx context.Context, es *EtcdStore, sess *concurrency.Session) {
	el := concurrency.NewElection(sess, es.prefix+etcdLeader)
	octx, stopObserving := context.WithCancel(ctx)
	defer stopObserving()
	go func() {
		for resp := range el.Observe(octx) {
			if len(resp.Kvs) == 0 {
				continue
			}
			name := string(resp.Kvs[0].Value)
			if old, _ := s.leaderName.Swap(name).(string); old != name && name != s.election.Advertise {
				s.logf("the leading ctrl is %s", name)
			}
		}
	}()
	cctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-sess.Done(): // the lease ended while campaigning: campaign again with a new one
			cancel()
		case <-cctx.Done():
		}
	}()
	err := el.Campaign(cctx, s.election.Advertise)
	if err != nil {
		cancel()
		if ctx.Err() == nil && !errors.Is(err, context.Canceled) {
			s.logf("the ctrl election in etcd failed, campaigning again: %v", err)
			select { // not at once: etcd's error may be there again at once
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
		}
		return
	}
	es.fence(el.Key(), el.Rev())
	if err := s.becomeLeader(); err != nil {
		s.logf("won the election but cannot load the state from etcd, stepping down: %v", err)
		s.stepDown("")
		el.Resign(context.Background())
		cancel()
		return
	}
	select {
	case <-sess.Done(): // also when ctx ends: the session's keep-alive stops with it
	case <-ctx.Done():
	}
	if ctx.Err() == nil {
		s.stepDown("its etcd lease ended (cut off from etcd, or revoked)")
	} else {
		// Shutting down: save what is pending while still the leader (the lease outlives its
		// keep-alive by up to its TTL), then let go.
		s.stepDown("")
		s.flush()
		rctx, rcancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := el.Resign(rctx); err == nil {
			s.logf("resigned the lead: another ctrl takes over now")
		}
		rcancel()
	}
	cancel()
}

// becomeLeader loads the state afresh: what the previous leader saved, with every server and
// session given a fresh grace period, since this ctrl heard none of their heartbeats.
func (s *Service) becomeLeader() error {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
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
	fresh := NewCluster(s.cluster.cfg)
	fresh.version = s.cluster.version
	err = fresh.Restore(s.now(), st)
	if err == nil {
		s.cluster = fresh
		s.epoch++
		s.rev = rev
		s.saved.Store(s.cluster.Version())
	}
	ev := s.cluster.TakeEvents()
	s.mu.Unlock()
	if err != nil {
		return err
	}
	s.leading.Store(true)
	slabs := 0
	for _, ss := range st.Sessions {
		slabs += len(ss.Slabs)
	}
	s.logf("leading the ctrls (as %s): %d servers, %d sessions, %d slabs; servers have %v to heartbeat, sessions %v",
		s.election.Advertise, len(st.Servers), len(st.Sessions), slabs, s.cluster.cfg.DeadAfter, s.cluster.cfg.SessionTimeout)
	s.logEvents(ev)
	return nil
}

// stepDown stops this ctrl deciding at once; why is logged if not empty.
func (s *Service) stepDown(why string) {
	if s.leading.Swap(false) && why != "" {
		s.logf("no longer leading the ctrls: %s", why)
	}
}

// notLeader is the refusal of a follower.
func (s *Service) notLeader() error {
	leader, _ := s.leaderName.Load().(string)
	if leader == "" || leader == s.election.Advertise {
		return &Error{Kind: ErrNotLeader, Msg: fmt.Sprintf("the ctrl at %s is not the leader, and no leader is elected yet: retry shortly", s.election.Advertise)}
	}
	return &Error{Kind: ErrNotLeader, Msg: fmt.Sprintf("the ctrl at %s is not the leader; the leader is %s", s.election.Advertise, leader), Leader: leader}
}

// fence makes every later Save require the leader key key, created at rev, to still exist.
func (e *EtcdStore) fence(key string, rev int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fenceKey, e.fenceRev = key, rev
}

// fenceCmp is the condition a fenced Save adds; nil when not fenced. Called with e.mu held.
func (e *EtcdStore) fenceCmp() []clientv3.Cmp {
	if e.fenceKey == "" {
		return nil
	}
	return []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(e.fenceKey), "=", e.fenceRev)}
}
