package placer

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// startCaches runs the placer's caches (not its loop) until the test ends,
// so a test can drive plan, batch and commit by hand.
func startCaches(t *testing.T, p *Placer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	caches := []interface {
		Run(context.Context) error
		WaitSynced(context.Context) error
	}{p.pending, p.nodes, p.ledgers, p.cordons, p.quotas, p.placers, p.warnings}
	for _, c := range caches {
		go func() { _ = c.Run(ctx) }()
	}
	t.Cleanup(func() { cancel(); close(done) })
	for _, c := range caches {
		if err := c.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// waitLedgers waits (on the cache's own events) until p's ledger cache has
// seen revision rev.
func waitLedgers(t *testing.T, p *Placer, rev int64) {
	t.Helper()
	eventually(t, 10e9, "the ledger cache to see the foreign write", func() bool { return p.ledgers.Revision() >= rev })
}

// TestBindRefusesLedgerWrittenAfterPlan is finding 1 of issue 11: a plan
// made on an empty node must not commit once another session holds the
// same GPU in the ledger, even when the placer's cache has already seen
// that write. Before the fix commit merged the stale choice into the fresh
// ledger and the txn succeeded: one GPU held by two sessions.
func TestBindRefusesLedgerWrittenAfterPlan(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	nodes := s.addNodes(ctx, "gpu", 1, 1)
	ids := s.submit(ctx, "ada", []int{1}, nil)
	p := New(cli, Config{ID: "p1", Logger: quietLogger()})
	startCaches(t, p)
	eventually(t, 10e9, "the caches to see the node and the session", func() bool {
		return p.nodes.Len() == 1 && p.pending.Len() == 1
	})

	// Plan on the node as the caches show it: empty.
	snapshot := p.snapshot()
	plan := NewPlan(snapshot, PlanOptions{})
	if len(plan.Bound) != 1 {
		t.Fatalf("planned %d sessions, want 1", len(plan.Bound))
	}
	gpu := plan.Bound[0].Parts[0].Devices[0]

	// Another writer (a placer binding a Ray worker here, an agent's
	// requeue) puts another session on the same GPU before we commit.
	other := state.Ledger{Node: nodes[0], Allocations: map[string]state.Allocation{
		"other": {Owner: "bob", Role: state.RoleWorker, GPUs: []string{gpu}, CPUMilli: 1000, MemoryMiB: 1024},
	}}
	v, _ := state.Encode(other)
	put, err := cli.Put(ctx, s.k.Ledger(nodes[0]), v)
	if err != nil {
		t.Fatal(err)
	}
	waitLedgers(t, p, put.Header.Revision)

	var res passResult
	byName := map[string]*NodeView{}
	for i := range snapshot.Nodes {
		byName[snapshot.Nodes[i].Node.Name] = &snapshot.Nodes[i]
	}
	batches, _, _ := p.batch(plan.Bound, byName, snapshot)
	p.commit(ctx, batches, byName, snapshot, &res)
	if res.bound != 0 {
		t.Errorf("bound %d sessions on a GPU the ledger gives to another session, want the txn refused", res.bound)
	}
	l, _, err := state.Get[state.Ledger](ctx, cli, s.k.Ledger(nodes[0]))
	if err != nil {
		t.Fatal(err)
	}
	if owners := gpuHolders(l, gpu); len(owners) != 1 {
		t.Fatalf("GPU %s is held by %v, want only the other session", gpu, owners)
	}
	if _, err := cli.Get(ctx, s.k.Pending(ids[0]), clientv3.WithCountOnly()); err != nil {
		t.Fatal(err)
	}
}

// gpuHolders lists the sessions of l that hold gpu.
func gpuHolders(l state.Ledger, gpu string) []string {
	var out []string
	for id, a := range l.Allocations {
		for _, g := range a.GPUs {
			if g == gpu {
				out = append(out, id)
			}
		}
	}
	return out
}
