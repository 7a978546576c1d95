package state_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

func TestVolumeAllowsAndPaths(t *testing.T) {
	open := state.Volume{Name: "rs-open", HostPath: "/srv/open"}
	limited := state.Volume{Name: "rs-lim", HostPath: "/srv/lim", Users: []string{"ada"}, Groups: []string{"vision"}}
	for _, c := range []struct {
		v      state.Volume
		owner  string
		groups []string
		want   bool
	}{
		{open, "anyone", nil, true},
		{limited, "ada", nil, true},
		{limited, "bob", []string{"nlp", "vision"}, true},
		{limited, "bob", []string{"nlp"}, false},
		{limited, "ada2", nil, false},
	} {
		if got := c.v.Allows(c.owner, c.groups); got != c.want {
			t.Errorf("%s allows %s %v: %v; want %v", c.v.Name, c.owner, c.groups, got, c.want)
		}
	}
	per := state.Volume{Name: "rs-per", HostPath: "/srv/results/{user}/out", PerUser: true}
	if errs := per.Validate(); len(errs) != 0 {
		t.Errorf("valid per-user volume refused: %v", errs)
	}
	if p, err := per.HostPathFor("ada@lab"); err != nil || p != "/srv/results/ada@lab/out" {
		t.Errorf("HostPathFor(ada@lab) = %q, %v", p, err)
	}
	for _, owner := range []string{"..", ".", "a/b"} {
		if p, err := per.HostPathFor(owner); err == nil {
			t.Errorf("HostPathFor(%q) = %q; want an error", owner, p)
		}
	}
	if p, _ := open.HostPathFor(".."); p != "/srv/open" {
		t.Errorf("a shared volume's path depends on the owner: %q", p)
	}
}

// TestCreateSessionGuards: a create whose guard fails (a volume redefined
// since it was read) writes nothing and says ErrConflict; with the guard
// holding it commits; a taken id is still ErrExists.
func TestCreateSessionGuards(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	rev, err := state.Put(ctx, cli, k.Volume("rs-vol"), state.Volume{Name: "rs-vol", HostPath: "/srv/v"})
	if err != nil {
		t.Fatal(err)
	}
	guard := clientv3.Compare(clientv3.ModRevision(k.Volume("rs-vol")), "=", rev)
	now := time.Now().UTC()
	s := state.Session{ID: "rs-guarded", Owner: "ada", Kind: state.KindBatch, Command: []string{"true"}, Desired: state.DesiredRunning, Created: now}
	if _, err := state.Put(ctx, cli, k.Volume("rs-vol"), state.Volume{Name: "rs-vol", HostPath: "/srv/other"}); err != nil {
		t.Fatal(err)
	}
	if _, err := state.CreateSession(ctx, cli, k, s, now, guard); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("create under a stale guard: %v; want ErrConflict", err)
	}
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.CreateSessionIdempotent(ctx, cli, k, s, now, state.Idempotency{Key: k.Idempotency("ada", "rs1"), Record: state.IdempotencyRecord{Session: s.ID}, Lease: lease.ID}, guard); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("idempotent create under a stale guard: %v; want ErrConflict", err)
	}
	for _, key := range []string{k.Session(s.ID), k.Pending(s.ID), k.Status(s.ID), k.Idempotency("ada", "rs1")} {
		if r, _ := cli.Get(ctx, key); len(r.Kvs) != 0 {
			t.Errorf("%s written by a refused create", key)
		}
	}
	_, fresh, _ := state.Get[state.Volume](ctx, cli, k.Volume("rs-vol"))
	guard = clientv3.Compare(clientv3.ModRevision(k.Volume("rs-vol")), "=", fresh)
	if _, err := state.CreateSession(ctx, cli, k, s, now, guard); err != nil {
		t.Fatalf("create under a fresh guard: %v", err)
	}
	if _, err := state.CreateSession(ctx, cli, k, s, now, guard); !errors.Is(err, state.ErrExists) {
		t.Fatalf("second create of one id: %v; want ErrExists", err)
	}
}
