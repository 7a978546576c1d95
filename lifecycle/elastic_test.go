package lifecycle

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// TestElasticShrinksBeforePreemption: an elastic job shrinks for a waiting
// higher-priority session that a preemption of fixed-size work would also
// serve, and the fixed-size job is never warned; the shrink is a restart
// through Pending (Resized) at the new size; and the rate limit keeps the
// job at that size when GPUs sit idle again.
func TestElasticShrinksBeforePreemption(t *testing.T) {
	c := newChain(t, ControllerConfig{PreemptGrace: 300 * time.Millisecond, ResizeInterval: time.Hour})
	c.submit("fixed", 4, 0, true, func(s *state.Session) { s.Owner = "bob" })
	c.running("fixed")
	c.submit("el", 2, 0, false, func(s *state.Session) { s.Elastic = &state.Elastic{Min: 2, Max: 8} })
	if st := c.running("el"); st.Elastic == nil || st.Elastic.Size != 4 {
		t.Fatalf("el bound at %+v, want its fair 4 of 2-8 beside bob's 4", st.Elastic)
	}
	statuses := c.watchStatus("el")
	// Any warning of the fixed job, even one withdrawn at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	fixedWarned := make(chan string, 16)
	wch := c.cli.Watch(ctx, keys.Warning("fixed"))
	go func() {
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Kv.Version > 0 {
					fixedWarned <- string(ev.Kv.Value)
				}
			}
		}
	}()
	c.submit("vip", 2, 10, false, func(s *state.Session) { s.Owner = "carol" })
	w, _ := waitKey(c.t, c.cli, keys.Warning("el"), "el's resize warning", func(w state.Warning, found bool) bool { return found })
	if w.Reason != state.ReasonResized || w.Size != 2 || w.By != "vip" {
		t.Fatalf("el's warning %+v; want a resize to 2 for vip", w)
	}
	c.running("vip")
	st := c.status("el", "running again at 2", func(st state.Status) bool {
		return st.Phase == state.PhaseRunning && st.Elastic != nil && st.Elastic.Size == 2
	})
	if st.Elastic.Resizes != 1 || st.Elastic.Resized == nil || st.Elastic.Why == "" {
		t.Errorf("el's status after the shrink: %+v", st.Elastic)
	}
	sawResized := false
	for _, s := range statuses() {
		if s.Phase == state.PhasePending && s.Reason == state.ReasonResized {
			sawResized = true
		}
	}
	if !sawResized {
		t.Error("el never waited Pending (Resized): the resize was no restart through the state machine")
	}
	select {
	case w := <-fixedWarned:
		t.Errorf("the fixed-size job was warned (%s): a shrink comes before any preemption", w)
	default:
	}
	if got := c.ctl.Stats(); got.Resized != 1 || got.Preempted != 0 || got.Warned != 1 {
		t.Errorf("stats %+v; want 1 warning (the resize's), 1 resize, no preemption", got)
	}
	// vip ends: 2 GPUs sit idle, but el resized less than an hour ago.
	c.finish("vip", 0)
	c.status("vip", "ended", func(st state.Status) bool { return st.Phase.Terminal() })
	until := c.ctl.passes() + 20
	waitKey(c.t, c.cli, keys.Status("el"), "20 more controller passes", func(state.Status, bool) bool { return c.ctl.passes() >= until })
	if warned(t, c.cli, "el") {
		t.Error("el was warned of another resize within its rate limit")
	}
	if st, _, _ := state.Get[state.Status](context.Background(), c.cli, keys.Status("el")); st.Elastic == nil || st.Elastic.Size != 2 {
		t.Errorf("el after the idle passes: %+v", st.Elastic)
	}
}

// TestResizeWarningComparesWhatItRead: a resize's warning is written only
// while the job's warning is absent and its spec, its node's ledger and
// (for a shrink) the waiter's queue entry are at the revisions the plan
// read (a grow: also the specs of the jobs it read between binds); any of
// them moved, the transaction refuses it and nothing is written.
func TestResizeWarningComparesWhatItRead(t *testing.T) {
	// A controller that is not running: its transaction alone decides
	// (a running one would withdraw a warning no plan stands behind).
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	ctl := NewController(cli, ControllerConfig{ResizeInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx := context.Background()
	put := func(key string) int64 {
		t.Helper()
		resp, err := cli.Put(ctx, key, `{}`)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Header.Revision
	}
	specRev := put(keys.Session("el-cmp"))
	ledgerKey := keys.Ledger("node-cmp")
	ledgerRev := put(ledgerKey)
	ledger2Rev := put(keys.Ledger("node-cmp2"))
	forRev := put(keys.Pending("vip-cmp"))
	claimRev := put(keys.Session("claim-cmp"))
	betweenRev := put(keys.Session("between-cmp"))
	between := map[string]int64{"between-cmp": betweenRev}
	r := placer.Resize{Session: "el-cmp", Node: "node-cmp", From: 4, To: 2, For: "vip-cmp", ForRevision: forRev, Why: "vip-cmp is owed 2 GPUs"}
	v := &view{now: time.Now()}
	warned := func() bool {
		t.Helper()
		resp, err := cli.Get(ctx, keys.Warning("el-cmp"))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Count > 0
	}
	refused := func(what string, specRev, ledgerRev int64, r placer.Resize) {
		t.Helper()
		before := ctl.conflicts.Load()
		if err := ctl.warnResize(ctx, v, r, map[string]int64{"el-cmp": specRev, "claim-cmp": claimRev}, map[string]int64{"node-cmp": ledgerRev, "node-cmp2": ledger2Rev}, between); err != nil {
			t.Fatal(err)
		}
		if warned() {
			t.Fatalf("%s: the resize warning was written", what)
		}
		if ctl.conflicts.Load() != before+1 {
			t.Errorf("%s: no conflict counted", what)
		}
	}
	refused("spec moved since the plan read it", specRev-1, ledgerRev, r)
	refused("ledger moved since the plan read it", specRev, ledgerRev-1, r)
	stale := r
	stale.ForRevision = forRev - 1
	refused("waiter's queue entry moved since the plan read it", specRev, ledgerRev, stale)
	// A range of machines: every ledger the decision read is compared.
	nodes := r
	nodes.Nodes, nodes.Ledgers, nodes.From, nodes.To = true, []string{"node-cmp", "node-cmp2"}, 3, 2
	ledger2Rev--
	refused("a second node's ledger moved since the plan read it", specRev, ledgerRev, nodes)
	ledger2Rev++
	// A grow that counted another job's claim on its node (a resize of
	// claim-cmp under way): refused when that job's spec moved, or when it
	// is queued again, since the plan read them.
	grow := placer.Resize{Session: "el-cmp", Node: "node-cmp", From: 2, To: 4, Claims: []string{"claim-cmp"}, Why: "grows beside claim-cmp's claim"}
	claimRev--
	refused("a claim's spec moved since the plan read it", specRev, ledgerRev, grow)
	claimRev++
	put(keys.Pending("claim-cmp"))
	refused("a claim's job queued again since the plan read it", specRev, ledgerRev, grow)
	if _, err := cli.Delete(ctx, keys.Pending("claim-cmp")); err != nil {
		t.Fatal(err)
	}
	// A grow that read a job between binds with no claim (its release
	// and its warning's deletion seen, its eviction not): refused once
	// that job's spec moved. A shrink does not compare it (below).
	between["between-cmp"] = betweenRev - 1
	refused("a job between binds moved since the plan read it", specRev, ledgerRev, grow)
	between["between-cmp"] = betweenRev
	if err := ctl.warnResize(ctx, v, grow, map[string]int64{"el-cmp": specRev, "claim-cmp": claimRev}, map[string]int64{"node-cmp": ledgerRev, "node-cmp2": ledger2Rev}, between); err != nil {
		t.Fatal(err)
	}
	if !warned() {
		t.Fatal("a grow with everything as read was refused")
	}
	if _, err := cli.Delete(ctx, keys.Warning("el-cmp")); err != nil {
		t.Fatal(err)
	}
	between["between-cmp"] = betweenRev - 1
	if err := ctl.warnResize(ctx, v, r, map[string]int64{"el-cmp": specRev, "claim-cmp": claimRev}, map[string]int64{"node-cmp": ledgerRev, "node-cmp2": ledger2Rev}, between); err != nil {
		t.Fatal(err)
	}
	if !warned() {
		t.Fatal("with everything as read, no resize warning was written")
	}
	first, err := cli.Get(ctx, keys.Warning("el-cmp"))
	if err != nil {
		t.Fatal(err)
	}
	before := ctl.conflicts.Load()
	if err := ctl.warnResize(ctx, v, r, map[string]int64{"el-cmp": specRev, "claim-cmp": claimRev}, map[string]int64{"node-cmp": ledgerRev, "node-cmp2": ledger2Rev}, between); err != nil {
		t.Fatal(err)
	}
	again, err := cli.Get(ctx, keys.Warning("el-cmp"))
	if err != nil {
		t.Fatal(err)
	}
	if again.Kvs[0].ModRevision != first.Kvs[0].ModRevision || ctl.conflicts.Load() != before+1 {
		t.Error("a second resize warning was written over the one that stands")
	}
}

// TestResizeWarningFitsOneTransaction: a resize whose transaction would
// compare more than etcd's --max-txn-ops allows (a grow that saw many jobs
// between binds, a shrink over many machines) is not sent, so etcd never
// refuses it with an error; with one compare fewer it is written.
func TestResizeWarningFitsOneTransaction(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	ctl := NewController(cli, ControllerConfig{ResizeInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx := context.Background()
	v := &view{now: time.Now()}
	specs := map[string]int64{"el-big": 0}
	ledgers := map[string]int64{"node-big": 0}
	// A grow compares the warning, the spec, the ledger and every job
	// between binds: 3 + n, so n = 125 fills etcd's default of 128.
	between := func(n int) map[string]int64 {
		m := map[string]int64{}
		for i := range n {
			m[fmt.Sprintf("between-%03d", i)] = 0
		}
		return m
	}
	// A shrink over a range of machines compares the warning, the spec,
	// every ledger and the waiter's queue entry: 3 + n.
	shrink := func(n int) placer.Resize {
		r := placer.Resize{Session: "el-big", Node: "node-000", Nodes: true, From: n, To: n - 1, For: "vip-big", Why: "vip-big is owed a node"}
		for i := range n {
			name := fmt.Sprintf("node-%03d", i)
			r.Ledgers = append(r.Ledgers, name)
			ledgers[name] = 0
		}
		return r
	}
	grow := placer.Resize{Session: "el-big", Node: "node-big", From: 2, To: 4, Why: "grows into idle GPUs"}
	for _, c := range []struct {
		name    string
		r       placer.Resize
		between map[string]int64
		written bool
	}{
		{"a grow over 126 jobs between binds", grow, between(126), false},
		{"a shrink over 126 machines", shrink(126), nil, false},
		{"a grow over 125 jobs between binds", grow, between(125), true},
		{"a shrink over 125 machines", shrink(125), nil, true},
	} {
		if err := ctl.warnResize(ctx, v, c.r, specs, ledgers, c.between); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		resp, err := cli.Delete(ctx, keys.Warning("el-big"))
		if err != nil {
			t.Fatal(err)
		}
		if written := resp.Deleted > 0; written != c.written {
			t.Errorf("%s: warning written %v, want %v", c.name, written, c.written)
		}
	}
}

// TestResizeSpecOfARangeOfMachines: a resize's eviction records, in the
// spec of a job over a range of machines, the count it runs on next
// (Elastic.Nodes, its next queue entry's cap), never a count outside
// MinNodes to MaxNodes, and leaves a range of GPUs' size alone.
func TestResizeSpecOfARangeOfMachines(t *testing.T) {
	at := time.Date(2026, 11, 29, 7, 0, 0, 0, time.UTC)
	spec := func() state.Session {
		return state.Session{ID: "el", Kind: state.KindBatch, Nodes: 3, Resources: state.Resources{GPUs: 2},
			Elastic: &state.Elastic{MinNodes: 1, MaxNodes: 3, Nodes: 3, Resizes: 1}}
	}
	s := spec()
	ev := &state.Eviction{Reason: state.ReasonResized, At: at, Requeue: true}
	if !resizeSpec(&s, state.Warning{Reason: state.ReasonResized, Size: 2, Message: "for carol"}, ev) {
		t.Fatal("a resize to 2 of 1-3 machines refused")
	}
	if el := s.Elastic; el.Nodes != 2 || el.Size != 0 || el.Resizes != 2 || el.Resized == nil || !el.Resized.Equal(at) || el.Why != "for carol" || ev.Message != "resized to 2 nodes" {
		t.Errorf("spec after the resize: %+v, eviction %q", *el, ev.Message)
	}
	if q := state.NewQueueEntry(s, at); q.Workers != 1 || q.Nodes != 3 {
		t.Errorf("its next queue entry: workers %d nodes %d, want 1 and 3 (two parts, a multi-node job's ports)", q.Workers, q.Nodes)
	}
	for _, size := range []int{0, 4} {
		s := spec()
		if resizeSpec(&s, state.Warning{Reason: state.ReasonResized, Size: size}, &state.Eviction{At: at}) || s.Elastic.Nodes != 3 {
			t.Errorf("a resize to %d of 1-3 machines was recorded: %+v", size, *s.Elastic)
		}
	}
	if msg := resizedMessage(s); msg != "re-queued to run on 2 nodes (resize 2): for carol" {
		t.Errorf("re-queued message %q", msg)
	}
}

// TestResizeReadsTheLedgersItsPassBegan: a pass evicts job a for its grow
// from 2 GPUs to 6, and a's agent releases it before the pass plans
// resizes (as an agent under no load does within milliseconds). The plan
// reads the ledgers as the pass began, with a holding 2 at its target of 6,
// so job b beside it on the 8-GPU node does not grow into a's room; a plan
// that read the ledgers after the release, while the pass's view still
// showed a holding (so no claim of its), grew b to 8 and left a nothing
// (TestGoodputSteersGrows failed so under CI's load).
func TestResizeReadsTheLedgersItsPassBegan(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	now := time.Now().UTC()
	put := func(key string, v any) {
		t.Helper()
		val, err := state.Encode(v)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Put(ctx, key, val); err != nil {
			t.Fatal(err)
		}
	}
	const name = "gpu-skew"
	node := state.Node{Name: name, CPUMilli: 64000, MemoryMiB: 1 << 18, Ports: state.PortRange{First: 40000, Last: 40999}, Simulated: true, Registered: now}
	for g := range 8 {
		node.GPUs = append(node.GPUs, state.GPU{Index: g, UUID: fmt.Sprintf("GPU-skew-%d", g), Model: "A100", MemoryMiB: 81920, Healthy: true})
	}
	put(keys.Node(name), node)
	ledger := state.Ledger{Node: name, Allocations: map[string]state.Allocation{}}
	started := now.Add(-time.Minute)
	for i, id := range []string{"a", "b"} {
		s := state.Session{ID: id, Owner: "user-" + id, Kind: state.KindBatch, Command: []string{"train"},
			Resources: state.Resources{GPUs: 2, CPUMilli: 1000, MemoryMiB: 1024}, Desired: state.DesiredRunning, Created: started,
			Elastic: &state.Elastic{Min: 2, Max: 8, Size: 2}}
		put(keys.Session(id), s)
		put(keys.Status(id), state.Status{Session: id, Phase: state.PhaseRunning, Reason: "Started", Nodes: []string{name},
			Created: started, Updated: started, Bound: &started, Started: &started, Elastic: &state.Elastic{Min: 2, Max: 8, Size: 2}})
		ledger.Allocations[id] = state.Allocation{Kind: state.KindBatch, Owner: s.Owner, Role: state.RoleSingle,
			GPUs: []string{node.GPUs[2*i].UUID, node.GPUs[2*i+1].UUID}, CPUMilli: 1000, MemoryMiB: 1024}
	}
	put(keys.Ledger(name), ledger)
	// a's grow was warned; its notice is over: this pass evicts it.
	put(keys.Warning("a"), state.Warning{Session: "a", Reason: state.ReasonResized, Issued: now.Add(-time.Second), StopAt: now.Add(-time.Millisecond),
		Node: name, Size: 6, Message: "resize: it grows from 2 to 6 GPUs"})

	ctl := NewController(cli, ControllerConfig{Keys: keys, ResizeInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, cache := range ctl.caches() {
		go func() { _ = cache.Run(ctx) }()
	}
	for _, cache := range ctl.caches() {
		if err := cache.WaitSynced(ctx); err != nil {
			t.Fatal(err)
		}
	}
	released := false
	ctl.beforeResize = func() {
		// a's agent releases it, and the controller's ledger cache sees
		// the release, before the pass plans resizes.
		l := state.Ledger{Node: name, Allocations: map[string]state.Allocation{"b": ledger.Allocations["b"]}}
		put(keys.Ledger(name), l)
		wctx, wcancel := context.WithTimeout(ctx, 10*time.Second)
		defer wcancel()
		for {
			if it, ok := ctl.ledgers.Get(keys.Ledger(name)); ok && len(it.Allocations) == 1 {
				released = true
				return
			}
			select {
			case <-wctx.Done():
				t.Error("the controller's ledger cache never showed a's release")
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	if err := ctl.Pass(ctx); err != nil {
		t.Fatal(err)
	}
	if !released {
		t.Fatal("the pass planned no resize after a's release")
	}
	spec, _, err := state.Get[state.Session](ctx, cli, keys.Session("a"))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Eviction == nil || spec.Elastic == nil || spec.Elastic.Size != 6 {
		t.Fatalf("a after the pass: eviction %+v, elastic %+v; want evicted for its resize to 6", spec.Eviction, spec.Elastic)
	}
	if warned(t, cli, "b") {
		w, _, _ := state.Get[state.Warning](ctx, cli, keys.Warning("b"))
		t.Errorf("b was warned (%s) into the room a's resize claims", w.Message)
	}
}
