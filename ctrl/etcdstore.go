package ctrl

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// EtcdStore keeps the ctrl's state in etcd, one key per server and per session under a prefix,
// beside a meta key (the layout version and the next slab id):
//
//	PREFIX/meta               {"version":1,"next_slab":N}
//	PREFIX/servers/ID         ServerState
//	PREFIX/sessions/ID        SessionState, with its slabs
//	PREFIX/leader/LEASE       the ctrls' election (election.go), not part of the state
//
// A Save is one etcd transaction that writes the keys whose value changed and deletes the ones
// that went, and always rewrites meta; it is conditioned on meta's ModRevision being the
// revision the state was read at. Since every transaction rewrites meta, meta's ModRevision
// moves with every change of the state, so that one comparison catches any write made since —
// including one that only deleted keys — and a ctrl deciding on a stale state changes nothing.
//
// A transaction holds at most the etcd server's --max-txn-ops operations (128 unless set): a
// change touching more keys (a server dying under slabs of more than ~127 sessions) needs
// etcd started with a larger limit, and the error says so. A session's slab map is one value,
// and a transaction at most etcd's --max-request-bytes (1.5 MiB unless set): a session with
// very many slabs needs a larger one, and the error says that too.
type EtcdStore struct {
	cli       *clientv3.Client
	endpoints string // for messages
	prefix    string // ends in "/"
	maxOps    int

	mu       sync.Mutex        // serializes Load and Save (guards the fields below)
	known    map[string]string // key → value as of knownRev: what a Save diffs against
	knownRev Revision          // -1: unknown (a transaction's outcome was not heard)
	fenceKey string            // the leader key this ctrl won with ("": not fenced; election.go)
	fenceRev int64             // its CreateRevision
}

// EtcdConfig says where the etcd cluster is.
type EtcdConfig struct {
	Endpoints []string    // URLs or host:port of its members
	Prefix    string      // keys of this ctrl cluster (default DefaultEtcdPrefix)
	TLS       *tls.Config // nil: plain http endpoints
	MaxTxnOps int         // the etcd server's --max-txn-ops (default 128, etcd's default)
}

// DefaultEtcdPrefix is where the ctrl keeps its keys unless told otherwise.
const DefaultEtcdPrefix = "/farmem/ctrl/"

const (
	etcdMeta     = "meta"
	etcdServers  = "servers/"
	etcdSessions = "sessions/"
)

type etcdMetaValue struct {
	Version  int    `json:"version"`
	NextSlab uint64 `json:"next_slab"`
}

// OpenEtcdStore connects to etcd and checks it answers.
func OpenEtcdStore(ctx context.Context, cfg EtcdConfig) (*EtcdStore, error) {
	if len(cfg.Endpoints) == 0 {
		return nil, fmt.Errorf("no etcd endpoints given: pass --etcd URL[,URL...]")
	}
	for _, ep := range cfg.Endpoints {
		if ep == "" {
			return nil, fmt.Errorf("--etcd %s has an empty endpoint", strings.Join(cfg.Endpoints, ","))
		}
		u, err := url.Parse(ep)
		if !strings.Contains(ep, "://") || err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("etcd endpoint %q is not an http(s)://HOST:PORT URL", ep)
		}
		// One or the other for all: the client speaks TLS to every endpoint or to none.
		if (u.Scheme == "https") != (cfg.TLS != nil) {
			if cfg.TLS == nil {
				return nil, fmt.Errorf("etcd endpoint %s is https: give --etcd-ca (and --etcd-cert, --etcd-key if etcd checks its clients' certificates)", ep)
			}
			return nil, fmt.Errorf("etcd endpoint %s is not https, but TLS for etcd is configured (--etcd-ca, --etcd-cert): give https:// endpoints", ep)
		}
	}
	prefix := cmp.Or(cfg.Prefix, DefaultEtcdPrefix)
	if !strings.HasSuffix(prefix, "/") {
		prefix += "/"
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   cfg.Endpoints,
		DialTimeout: 5 * time.Second,
		TLS:         cfg.TLS,
		Logger:      zap.NewNop(), // its errors come back to us and are reported there
	})
	if err != nil {
		return nil, fmt.Errorf("etcd at %s: %v", strings.Join(cfg.Endpoints, ","), err)
	}
	e := &EtcdStore{cli: cli, endpoints: strings.Join(cfg.Endpoints, ","), prefix: prefix,
		maxOps: cmp.Or(cfg.MaxTxnOps, 128), knownRev: -1}
	// clientv3.New connects lazily: ask something, so an unreachable etcd is found now.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := cli.Get(cctx, prefix+etcdMeta); err != nil {
		cli.Close()
		return nil, fmt.Errorf("cannot reach etcd at %s: %v", e.endpoints, err)
	}
	return e, nil
}

// Client is the etcd client, for what else the ctrl keeps in etcd (its leader election).
func (e *EtcdStore) Client() *clientv3.Client { return e.cli }

// Close disconnects from etcd.
func (e *EtcdStore) Close() error { return e.cli.Close() }

// Load reads every key under the prefix at one revision.
func (e *EtcdStore) Load(ctx context.Context) (State, Revision, bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.loadLocked(ctx)
}

func (e *EtcdStore) loadLocked(ctx context.Context) (State, Revision, bool, error) {
	resp, err := e.cli.Get(ctx, e.prefix, clientv3.WithPrefix())
	if err != nil {
		return State{}, 0, false, fmt.Errorf("reading the ctrl state from etcd at %s: %v", e.endpoints, err)
	}
	known := map[string]string{}
	st := State{Servers: []ServerState{}, Sessions: []SessionState{}}
	var rev Revision
	where := func(k string) string { return "in etcd (key " + k + ")" }
	for _, kv := range resp.Kvs {
		k := string(kv.Key)
		if strings.HasPrefix(k, e.prefix+etcdLeader+"/") {
			continue // the ctrls' election (election.go), not the state
		}
		known[k] = string(kv.Value)
		switch name := strings.TrimPrefix(k, e.prefix); {
		case name == etcdMeta:
			var m etcdMetaValue
			if err := json.Unmarshal(kv.Value, &m); err != nil {
				return State{}, 0, false, fmt.Errorf("the ctrl state %s is corrupt: %v", where(k), err)
			}
			if m.Version != StateVersion {
				return State{}, 0, false, fmt.Errorf("the ctrl state %s has version %d; this ctrl reads version %d", where(k), m.Version, StateVersion)
			}
			st.Version, st.NextSlab, rev = m.Version, m.NextSlab, Revision(kv.ModRevision)
		case strings.HasPrefix(name, etcdServers):
			var s ServerState
			if err := json.Unmarshal(kv.Value, &s); err != nil {
				return State{}, 0, false, fmt.Errorf("the ctrl state %s is corrupt: %v", where(k), err)
			}
			st.Servers = append(st.Servers, s)
		case strings.HasPrefix(name, etcdSessions):
			var s SessionState
			if err := json.Unmarshal(kv.Value, &s); err != nil {
				return State{}, 0, false, fmt.Errorf("the ctrl state %s is corrupt: %v", where(k), err)
			}
			st.Sessions = append(st.Sessions, s)
		default:
			return State{}, 0, false, fmt.Errorf("the ctrl state in etcd has a key this ctrl does not know: %s (is another program using the prefix %s?)", k, e.prefix)
		}
	}
	if rev == 0 {
		if len(known) > 0 {
			return State{}, 0, false, fmt.Errorf("the ctrl state in etcd under %s has keys but no %s key: it is corrupt", e.prefix, etcdMeta)
		}
		e.known, e.knownRev = known, 0
		return State{}, 0, false, nil
	}
	// The order State() gives, so that what was saved is what is loaded.
	slices.SortFunc(st.Servers, func(a, b ServerState) int { return strings.Compare(a.ID, b.ID) })
	slices.SortFunc(st.Sessions, func(a, b SessionState) int { return strings.Compare(string(a.ID[:]), string(b.ID[:])) })
	e.known, e.knownRev = known, rev
	return st, rev, true, nil
}

// Save writes what changed since rev in one transaction conditioned on meta still being at rev.
func (e *EtcdStore) Save(ctx context.Context, st State, rev Revision) (Revision, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if rev != e.knownRev {
		// What we hold is of another revision (or a transaction's fate is unknown): read the
		// store again, to diff against what it holds at rev — if it is still at rev.
		if _, _, _, err := e.loadLocked(ctx); err != nil {
			return 0, err
		}
		if rev != e.knownRev {
			return 0, fmt.Errorf("%w: saving over revision %d, etcd holds revision %d", ErrStale, rev, e.knownRev)
		}
	}
	kv, planned, err := EtcdSaveTxn(e.prefix, e.known, st)
	if err != nil {
		return 0, err
	}
	meta := e.prefix + etcdMeta
	ops := make([]clientv3.Op, 0, len(planned))
	for _, op := range planned {
		if op.Delete {
			ops = append(ops, clientv3.OpDelete(op.Key))
		} else {
			ops = append(ops, clientv3.OpPut(op.Key, op.Value))
		}
	}
	if len(ops) > e.maxOps {
		return 0, fmt.Errorf("this change of the ctrl state writes %d etcd keys in one transaction, over etcd's limit of %d: start etcd with --max-txn-ops %d or more, and give the ctrl the same --etcd-max-txn-ops", len(ops), e.maxOps, 2*len(ops))
	}
	cond := clientv3.Compare(clientv3.ModRevision(meta), "=", int64(rev))
	if rev == 0 {
		cond = clientv3.Compare(clientv3.CreateRevision(meta), "=", 0)
	}
	txn := e.cli.Txn(ctx).If(append([]clientv3.Cmp{cond}, e.fenceCmp()...)...).Then(ops...)
	if e.fenceKey != "" {
		txn = txn.Else(clientv3.OpGet(e.fenceKey)) // which condition failed
	}
	resp, err := txn.Commit()
	if err != nil {
		// It may have been applied all the same: the next Save reads the store first.
		e.knownRev = -1
		if errors.Is(err, rpctypes.ErrRequestTooLarge) {
			return 0, fmt.Errorf("writing the ctrl state to etcd at %s: %v: this change is larger than etcd takes in one request; start etcd with a larger --max-request-bytes", e.endpoints, err)
		}
		return 0, fmt.Errorf("writing the ctrl state to etcd at %s: %v", e.endpoints, err)
	}
	if !resp.Succeeded {
		e.knownRev = -1
		if e.fenceKey != "" {
			if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 0 || kvs[0].CreateRevision != e.fenceRev {
				return 0, &Error{Kind: ErrNotLeader, Msg: "this ctrl is no longer the leader (its etcd lease ended): nothing was written"}
			}
		}
		return 0, fmt.Errorf("%w: another writer saved over revision %d in etcd", ErrStale, rev)
	}
	e.known, e.knownRev = kv, Revision(resp.Header.Revision)
	return e.knownRev, nil
}
