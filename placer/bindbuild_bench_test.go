package placer

import (
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// bindBuildFixture is a placer without etcd and one batch as a burst
// commits it: the decisions of a plan over 16 8-GPU nodes packed as the placer packs them (the first batch) (about 36
// sessions of mixed sizes, the burst's transaction), on empty ledgers or
// on ledgers that an earlier bind of this placer half filled (laid over
// the caches as its own writes, as a placer sees them before its watch
// delivers them).
func bindBuildFixture(tb testing.TB, halfFull bool) (*Placer, *bindBatch, *watcher.Snapshot[state.Ledger], map[string]*NodeView, *Snapshot) {
	cfg := Config{ID: "placer-bench", Logger: quietLogger(), Now: func() time.Time { return t0 }}
	cfg.defaults()
	p := &Placer{cfg: cfg, log: cfg.Logger, own: newOwnWrites()}
	s := newPlanBenchSnapshot(16, 200)
	if halfFull {
		first := NewPlan(&Snapshot{Nodes: s.Nodes, Pending: s.Pending[:18], Now: s.Now}, PlanOptions{})
		s = filledSnapshot(s, first)
		var lws []state.LedgerWrite
		for _, v := range s.Nodes {
			if v.LedgerRevision != 0 {
				lws = append(lws, state.LedgerWrite{Node: v.Node.Name, Ledger: v.Ledger})
			}
		}
		p.own.record(lws, nil, 1<<20, nil)
	}
	plan := NewPlan(s, PlanOptions{})
	nodes := map[string]*NodeView{}
	for i := range s.Nodes {
		nodes[s.Nodes[i].Node.Name] = &s.Nodes[i]
	}
	// Packed as the placer packs them: the first transaction's worth.
	batches, _, _ := p.batch(plan.Bound, nodes, s)
	if len(batches) == 0 || len(batches[0].decisions) < 20 {
		tb.Fatalf("the plan's first batch is not a burst's batch of about 36 sessions")
	}
	b := batches[0]
	return p, b, new(watcher.Snapshot[state.Ledger]), nodes, s
}

// BenchmarkBindTxnBuild is the placer's CPU cost of building one bind
// transaction of a burst, without etcd: turning a batch's decisions into
// ledger writes, bindings and statuses (buildBatch) and those into the
// transaction's compares and operations (bindOps: the values encoded).
// Only what etcd's client then does with the operations (gRPC) is left
// out.
func BenchmarkBindTxnBuild(b *testing.B) {
	for _, halfFull := range []bool{false, true} {
		name := "empty-ledgers"
		if halfFull {
			name = "half-full-ledgers"
		}
		b.Run(name, func(b *testing.B) {
			p, batch, fresh, nodes, snap := bindBuildFixture(b, halfFull)
			var sessions, ledgers, opsN int
			b.ReportAllocs()
			for b.Loop() {
				t, stale := p.buildBatch(batch, fresh, nodes, snap, 0)
				if stale != 0 {
					b.Fatalf("%d decisions went stale on the state they were planned on", stale)
				}
				lws, _, ops, err := p.bindOps(&t)
				if err != nil {
					b.Fatal(err)
				}
				sessions, ledgers, opsN = len(t.ps), len(lws), len(ops)
			}
			b.ReportMetric(float64(sessions), "sessions/txn")
			b.ReportMetric(float64(ledgers), "ledgers/txn")
			b.ReportMetric(float64(opsN), "ops/txn")
		})
	}
}
