package lifecycle

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/benchsum"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// populate writes a cluster of nodes×8 GPUs full of running 1-GPU
// sessions (notebooks active now, preemptible batch jobs at priority 0),
// and waiting sessions that fit nowhere, in large transactions.
func populate(b *testing.B, cli *clientv3.Client, nodes, waiting int) {
	ctx := context.Background()
	now := time.Now().UTC()
	var ops []clientv3.Op
	flush := func() {
		if len(ops) > 0 {
			if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				b.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	put := func(key string, v any) {
		s, err := state.Encode(v)
		if err != nil {
			b.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(key, s))
		if len(ops) >= 120 {
			flush()
		}
	}
	for n := 0; n < nodes; n++ {
		name := fmt.Sprintf("gpu-%04d", n)
		node := state.Node{Name: name, CPUMilli: 128000, MemoryMiB: 1 << 20, Ports: state.PortRange{First: 40000, Last: 40999}, Simulated: true, Registered: now}
		l := state.Ledger{Node: name, Allocations: map[string]state.Allocation{}}
		for g := 0; g < 8; g++ {
			uuid := fmt.Sprintf("GPU-%s-%d", name, g)
			node.GPUs = append(node.GPUs, state.GPU{Index: g, UUID: uuid, Model: "A100", MemoryMiB: 81920, Healthy: true})
			id := fmt.Sprintf("r%04d%d", n, g)
			kind := state.KindNotebook
			if g%2 == 1 {
				kind = state.KindBatch
			}
			s := state.Session{ID: id, Owner: fmt.Sprintf("u%d", n%50), Kind: kind, Preemptible: kind == state.KindBatch,
				Resources: state.Resources{GPUs: 1, CPUMilli: 1000, MemoryMiB: 1024}, Desired: state.DesiredRunning, Created: now.Add(-time.Hour)}
			started := now.Add(-30 * time.Minute)
			put(keys.Session(id), s)
			put(keys.Status(id), state.Status{Session: id, Phase: state.PhaseRunning, Nodes: []string{name}, Created: s.Created, Updated: started, Started: &started,
				Activity: &state.Activity{LastActive: now, Sampled: now}})
			l.Allocations[id] = state.Allocation{Kind: kind, Owner: s.Owner, Preemptible: s.Preemptible, Role: state.RoleSingle, GPUs: []string{uuid}, CPUMilli: 1000, MemoryMiB: 1024}
		}
		put(keys.Node(name), node)
		put(keys.Ledger(name), l)
	}
	for i := 0; i < waiting; i++ {
		id := fmt.Sprintf("w%05d", i)
		s := state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Resources: state.Resources{GPUs: 8, CPUMilli: 1000, MemoryMiB: 1024},
			Priority: 10, Desired: state.DesiredRunning, Created: now}
		put(keys.Session(id), s)
		put(keys.Pending(id), state.NewQueueEntry(s, now))
		put(keys.Status(id), state.NewStatus(s, now))
	}
	flush()
}

// BenchmarkControllerPass measures one pass of the lifecycle rules over
// 1,000 full 8-GPU nodes (8,000 running sessions, half of them
// preemptible) with 1,000 higher-priority requests that fit nowhere (16
// GPUs: preemption can never help, so every pass plans the queue and
// preempts nobody). Reported beside it: one placer.NewPlan over the same
// snapshot, the part of a pass every placer also pays.
func BenchmarkControllerPass(b *testing.B) {
	cli := etcdtest.Start(b, etcdtest.Options{}).Client(b)
	populate(b, cli, 1000, 1000)
	c := NewController(cli, ControllerConfig{Keys: keys, IdleTimeout: 2 * time.Hour, MaxRuntime: 24 * time.Hour,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, cache := range c.caches() {
		go func() { _ = cache.Run(ctx) }()
	}
	for _, cache := range c.caches() {
		if err := cache.WaitSynced(ctx); err != nil {
			b.Fatal(err)
		}
	}
	if err := c.Pass(ctx); err != nil {
		b.Fatal(err)
	}
	if s := c.Stats(); s.Warned != 0 || s.Evicted != 0 {
		b.Fatalf("a steady cluster was acted on: %+v", s)
	}
	snap := placer.SnapshotOf(keys, placer.Caches{Nodes: c.nodes.Snapshot(), Ledgers: c.ledgers.Snapshot(), Cordons: c.cordons.Snapshot(),
		Quotas: c.quotas.Snapshot(), Pending: c.pending.Snapshot(), Warnings: c.warnings.Snapshot()}, time.Now())
	var planNS int64
	for i := 0; i < 5; i++ {
		t0 := time.Now()
		placer.NewPlan(snap, placer.PlanOptions{})
		planNS += time.Since(t0).Nanoseconds()
	}
	b.ResetTimer()
	t0 := time.Now()
	for b.Loop() {
		if err := c.Pass(ctx); err != nil {
			b.Fatal(err)
		}
	}
	per := time.Since(t0).Nanoseconds() / int64(b.N)
	b.ReportMetric(float64(planNS/5)/1e6, "newplan-ms")
	b.ReportMetric(float64(per)/float64(planNS/5), "pass/newplan")
	benchsum.Add(b, benchsum.Row{Figure: "lifecycle controller pass, 1k nodes",
		Value: float64(per) / 1e6, Unit: "ms", Ceiling: float64(planNS/5) / 1e6, CeilingName: "one NewPlan of the same snapshot"})
}
