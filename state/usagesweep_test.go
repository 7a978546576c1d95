package state_test

import (
	"context"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestSweepUsageMarksKeepsTheQuotaGuard: the usage marks of placers that
// are gone are deleted, a live placer's kept, and a bind whose ledgers
// were read before a deleted mark was written is still refused (the
// sweep's own mark stands for the marks it deleted); one whose ledgers
// were read after the sweep goes through. Deleting the marks alone would
// let that first bind exceed the quota.
func TestSweepUsageMarksKeepsTheQuotaGuard(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	put := func(key string, v any) int64 {
		t.Helper()
		r, err := state.Put(ctx, cli, key, v)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	now := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	put(k.Placer("placer-a"), state.Placer{ID: "placer-a"})
	put(k.UsageMark(state.QuotaUsers, "ada", "placer-a"), state.UsageMark{Placer: "placer-a", Session: "s0", At: now})
	// placer-a read the ledgers here; placer-b (gone since) bound one of
	// ada's sessions after it.
	ledgersAt := put(k.Node("n1"), state.Node{Name: "n1"})
	put(k.UsageMark(state.QuotaUsers, "ada", "placer-b"), state.UsageMark{Placer: "placer-b", Session: "s1", At: now})
	put(k.UsageMark(state.QuotaUsers, "bob", "placer-b"), state.UsageMark{Placer: "placer-b", Session: "s2", At: now})
	pendingRev := put(k.Pending("s3"), state.QueueEntry{Session: "s3", Owner: "ada"})

	n, err := state.SweepUsageMarks(ctx, cli, k, now)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 {
		t.Errorf("swept %d marks, want placer-b's 2", n)
	}
	marks, err := cli.Get(ctx, k.UsageDir(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, kv := range marks.Kvs {
		left = append(left, string(kv.Key))
	}
	want := []string{k.UsageMark(state.QuotaUsers, "ada", "placer-a"), k.UsageMark(state.QuotaUsers, "ada", "~swept"),
		k.UsageMark(state.QuotaUsers, "bob", "~swept")}
	if !slices.Equal(left, want) {
		t.Errorf("marks left %q, want %q", left, want)
	}

	bind := func(at int64) bool {
		t.Helper()
		nodeRev, err := cli.Get(ctx, k.Node("n1"))
		if err != nil {
			t.Fatal(err)
		}
		lws := []state.LedgerWrite{{Node: "n1", NodeRevision: nodeRev.Kvs[0].ModRevision,
			Ledger: state.Ledger{Node: "n1", Allocations: map[string]state.Allocation{"s3": {GPUs: []string{"GPU-0"}}}}}}
		ps := []state.Placement{{Session: "s3", PendingRevision: pendingRev,
			Bindings: []state.Binding{{Node: "n1", Session: "s3"}},
			Status:   state.Status{Session: "s3", Phase: state.PhaseBound, Updated: now},
			Quotas:   []state.QuotaGuard{{Scope: state.QuotaUsers, Name: "ada", LedgersAt: at, Placer: "placer-a", Session: "s3"}}}}
		cmps, ops, err := state.BindOps(k, lws, ps)
		if err != nil {
			t.Fatal(err)
		}
		r, err := cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return r.Succeeded
	}
	if bind(ledgersAt) {
		t.Error("a bind on ledgers read before placer-b's swept mark was written went through; want it refused")
	}
	cur, err := cli.Get(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	if !bind(cur.Header.Revision) {
		t.Error("a bind on ledgers read after the sweep was refused")
	}
	if n, err := state.SweepUsageMarks(ctx, cli, k, now); err != nil || n != 0 {
		t.Errorf("a second sweep deleted %d marks (%v), want none", n, err)
	}
}

// TestSweepUsageMarksRefusedByAComeback: between the sweep's read and its
// transaction a gone placer registers again, or a gone placer's mark is
// written again; the transaction of each quota it touches is refused and
// deletes nothing (no mark, no swept mark written), the other quotas are
// swept, and the next sweep reads afresh and deletes only what is still a
// gone placer's.
func TestSweepUsageMarksRefusedByAComeback(t *testing.T) {
	k := state.MustKeys(state.DefaultPrefix)
	now := time.Date(2026, 11, 29, 9, 0, 0, 0, time.UTC)
	ada := func(p string) string { return k.UsageMark(state.QuotaUsers, "ada", p) }
	bob := func(p string) string { return k.UsageMark(state.QuotaUsers, "bob", p) }
	for _, tc := range []struct {
		name        string
		move        func(put func(string, any))
		first, next int      // marks deleted by the first sweep and the next
		left        []string // marks left after both
	}{
		{
			name: "placer back",
			move: func(put func(string, any)) { put(k.Placer("placer-b"), state.Placer{ID: "placer-b"}) },
			// Both quotas hold placer-b's mark: both refused; then
			// placer-c's alone goes.
			first: 0, next: 1,
			left: []string{ada("placer-b"), ada("~swept"), bob("placer-b")},
		},
		{
			name: "mark written again",
			move: func(put func(string, any)) {
				put(ada("placer-c"), state.UsageMark{Placer: "placer-c", Session: "s9", At: now})
			},
			// ada's refused, bob's swept; then ada's, with the mark
			// read afresh.
			first: 1, next: 2,
			left: []string{ada("~swept"), bob("~swept")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdtest.New(t)
			ctx := context.Background()
			put := func(key string, v any) {
				t.Helper()
				if _, err := state.Put(ctx, cli, key, v); err != nil {
					t.Fatal(err)
				}
			}
			put(ada("placer-b"), state.UsageMark{Placer: "placer-b", Session: "s1", At: now})
			put(ada("placer-c"), state.UsageMark{Placer: "placer-c", Session: "s2", At: now})
			put(bob("placer-b"), state.UsageMark{Placer: "placer-b", Session: "s3", At: now})
			kv := &movingKV{KV: cli, move: func() { tc.move(put) }}
			n, err := state.SweepUsageMarks(ctx, kv, k, now)
			if err != nil {
				t.Fatal(err)
			}
			if !kv.moved {
				t.Fatal("the sweep wrote nothing to move under")
			}
			if n != tc.first {
				t.Errorf("first sweep deleted %d marks, want %d", n, tc.first)
			}
			if n, err = state.SweepUsageMarks(ctx, cli, k, now); err != nil || n != tc.next {
				t.Errorf("next sweep deleted %d marks (%v), want %d", n, err, tc.next)
			}
			marks, err := cli.Get(ctx, k.UsageDir(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				t.Fatal(err)
			}
			var left []string
			for _, m := range marks.Kvs {
				left = append(left, string(m.Key))
			}
			if !slices.Equal(left, tc.left) {
				t.Errorf("marks left %q, want %q", left, tc.left)
			}
		})
	}
}
