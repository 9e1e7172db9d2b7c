// Package remote is the cluster-backed store: evicted pages live on memory servers, in slabs
// the ctrl places, each written to every replica and read from the fastest healthy one, with a
// checksum the client keeps for every page so that a server returning a wrong page is caught
// and another replica used.
//
// Lock order: Store.mu, then slab.mu, then server.mu. Network I/O never happens under
// Store.mu: it only hands out and takes back slots. Store.badMu and Store.spareMu are innermost:
// taken alone, or under Store.mu when an allocation (grow) takes the spare slab or queues a
// copy it could not create.
//
// A copy that a write failed on while the write as a whole succeeded (another ready copy took
// it), that its server says it no longer holds, or that could not be created, is reported to
// the ctrl as bad (bad.go): its server may be alive, so no death would drop it, yet it misses
// pages. A server's refusal (fabric.RemoteError) is an answer: it never marks the server down. The ctrl places a replacement, which
// maintain fills as after a server's death; housekeep sends the reports.
//
// A slot names a page of a slab: the slab's index in Store.slabs (plus one; zero is never a
// slot) in the high 32 bits, the page in the low; the index of a slab given back to the ctrl
// (slots.go) is reused by a later slab, which cannot happen while a slot of it is in use. Slots
// are written once, by Store, and read
// until freed; a freed slot is reused only by a later Store, which writes every replica again.
// That write-once rule is what makes copying a slab to a new replica safe while the program
// runs (maintain.go).
package remote

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/farmem/farmem/backend"
	"github.com/farmem/farmem/ctrl"
	"github.com/farmem/farmem/fabric"
)

// Config says where the cluster is and how to use it.
type Config struct {
	Ctrl     string         // the ctrl's address
	Token    fabric.Token   // the cluster token
	CA       *x509.CertPool // the cluster CA: reach the ctrl over TLS (nil: in clear, loopback only)
	Replicas int            // copies of every page (default 1)
	Name     string         // the session's name in `farmem status`
	// Dial reaches a memory server (default: fabric.DialTCP).
	Dial func(addr string, cfg fabric.DialConfig) (fabric.Transport, error)
	// Timeout bounds each request to a memory server (default 1s): past it, the next replica
	// is tried and the server is read from last until it answers a request again.
	Timeout time.Duration
	Logf    func(format string, args ...any)
}

// Store implements backend.Backend on memory servers.
type Store struct {
	cfg     Config
	ctrl    *ctrl.Client
	session ctrl.Session
	servers *servers

	mu    sync.Mutex
	slabs []*slab // protected by mu; index+1 is the slot's high half; nil: given back (slots.go)
	holes []int   // protected by mu; the indices of slabs given back, filled by the next new slabs
	// room has bit i set when slabs[i] has a page to hand out; roomFrom is the first word of
	// it that may have one. empty counts the slabs with no page in use. All protected by mu.
	room     []uint64
	roomFrom int
	empty    int
	released []uint64 // slabs given back that the ctrl has yet to hear of; housekeep's alone

	spareMu sync.Mutex
	spare   *slab        // protected by spareMu: a slab allocated ahead of need, or nil
	growMu  sync.Mutex   // one allocation at a time
	stored  atomic.Int64 // slots in use
	lost    chan error   // receives the first loss of pages; capacity 1
	closed  atomic.Bool
	stop    chan struct{}
	done    sync.WaitGroup

	badMu sync.Mutex
	bad   []badCopy     // protected by badMu: copies to report to the ctrl (housekeep sends them)
	wake  chan struct{} // capacity 1: wakes housekeep to send a report at once
}

// crcTable is Castagnoli: hardware-accelerated on every machine farmem runs on.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// Open starts a session with the ctrl and allocates the first slab, so that a misconfigured
// cluster (no ctrl, no servers, wrong token) fails before the program starts.
func Open(cfg Config) (*Store, error) {
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = time.Second
	}
	if cfg.Dial == nil {
		cfg.Dial = func(addr string, c fabric.DialConfig) (fabric.Transport, error) { return fabric.DialTCP(addr, c) }
	}
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	s := &Store{cfg: cfg, ctrl: ctrl.NewClient(cfg.Ctrl, cfg.Token, cfg.CA),
		lost: make(chan error, 1), stop: make(chan struct{}), wake: make(chan struct{}, 1)}
	// Two ctrl calls, each bounded at 15 s by the client, share this budget: a ctrl slow to
	// save the session should not leave the first slab's request no time of its own.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sess, err := s.ctrl.OpenSession(ctx, cfg.Name)
	if err != nil {
		return nil, err
	}
	s.session = sess
	s.servers = newServers(fabric.DialConfig{Token: cfg.Token, Session: sess.ID, Timeout: cfg.Timeout}, cfg.Dial)
	first, err := s.allocate(ctx)
	if err != nil {
		s.ctrl.CloseSession(ctx, sess.ID)
		s.servers.close()
		return nil, err
	}
	s.install(first)
	s.done.Add(2)
	go s.maintain()
	go s.housekeep()
	return s, nil
}

// Session is the ctrl's session id for this store.
func (s *Store) Session() fabric.SessionID { return s.session.ID }

// Lost delivers the first error that means pages are gone for good (every replica of a slab
// lost): the runtime stops the program with it rather than wait for a fault to find out.
func (s *Store) Lost() <-chan error { return s.lost }

func (s *Store) reportLost(err error) {
	select {
	case s.lost <- err:
	default:
	}
}

// grow returns the spare slab, or allocates one now if none is ready. Called with mu held: the
// wait (a ctrl round trip and creates on the servers) is rare, because housekeep keeps a spare;
// it may last while the ctrls elect a new leader.
func (s *Store) grow() (*slab, error) {
	s.spareMu.Lock()
	sl := s.spare
	s.spare = nil
	s.spareMu.Unlock()
	if sl != nil {
		return sl, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return s.allocate(ctx)
}

// slot resolves a slot to its slab and page.
func (s *Store) slot(sl backend.Slot) (*slab, uint32, error) {
	i := int(uint64(sl)>>32) - 1
	s.mu.Lock()
	defer s.mu.Unlock()
	if i < 0 || i >= len(s.slabs) || s.slabs[i] == nil || uint32(sl) >= s.slabs[i].pages {
		return nil, 0, fmt.Errorf("%w %d", backend.ErrUnknownSlot, sl)
	}
	return s.slabs[i], uint32(sl), nil
}

// Store implements backend.Backend: the pages go to every replica of their slabs.
func (s *Store) Store(src []byte, slots []backend.Slot) error {
	n := len(src) / backend.PageSize
	if n*backend.PageSize != len(src) || len(slots) < n {
		return fmt.Errorf("remote: Store of %d bytes into %d slots", len(src), len(slots))
	}
	if err := s.take(slots[:n]); err != nil {
		return err
	}
	slabOf := make([]*slab, n)
	var order []*slab
	s.mu.Lock() // take just handed these slots out: each names a slab we hold
	for i := 0; i < n; i++ {
		sl := s.slabs[uint64(slots[i])>>32-1]
		if !slices.Contains(order, sl) {
			order = append(order, sl)
		}
		slabOf[i] = sl
	}
	s.mu.Unlock()
	if err := s.write(src, slots[:n], slabOf, order); err != nil {
		s.mu.Lock()
		s.giveBack(slots[:n])
		s.mu.Unlock()
		return err
	}
	s.stored.Add(int64(n))
	return nil
}

// Load implements backend.Backend.
func (s *Store) Load(slot backend.Slot, dst []byte) error {
	sl, pg, err := s.slot(slot)
	if err != nil {
		return err
	}
	_, err = sl.read(pg, dst[:backend.PageSize], nil)
	return err
}

// LoadTraced implements backend.TracedLoader: Load, each request carrying tc over tcp (the
// memory server makes its span of the read a child of tc's span), and which copy answered.
func (s *Store) LoadTraced(slot backend.Slot, dst []byte, tc backend.TraceContext) (backend.LoadedFrom, error) {
	sl, pg, err := s.slot(slot)
	if err != nil {
		return backend.LoadedFrom{}, err
	}
	ftc := fabric.TraceContext(tc) // the same W3C fields; backend does not import fabric
	srv, err := sl.read(pg, dst[:backend.PageSize], &ftc)
	if err != nil {
		return backend.LoadedFrom{}, err
	}
	return backend.LoadedFrom{Server: srv.addr, Transport: srv.transportName(), Replica: sl.replicaOf(srv)}, nil
}

// LoadBatch implements backend.BatchLoader: each run of slots whose slabs' preferred copies
// are on one server is one request to it, whatever their slabs. A prefetch batch's pages lie
// in several slabs (freed slots are reused from any slab), and a request per slab would cost a
// round trip each, one after the other, while the program runs on towards the pages being
// fetched. Any failure (a server error, a page with a wrong checksum) fails the batch: the
// caller then loads page by page, which fails over between copies.
func (s *Store) LoadBatch(slots []backend.Slot, dst []byte) error {
	var stack [32]batchPage // a prefetch batch: no allocation
	pages := stack[:0]
	for _, slot := range slots {
		sl, pg, err := s.slot(slot)
		if err != nil {
			return err
		}
		srv, err := sl.preferredCopy()
		if err != nil {
			return err
		}
		pages = append(pages, batchPage{sl, pg, srv})
	}
	for i := 0; i < len(pages); {
		j := i + 1
		for j < len(pages) && pages[j].srv == pages[i].srv {
			j++
		}
		if err := readRun(pages[i:j], dst[i*backend.PageSize:j*backend.PageSize]); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// Free implements backend.Backend. The slot is reused by a later Store, which overwrites it on
// every replica; the servers are not told. A slab left with no page in use is given back to
// the ctrl by housekeep (releaseEmpty).
func (s *Store) Free(slots ...backend.Slot) {
	s.mu.Lock()
	s.giveBack(slots)
	s.mu.Unlock()
	s.stored.Add(-int64(len(slots)))
}

// Stored implements backend.Backend.
func (s *Store) Stored() int { return int(s.stored.Load()) }

// StoredBytes implements backend.Backend: the bytes of one copy.
func (s *Store) StoredBytes() int64 { return s.stored.Load() * backend.PageSize }

// Close ends the session: the ctrl releases the slabs and tells their servers to free them.
func (s *Store) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	close(s.stop)
	s.done.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.ctrl.CloseSession(ctx, s.session.ID)
	s.servers.close()
	return err
}

var errClosed = errors.New("remote: store is closed")
