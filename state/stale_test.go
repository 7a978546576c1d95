package state_test

import (
	"context"
	"errors"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestStaleReleaseWritesNothing is issue 11's item 4: a worker whose
// binding was taken by a node-loss re-queue, and then bound again on the
// same node, releases late. Before Release compared the binding's create
// revision, that release freed the newer binding's allocation, deleted the
// newer binding and overwrote the newer attempt's status.
func TestStaleReleaseWritesNothing(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	old := seedBound(t, cli, k, "s1")
	// Node loss: the binding goes, the session is re-queued...
	if _, err := cli.Delete(ctx, k.Binding("n1", "s1")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T)
		want  state.Phase
	}{
		{"re-queued", func(t *testing.T) {
			if _, err := state.Put(ctx, cli, k.Status("s1"), state.Status{Session: "s1", Phase: state.PhasePending, Reason: "NodeLost", Attempt: 1}); err != nil {
				t.Fatal(err)
			}
		}, state.PhasePending},
		{"bound again on the same node", func(t *testing.T) {
			l := state.Ledger{Node: "n1", Allocations: map[string]state.Allocation{"s1": {Owner: "ada", Role: state.RoleSingle, GPUs: []string{"GPU-2"}}}}
			if _, err := state.Put(ctx, cli, k.Ledger("n1"), l); err != nil {
				t.Fatal(err)
			}
			if _, err := state.Put(ctx, cli, k.Binding("n1", "s1"), state.Binding{Session: "s1", Node: "n1", Attempt: 1}); err != nil {
				t.Fatal(err)
			}
			if _, err := state.Put(ctx, cli, k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseBound, Attempt: 1}); err != nil {
				t.Fatal(err)
			}
		}, state.PhaseBound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.setup(t)
			before, err := cli.Get(ctx, k.All(), clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if err := state.Release(ctx, cli, k, "n1", "s1", old, succeed); !errors.Is(err, state.ErrStale) {
				t.Fatalf("stale release = %v, want ErrStale", err)
			}
			after, err := cli.Get(ctx, k.All(), clientv3.WithPrefix())
			if err != nil {
				t.Fatal(err)
			}
			if after.Header.Revision != before.Header.Revision {
				t.Errorf("a stale release wrote (revision %d → %d)", before.Header.Revision, after.Header.Revision)
			}
			if st, _, _ := state.Get[state.Status](ctx, cli, k.Status("s1")); st.Phase != tc.want {
				t.Errorf("status = %s, want %s", st.Phase, tc.want)
			}
		})
	}
}

// TestReleaseComparesThePartItReadAbsent: a release decides what becomes
// of the part from the part and the spec as it read them. Here the
// session was retired (no spec) and its container never reported (no
// part), so the release would write nothing for the part; between its read
// and its transaction the part appears, Stopping (the agent's own report
// of a slow stop, which a first read from a lagging member does not see).
// The release must compare the part it read as absent and decide again:
// the part goes with the binding. Comparing the part only when one was
// read left it saying the container stops with its binding gone (the
// soak's container-without-binding at 636,000 binds).
func TestReleaseComparesThePartItReadAbsent(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	rev := seedBound(t, cli, k, "s1")
	if _, err := cli.Delete(ctx, k.Session("s1")); err != nil { // retired
		t.Fatal(err)
	}
	stopping := func() {
		ops, err := state.PartOps(k, state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseStopping, BindingRevision: rev})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	// The part is written once the release has read, as its transaction
	// is built (movingKV).
	kv := &movingKV{KV: cli, move: stopping}
	if err := state.Release(ctx, kv, k, "n1", "s1", rev, succeed); err != nil {
		t.Fatal(err)
	}
	if !kv.moved {
		t.Fatal("the release wrote without compares; the test is written for a transaction that compares")
	}
	for _, key := range []string{k.Binding("n1", "s1"), k.Part("n1", "s1")} {
		if r, err := cli.Get(ctx, key); err != nil || len(r.Kvs) != 0 {
			t.Errorf("%s after the release: %v %v, want it gone", key, r, err)
		}
	}
}
