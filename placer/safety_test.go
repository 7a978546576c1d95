package placer

import (
	"context"
	"slices"
	"testing"
	"time"

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

// planOn plans what p's caches hold, restricted to the named nodes and
// sessions (all when nil), and returns the plan with its snapshot and
// node views: a test drives batch and commit by hand from there.
func planOn(t *testing.T, p *Placer, nodes []string, ids []string) (*Plan, *Snapshot, map[string]*NodeView) {
	t.Helper()
	snap := p.snapshot()
	if nodes != nil {
		keep := map[string]bool{}
		for _, n := range nodes {
			keep[n] = true
		}
		snap.Nodes = slices.DeleteFunc(snap.Nodes, func(v NodeView) bool { return !keep[v.Node.Name] })
	}
	if ids != nil {
		snap.Pending = slices.DeleteFunc(snap.Pending, func(q Pending) bool { return !slices.Contains(ids, q.Entry.Session) })
	}
	byName := map[string]*NodeView{}
	for i := range snap.Nodes {
		byName[snap.Nodes[i].Node.Name] = &snap.Nodes[i]
	}
	return NewPlan(snap, p.cfg.Plan), snap, byName
}

// commitPlan batches and commits plan as p would, returning what it bound.
func commitPlan(t *testing.T, p *Placer, plan *Plan, snap *Snapshot, nodes map[string]*NodeView) passResult {
	t.Helper()
	var res passResult
	batches, _, unfit := p.batch(plan.Bound, nodes, snap)
	if len(unfit) > 0 {
		t.Fatalf("%d decisions fit no transaction", len(unfit))
	}
	p.commit(context.Background(), batches, nodes, snap, &res)
	return res
}

// TestBindRefusesLostNode is finding 7 of issue 11: a bind planned on a
// node whose lease expires before the commit must not commit (it would
// bind a session to a dead node and burn a restart when the node loss is
// handled). Before the fix the bind transaction compared the ledger only
// and committed.
func TestBindRefusesLostNode(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	nodes := s.addNodes(ctx, "gpu", 1, 8)
	s.submit(ctx, "ada", []int{1}, nil)
	p := New(cli, Config{ID: "p1", Logger: quietLogger()})
	startCaches(t, p)
	eventually(t, 10e9, "the caches to see the node and the session", func() bool { return p.nodes.Len() == 1 && p.pending.Len() == 1 })
	plan, snap, byName := planOn(t, p, nil, nil)
	if len(plan.Bound) != 1 {
		t.Fatalf("planned %d, want 1", len(plan.Bound))
	}
	s.killNode(ctx, nodes[0])
	if res := commitPlan(t, p, plan, snap, byName); res.bound != 0 {
		t.Fatalf("bound %d sessions on a node whose lease expired after planning, want the txn refused", res.bound)
	}
	if r, err := cli.Get(ctx, s.k.Ledger(nodes[0])); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the lost node has a ledger (%v): the bind wrote it", err)
	}
}

// TestBindRespectsQuotaAcrossPlacers is finding 7 of issue 11: two placers
// whose snapshots both show room under a quota each bind on their own node;
// together they would exceed the quota. The later bind must be refused:
// another placer bound against the same quota after the ledgers it read.
// Before the fix both committed and ada held 2 GPUs under a quota of 1.
func TestBindRespectsQuotaAcrossPlacers(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	nodes := s.addNodes(ctx, "gpu", 2, 8)
	one := int64(1)
	if _, err := state.Put(ctx, cli, s.k.UserQuota("ada"), state.Quota{GPUs: &one}); err != nil {
		t.Fatal(err)
	}
	ids := s.submit(ctx, "ada", []int{1, 1}, nil)
	p1 := New(cli, Config{ID: "p1", Logger: quietLogger()})
	p2 := New(cli, Config{ID: "p2", Logger: quietLogger()})
	for _, p := range []*Placer{p1, p2} {
		startCaches(t, p)
		eventually(t, 10e9, "the caches to see nodes, sessions and the quota", func() bool {
			return p.nodes.Len() == 2 && p.pending.Len() == 2 && p.quotas.Len() == 1
		})
	}
	// Diverging snapshots: each placer sees one of the two sessions, on
	// its own node, and room under the quota for it.
	plan1, snap1, nodes1 := planOn(t, p1, nodes[:1], ids[:1])
	plan2, snap2, nodes2 := planOn(t, p2, nodes[1:], ids[1:])
	if len(plan1.Bound) != 1 || len(plan2.Bound) != 1 {
		t.Fatalf("planned %d and %d, want 1 each", len(plan1.Bound), len(plan2.Bound))
	}
	if res := commitPlan(t, p2, plan2, snap2, nodes2); res.bound != 1 {
		t.Fatalf("p2 bound %d, want 1", res.bound)
	}
	if res := commitPlan(t, p1, plan1, snap1, nodes1); res.bound != 0 {
		t.Fatalf("p1 bound %d on ledgers older than p2's bind under the same quota, want the txn refused", res.bound)
	}
	w := s.read(ctx)
	held := 0
	for _, l := range w.ledgers {
		for _, a := range l.Allocations {
			if a.Owner == "ada" {
				held += len(a.GPUs)
			}
		}
	}
	if held != 1 {
		t.Fatalf("ada holds %d GPUs under a quota of 1", held)
	}
	// Planned again on ledgers that show p2's bind, p1 binds nothing more.
	eventually(t, 10e9, "p1's caches to see p2's bind", func() bool { return p1.ledgers.Len() == 1 })
	plan1, _, _ = planOn(t, p1, nil, nil)
	if len(plan1.Bound) != 0 || len(plan1.Waiting) != 1 || plan1.Waiting[0].Reason != "Quota" {
		t.Fatalf("re-plan: bound %d, waiting %+v; want the second session waiting for quota", len(plan1.Bound), plan1.Waiting)
	}
}

// TestNodeLossComparesStatus is finding 7 of issue 11: node-loss handling
// decides from the session's spec and status; a status written after it
// read them (an agent's final status) must refuse its transaction rather
// than be overwritten. Before the fix the transaction compared the node
// key and the ledger only and committed over the newer status.
func TestNodeLossComparesStatus(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	nodes := s.addNodes(ctx, "gpu", 1, 8)
	ids := s.submit(ctx, "ada", []int{1}, nil)
	p := New(cli, Config{ID: "p1", Logger: quietLogger()})
	startCaches(t, p)
	eventually(t, 10e9, "the caches to see the node and the session", func() bool { return p.nodes.Len() == 1 && p.pending.Len() == 1 })
	plan, snap, byName := planOn(t, p, nil, nil)
	if res := commitPlan(t, p, plan, snap, byName); res.bound != 1 {
		t.Fatalf("bound %d, want 1", res.bound)
	}
	s.killNode(ctx, nodes[0])
	ledger, rev, err := state.Get[state.Ledger](ctx, cli, s.k.Ledger(nodes[0]))
	if err != nil {
		t.Fatal(err)
	}
	others := map[string]*state.LedgerWrite{nodes[0]: {Node: nodes[0], ReadRevision: rev, Ledger: ledger}}
	ops, cmps, err := p.lostSessionOps(ctx, nodes[0], ids[0], others, time.Now().UTC())
	if err != nil {
		t.Fatal(err)
	}
	// The agent's last word lands between the read and the write.
	if _, err := state.Put(ctx, cli, s.k.Status(ids[0]), state.Status{Session: ids[0], Phase: state.PhaseSucceeded, Reason: "Exited"}); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		t.Fatal(err)
	}
	if resp.Succeeded {
		st, _, _ := state.Get[state.Status](ctx, cli, s.k.Status(ids[0]))
		t.Fatalf("node-loss write committed over a status it never read; status now %s %s", st.Phase, st.Reason)
	}
}
