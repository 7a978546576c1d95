package placer

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/config"
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

// simOnEtcd starts a real etcd with a simulated cluster over it.
func simOnEtcd(t *testing.T) (*etcdtest.Cluster, *sim) {
	t.Helper()
	c := etcdtest.Start(t, etcdtest.Options{})
	return c, newSim(t, c.Client(t))
}

// byHand is one node of gpus GPUs, one 1-GPU session of ada and a placer
// whose caches (not its loop) run and show both: the test plans and
// commits by hand.
func byHand(t *testing.T, gpus int) (s *sim, node, id string, p *Placer) {
	t.Helper()
	_, s = simOnEtcd(t)
	ctx := context.Background()
	node = s.addNodes(ctx, "gpu", 1, gpus)[0]
	id = s.submit(ctx, "ada", []int{1}, nil)[0]
	p = New(s.cli, Config{ID: "p1", Logger: quietLogger()})
	startCaches(t, p)
	eventually(t, 10e9, "the caches to see the node and the session", func() bool { return p.nodes.Len() == 1 && p.pending.Len() == 1 })
	return s, node, id, p
}

// setQuota gives user a quota of gpus GPUs.
func (s *sim) setQuota(ctx context.Context, user string, gpus int64) {
	s.t.Helper()
	if _, err := state.Put(ctx, s.cli, s.k.UserQuota(user), state.Quota{GPUs: &gpus}); err != nil {
		s.t.Fatal(err)
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
	s, node, id, p := byHand(t, 1)
	cli, ctx, nodes, ids := s.cli, context.Background(), []string{node}, []string{id}

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
	commitAll(ctx, p, batches, byName, snapshot, &res)
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

// TestBindCommitsTheRestWhenAnotherTookASession: beside another sharded
// placer, a
// batch refused because another writer took one of its sessions (the other
// placer bound it on a plan of its own; its owner cancelled it) is
// committed again without that
// session, on the same compares: the rest binds, the session taken is
// neither bound nor in the ledger, and the refusal counts as a conflict.
func TestBindCommitsTheRestWhenAnotherTookASession(t *testing.T) {
	_, s := simOnEtcd(t)
	ctx := context.Background()
	node := s.addNodes(ctx, "gpu", 1, 8)[0]
	ids := s.submit(ctx, "ada", []int{1, 2, 1}, nil)
	// Another sharded placer is live: alone or active, a placer does not
	// read refusals back.
	if _, err := state.Put(ctx, s.cli, s.k.Placer("p2"), state.Placer{ID: "p2"}); err != nil {
		t.Fatal(err)
	}
	p := New(s.cli, Config{ID: "p1", Logger: quietLogger(), Sharded: true})
	startCaches(t, p)
	eventually(t, 10e9, "the caches to see the node, the sessions and the other placer", func() bool {
		return p.nodes.Len() == 1 && p.pending.Len() == 3 && p.placers.Len() == 1
	})

	snapshot := p.snapshot()
	plan := NewPlan(snapshot, PlanOptions{})
	if len(plan.Bound) != 3 {
		t.Fatalf("planned %d sessions, want 3", len(plan.Bound))
	}
	taken := ids[1]
	if _, err := s.cli.Delete(ctx, s.k.Pending(taken)); err != nil {
		t.Fatal(err)
	}
	byName := map[string]*NodeView{}
	for i := range snapshot.Nodes {
		byName[snapshot.Nodes[i].Node.Name] = &snapshot.Nodes[i]
	}
	batches, _, _ := p.batch(plan.Bound, byName, snapshot)
	if len(batches) != 1 {
		t.Fatalf("%d batches, want the three sessions in one", len(batches))
	}
	var res passResult
	commitAll(ctx, p, batches, byName, snapshot, &res)
	if res.bound != 2 || p.Stats().Conflicts != 1 {
		t.Fatalf("bound %d with %d conflicts, want the 2 sessions not taken bound after 1 refusal", res.bound, p.Stats().Conflicts)
	}
	l, _, err := state.Get[state.Ledger](ctx, s.cli, s.k.Ledger(node))
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := l.Allocations[taken]; ok || len(l.Allocations) != 2 {
		t.Fatalf("ledger holds %v, want %s and %s only", slices.Collect(maps.Keys(l.Allocations)), ids[0], ids[2])
	}
	for _, id := range []string{ids[0], ids[2]} {
		st, _, err := state.Get[state.Status](ctx, s.cli, s.k.Status(id))
		if err != nil || st.Phase != state.PhaseBound {
			t.Fatalf("status of %s: %+v (%v), want Bound", id, st, err)
		}
	}
	if resp, err := s.cli.Get(ctx, s.k.Binding(node, taken)); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("a binding of the session taken: %v (%v)", resp, err)
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
	commitAll(context.Background(), p, batches, nodes, snap, &res)
	return res
}

// TestBindRefusesLostNode is finding 7 of issue 11: a bind planned on a
// node whose lease expires before the commit must not commit (it would
// bind a session to a dead node and burn a restart when the node loss is
// handled). Before the fix the bind transaction compared the ledger only
// and committed.
func TestBindRefusesLostNode(t *testing.T) {
	s, node, _, p := byHand(t, 8)
	cli, ctx, nodes := s.cli, context.Background(), []string{node}
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

// TestBindRefusesNodeCordonedAfterPlan: a node cordoned (or drained) after
// the plan read it uncordoned must refuse the bind, as a lost node does;
// the decision "this node takes new sessions" was read from the cordon key,
// so the txn compares it. Before the compare, the bind committed and a
// session landed on a node its operator had just drained
// (TestDrainedNodeBatchRunsToCompletion in lifecycle/ saw it under load).
func TestBindRefusesNodeCordonedAfterPlan(t *testing.T) {
	s, node, _, p := byHand(t, 8)
	cli, ctx := s.cli, context.Background()
	plan, snap, byName := planOn(t, p, nil, nil)
	if len(plan.Bound) != 1 {
		t.Fatalf("planned %d, want 1", len(plan.Bound))
	}
	if _, err := state.Put(ctx, cli, s.k.Cordon(node), state.Cordon{Node: node, Since: time.Now().UTC(), Drain: true}); err != nil {
		t.Fatal(err)
	}
	if res := commitPlan(t, p, plan, snap, byName); res.bound != 0 {
		t.Fatalf("bound %d sessions on a node cordoned after planning, want the txn refused", res.bound)
	}
	if r, err := cli.Get(ctx, s.k.Ledger(node)); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("the cordoned node has a ledger (%v): the bind wrote it", err)
	}
}

// TestBindRespectsQuotaAcrossPlacers is finding 7 of issue 11: two placers
// whose snapshots both show room under a quota each bind on their own node;
// together they would exceed the quota. The later bind must be refused:
// another placer bound against the same quota after the ledgers it read.
// Before the fix both committed and ada held 2 GPUs under a quota of 1.
func TestBindRespectsQuotaAcrossPlacers(t *testing.T) {
	_, s := simOnEtcd(t)
	cli, ctx := s.cli, context.Background()
	nodes := s.addNodes(ctx, "gpu", 2, 8)
	s.setQuota(ctx, "ada", 1)
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
	eventually(t, 10e9, "p1's caches to see p2's bind", func() bool { return p1.ledgers.Len() == 1 && p1.pending.Len() == 1 })
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
	s, node, id, p := byHand(t, 8)
	cli, ctx, nodes, ids := s.cli, context.Background(), []string{node}, []string{id}
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

// TestPendingStatusesBeyondOneTxn is finding 3 of issue 11: 130 waiting
// sessions all get a reason and a queue position. Before the fix the
// statuses went out 128 nested transactions at a time, which etcd refuses
// (nested operations count against --max-txn-ops less the outer ones), so
// the first 128 never got one.
func TestPendingStatusesBeyondOneTxn(t *testing.T) {
	c, s := simOnEtcd(t)
	ctx := context.Background()
	s.addNodes(ctx, "gpu", 1, 8)
	sizes := make([]int, 130)
	for i := range sizes {
		sizes[i] = 16 // more than any node has: every one waits
	}
	ids := s.submit(ctx, "ada", sizes, nil)
	runPlacer(t, c.Server.Endpoint(), Config{})
	var w world
	eventually(t, 30e9, "every waiting session to get a reason and a position", func() bool {
		w = s.read(ctx)
		for _, id := range ids {
			if st := w.status[id]; st.Reason != "Unsatisfiable" || st.QueuePosition == 0 {
				return false
			}
		}
		return true
	})
	seen := map[int]bool{}
	for _, id := range ids {
		seen[w.status[id].QueuePosition] = true
	}
	if len(seen) != len(ids) {
		t.Errorf("%d distinct queue positions for %d sessions", len(seen), len(ids))
	}
}

// TestOversizeGangWaitsWithoutSpinning is finding 2 of issue 11: a Ray
// gang whose bind needs more operations than one transaction may hold (64
// workers, admitted before the API refused it) waits as Unsatisfiable with
// the limit named; the placer neither spins nor stops explaining, and
// binds other sessions meanwhile. Before the fix the gang was planned,
// deferred every pass, an empty batch was committed, the loop counted the
// deferral as progress and planned again at once, and no pending status
// was written at all.
func TestOversizeGangWaitsWithoutSpinning(t *testing.T) {
	c, s := simOnEtcd(t)
	ctx := context.Background()
	s.addNodes(ctx, "gpu", 66, 1)
	gang := s.submit(ctx, "ada", []int{1}, func(x *state.Session) { x.Ray = &state.Ray{Workers: 64} })[0]
	waiting := s.submit(ctx, "bob", []int{2}, nil)[0] // never fits a 1-GPU node
	p, _, _ := runPlacer(t, c.Server.Endpoint(), Config{})
	eventually(t, 30e9, "the gang and the 2-GPU session to be told why they wait", func() bool {
		w := s.read(ctx)
		g, o := w.status[gang], w.status[waiting]
		return g.Reason == "Unsatisfiable" && strings.Contains(g.Message, "VOYAGER_PLACER_MAX_TXN_OPS") &&
			strings.Contains(g.Message, "at most 41 workers") && o.Reason == "Unsatisfiable"
	})
	passes := p.Stats().Passes
	// Another session still binds, in a handful of passes, not thousands.
	small := s.submit(ctx, "eve", []int{1}, nil)[0]
	eventually(t, 30e9, "a 1-GPU session to bind beside the waiting gang", func() bool {
		return s.read(ctx).status[small].Phase == state.PhaseBound
	})
	if n := p.Stats().Passes - passes; n > 20 {
		t.Errorf("%d passes to bind one session beside the gang: the placer spins", n)
	}
	if w := s.read(ctx); len(w.bindings[gang]) != 0 || !w.pending[gang] {
		t.Errorf("the gang was bound or dequeued: %d bindings", len(w.bindings[gang]))
	}
}

// stallKV is a KV whose transactions block until their context ends: an
// etcd write that hangs (a leader change, a partition).
type stallKV struct {
	clientv3.KV
	entered chan struct{} // gets a value each time a write starts stalling
}

func (s *stallKV) Txn(ctx context.Context) clientv3.Txn {
	return &stallTxn{Txn: s.KV.Txn(ctx), ctx: ctx, s: s}
}

type stallTxn struct {
	clientv3.Txn
	ctx context.Context
	s   *stallKV
}

func (t *stallTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *stallTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *stallTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *stallTxn) Commit() (*clientv3.TxnResponse, error) {
	select {
	case t.s.entered <- struct{}{}:
	default:
	}
	<-t.ctx.Done()
	return nil, t.ctx.Err()
}

// TestStalledAdvisoryWriteDoesNotDelayBinds is finding 11 of issue 11: a
// pending-status write that hangs must not hold up binding. Before the fix
// the statuses were written inside the pass with no deadline: the next
// pass, and every bind, waited for the hung write.
func TestStalledAdvisoryWriteDoesNotDelayBinds(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	s := newSim(t, cli)
	s.addNodes(ctx, "gpu", 1, 1)
	s.submit(ctx, "ada", []int{2}, nil) // waits: its status write stalls
	stall := &stallKV{KV: cli, entered: make(chan struct{}, 1)}
	p := New(cli, Config{Logger: quietLogger(), AdvisoryTimeout: time.Hour})
	p.advisoryKV = stall
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	select {
	case <-stall.entered:
	case <-time.After(30 * time.Second):
		t.Fatal("no pending status write started")
	}
	small := s.submit(ctx, "bob", []int{1}, nil)[0]
	eventually(t, 30e9, "a session to bind while a status write hangs", func() bool {
		return s.read(ctx).status[small].Phase == state.PhaseBound
	})
}

// TestMaxSessionsPerNode is finding 8 of issue 11: a node holds at most
// MaxSessionsPerNode sessions, in the plan and in the bind's re-check, and
// a session that finds every node full says so. Before the fix nothing
// bounded the sessions on a node (its ledger, one etcd value, grew without
// limit).
func TestMaxSessionsPerNode(t *testing.T) {
	n := view(gpuNode("n1", 8, "A100"))
	var pending []Pending
	for _, id := range []string{"a", "b", "c"} {
		p := req(id, "ada", 0, time.Minute)
		pending = append(pending, p)
	}
	plan := NewPlan(snap([]NodeView{n}, pending...), PlanOptions{MaxSessionsPerNode: 2})
	if len(plan.Bound) != 2 || len(plan.Waiting) != 1 {
		t.Fatalf("bound %d, waiting %d; want 2 and 1", len(plan.Bound), len(plan.Waiting))
	}
	if w := plan.Waiting[0]; w.Reason != "Capacity" || !strings.Contains(w.Message, "holds its maximum of 2 sessions") {
		t.Errorf("waiting: %s %q", w.Reason, w.Message)
	}
	full := holding(holding(view(gpuNode("n1", 8, "A100")), "x", "ada", 1), "y", "ada", 0)
	a := state.Allocation{Owner: "ada", CPUMilli: 100, MemoryMiB: 64}
	if err := refit(&full.Node, &full.Ledger, "z", &a, 2); err == nil || !strings.Contains(err.Error(), "maximum of 2") {
		t.Errorf("refit on a full node: %v", err)
	}
}

// TestLedgerSizeBound is finding 8 of issue 11: a node's ledger at the most
// sessions a node may hold, each the largest allocation the API admits
// (longest owner, team and session id, a kilobyte of groups, ports), with every
// device of a node of 8 GPUs split into 7 MIG devices allocated, stays
// under half of etcd's 1.5 MiB request limit, and a bind batch that
// writes it fits one transaction's byte budget.
func TestLedgerSizeBound(t *testing.T) {
	l := state.Ledger{Node: strings.Repeat("n", 63), Allocations: map[string]state.Allocation{}}
	var groups []string
	for n := 2; n+3+24 <= 1024; n += 3 + 24 { // as the API counts them
		groups = append(groups, strings.Repeat("g", 23)+string(rune('a'+len(groups)%26)))
	}
	const devices = 8 * 7
	for i := 0; i < config.MaxSessionsPerNodeLimit; i++ {
		a := state.Allocation{Kind: state.KindNotebook, Owner: strings.Repeat("o", 128), Groups: groups, Team: strings.Repeat("t", 63), Priority: -100,
			Preemptible: true, Role: state.RoleHead, CPUMilli: 1 << 40, MemoryMiB: 1 << 40, Ports: []int{65531, 65532, 65533, 65534},
			Plan: math.MaxInt64, Queued: time.Date(2026, 11, 23, 9, 14, 7, 123456789, time.FixedZone("", -(9*3600+30*60)))}
		if i < devices {
			a.GPUs = []string{fmt.Sprintf("MIG-%08x-aaaa-bbbb-cccc-%012x", i, i)}
		}
		l.Allocations[fmt.Sprintf("s%018d", i)] = a
	}
	v, err := state.Encode(l)
	if err != nil {
		t.Fatal(err)
	}
	if limit := 1536 << 10; len(v) > limit/2 {
		t.Fatalf("a full ledger takes %d bytes, more than half of etcd's %d", len(v), limit)
	}
	if est := ledgerBytes(&l); est < len(v) {
		t.Errorf("the batch estimate of the ledger, %d bytes, is below its size %d", est, len(v))
	}
	if len(v)+statusBytes+bindingBytes > state.DefaultMaxTxnBytes {
		t.Errorf("a bind on a full ledger (%d bytes) exceeds the txn byte budget", len(v))
	}
	t.Logf("largest ledger: %d bytes for %d sessions", len(v), config.MaxSessionsPerNodeLimit)
}

// TestBatchNeverEmptyNorDeferredForever is finding 2 of issue 11 at the
// batching step: with a budget of 8 operations, a gang of four nodes fits
// no transaction even alone. It is returned as unfit (it waits with the
// limit named) rather than deferred, and no empty batch is produced for it.
// Before the fix batch opened a batch for it, deferred it, and returned the
// empty batch, which commit sent as an empty transaction that counted as
// progress.
func TestBatchNeverEmptyNorDeferredForever(t *testing.T) {
	p := New(nil, Config{MaxTxnOps: 8, Logger: quietLogger()})
	var nodes []NodeView
	for i := 0; i < 5; i++ {
		nodes = append(nodes, view(gpuNode(fmt.Sprintf("n%d", i), 8, "A100")))
	}
	gang := req("gang", "ada", 1, time.Minute)
	gang.Entry.Workers = 3
	single := req("one", "bob", 1, 0)
	s := snap(nodes, gang, single)
	plan := NewPlan(s, PlanOptions{MaxTxnOps: 128})
	if len(plan.Bound) != 2 {
		t.Fatalf("planned %d, want both (the planner's limit is 128)", len(plan.Bound))
	}
	byName := map[string]*NodeView{}
	for i := range s.Nodes {
		byName[s.Nodes[i].Node.Name] = &s.Nodes[i]
	}
	batches, deferred, unfit := p.batch(plan.Bound, byName, s)
	if len(unfit) != 1 || unfit[0].Pending.Entry.Session != "gang" {
		t.Fatalf("unfit %v, want the gang", unfit)
	}
	if deferred {
		t.Error("deferred: the gang would be planned again every pass")
	}
	for _, b := range batches {
		if len(b.decisions) == 0 {
			t.Error("an empty batch")
		}
		if !p.budget().Fits(b.size) {
			t.Errorf("a batch of %s exceeds the budget", b.size)
		}
	}
	if len(batches) != 1 || batches[0].decisions[0].Pending.Entry.Session != "one" {
		t.Errorf("batches %+v, want one with the single session", batches)
	}
	if got := MaxRayWorkers(8, 0); got != 1 {
		t.Errorf("MaxRayWorkers(8) = %d, want 1 (2 nodes: 7 compares, 6 writes)", got)
	}
}

// TestQuotaGuardKeepsBatchesParallel checks that guarding a quota costs a
// placer no throughput among its own batches: a user under a quota with
// sessions spread over many batches of one pass binds them all without a
// conflict (the batches write the placer's own usage mark, which its own
// binds do not compare).
func TestQuotaGuardKeepsBatchesParallel(t *testing.T) {
	c, s := simOnEtcd(t)
	ctx := context.Background()
	s.addNodes(ctx, "gpu", 24, 1)
	s.setQuota(ctx, "ada", 100)
	sizes := make([]int, 24)
	for i := range sizes {
		sizes[i] = 1
	}
	ids := s.submit(ctx, "ada", sizes, nil)
	// 16 operations: a few sessions (each on its own node) per batch; one
	// batch in flight at a time, so later batches start after earlier
	// ones of the same pass committed.
	p, _, _ := runPlacer(t, c.Server.Endpoint(), Config{MaxTxnOps: 16, Parallel: 1})
	eventually(t, 30e9, "every session to bind", func() bool {
		w := s.read(ctx)
		for _, id := range ids {
			if w.status[id].Phase != state.PhaseBound {
				return false
			}
		}
		return true
	})
	st := p.Stats()
	if st.Txns < 6 {
		t.Errorf("%d transactions: the test meant many batches", st.Txns)
	}
	if st.Conflicts != 0 {
		t.Errorf("%d conflicts among one placer's own batches under a quota", st.Conflicts)
	}
	if err := s.read(ctx).check(1); err != nil {
		t.Fatal(err)
	}
}

// commitAll commits batches, planned on snap, as a pass does, and waits.
func commitAll(ctx context.Context, p *Placer, batches []*bindBatch, nodes map[string]*NodeView, snap *Snapshot, res *passResult) {
	c := p.newCommitter(ctx, nodes, snap, res)
	for _, b := range batches {
		c.send(b, nil)
	}
	c.wait()
}
