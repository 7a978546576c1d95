package state_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestTxnBudgetAgreesWithEtcd holds state.TxnBudget to a real etcd (default
// --max-txn-ops 128) at the edges: what the budget admits, etcd takes, and
// the smallest step beyond is refused by both. Nested transactions count
// against the limit less the outer count (issue 11, finding 3).
func TestTxnBudgetAgreesWithEtcd(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	budget := state.TxnBudget{}
	nested := func(n int) []clientv3.Op {
		ops := make([]clientv3.Op, n)
		for i := range ops {
			key := fmt.Sprintf("/budget/nested/%d", i)
			ops[i] = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "<", 1<<62)},
				[]clientv3.Op{clientv3.OpPut(key, "v")}, nil)
		}
		return ops
	}
	puts := func(n int) []clientv3.Op {
		ops := make([]clientv3.Op, n)
		for i := range ops {
			ops[i] = clientv3.OpPut(fmt.Sprintf("/budget/flat/%d", i), "v")
		}
		return ops
	}
	cmps := func(n int) []clientv3.Cmp {
		out := make([]clientv3.Cmp, n)
		for i := range out {
			out[i] = clientv3.Compare(clientv3.ModRevision(fmt.Sprintf("/budget/flat/%d", i)), "<", 1<<62)
		}
		return out
	}
	for _, c := range []struct {
		name string
		cmps []clientv3.Cmp
		ops  []clientv3.Op
	}{
		{"127 nested one-op txns", nil, nested(127)},
		{"128 nested one-op txns", nil, nested(128)},
		{"128 puts", nil, puts(128)},
		{"129 puts", nil, puts(129)},
		{"128 compares, 1 put", cmps(128), puts(1)},
		{"129 compares, 1 put", cmps(129), puts(1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			size := state.SizeOf(c.cmps, c.ops, nil)
			_, err := cli.Txn(ctx).If(c.cmps...).Then(c.ops...).Commit()
			if fits := budget.Fits(size); fits != (err == nil) {
				t.Errorf("budget says fits=%v for %s; etcd says %v", fits, size, err)
			}
			if err != nil && !strings.Contains(err.Error(), "too many operations") {
				t.Errorf("etcd refused for another reason: %v", err)
			}
		})
	}
}

// TestBindSizeMatchesBindOps keeps the batching estimate equal to what
// BindOps builds: the placer packs batches by BindSize and QuotaGuardSize.
func TestBindSizeMatchesBindOps(t *testing.T) {
	k := state.MustKeys(state.DefaultPrefix)
	var lws []state.LedgerWrite
	for _, n := range []string{"a", "b", "c"} {
		lws = append(lws, state.LedgerWrite{Node: n, Ledger: state.Ledger{Node: n, Allocations: map[string]state.Allocation{}}})
	}
	guard := state.QuotaGuard{Scope: state.QuotaUsers, Name: "ada", Placer: "p1"}
	ps := []state.Placement{
		{Session: "s1", Bindings: []state.Binding{{Node: "a", Session: "s1"}, {Node: "b", Session: "s1"}}, Quotas: []state.QuotaGuard{guard}},
		{Session: "s2", Bindings: []state.Binding{{Node: "c", Session: "s2"}}, Quotas: []state.QuotaGuard{guard}}, // same quota: guarded once
	}
	cmps, ops, err := state.BindOps(k, lws, ps)
	if err != nil {
		t.Fatal(err)
	}
	got := state.SizeOf(cmps, ops, nil)
	want := state.BindSize(3, 2, 3).Plus(state.QuotaGuardSize(1))
	if got.Compares != want.Compares || got.Then != want.Then || got.Ops() != want.Ops() {
		t.Errorf("BindOps built %s, BindSize+QuotaGuardSize say %s", got, want)
	}
}
