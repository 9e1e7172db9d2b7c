package ctrl

// The leader's fence, below the service: once its lease has ended, a save of the old leader
// changes nothing, whatever it believes.

import (
	"context"
	"errors"
	"testing"

	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/farmem/farmem/ctrl/etcdtest"
)

func TestEtcdStoreFence(t *testing.T) {
	ctx := context.Background()
	etcd := etcdtest.Start(t, 1, "")
	s, err := OpenEtcdStore(ctx, EtcdConfig{Endpoints: etcd.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sess, err := concurrency.NewSession(s.cli, concurrency.WithTTL(5))
	if err != nil {
		t.Fatal(err)
	}
	el := concurrency.NewElection(sess, s.prefix+etcdLeader)
	if err := el.Campaign(ctx, "127.0.0.1:7000"); err != nil {
		t.Fatal(err)
	}
	s.fence(el.Key(), el.Rev())
	st := State{Version: StateVersion, NextSlab: 1}
	rev, err := s.Save(ctx, st, 0)
	if err != nil {
		t.Fatalf("a save while leading: %v", err)
	}
	sess.Close() // revokes the lease: the leader key goes with it
	st.NextSlab = 7
	if _, err := s.Save(ctx, st, rev); !errors.Is(err, ErrNotLeader) || errors.Is(err, ErrStale) {
		t.Errorf("a save after the lease ended: %v, want ErrNotLeader", err)
	}
	if got, r, _, err := s.Load(ctx); err != nil || r != rev || got.NextSlab != 1 {
		t.Errorf("the fenced save wrote: rev %d (was %d), next slab %d, %v", r, rev, got.NextSlab, err)
	}
}
