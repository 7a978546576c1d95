package placer

import (
	"context"
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// settled reports whether the world's queue is stable: a fresh plan of
// what is in etcd would bind nothing more.
func (s *sim) settled(ctx context.Context, opt PlanOptions) (bool, world) {
	return s.settledAt(ctx, opt, time.Now())
}

// settledAt is settled for placers whose clock reads now.
func (s *sim) settledAt(ctx context.Context, opt PlanOptions, now time.Time) (bool, world) {
	plan, w := s.planAt(ctx, opt, now)
	return len(plan.Bound) == 0, w
}

// planAt is a fresh plan of what is in etcd for placers whose clock
// reads now, and the world it was made from.
func (s *sim) planAt(ctx context.Context, opt PlanOptions, now time.Time) (*Plan, world) {
	w := s.read(ctx)
	snap := &Snapshot{Now: now}
	resp, err := s.cli.Get(ctx, s.k.Nodes(), clientv3.WithPrefix())
	if err != nil {
		s.t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		n, _ := state.Decode[state.Node](kv.Value)
		v := NodeView{Node: n, Ledger: w.ledgers[n.Name]}
		if v.Ledger.Allocations == nil {
			v.Ledger.Allocations = map[string]state.Allocation{}
		}
		snap.Nodes = append(snap.Nodes, v)
	}
	pr, err := s.cli.Get(ctx, s.k.PendingDir(), clientv3.WithPrefix())
	if err != nil {
		s.t.Fatal(err)
	}
	for _, kv := range pr.Kvs {
		e, _ := state.Decode[state.QueueEntry](kv.Value)
		snap.Pending = append(snap.Pending, Pending{Entry: &e, Revision: kv.ModRevision})
	}
	return NewPlan(snap, opt), w
}

func TestPlacerBindsAndExplainsWaiting(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	s.addNodes(ctx, "gpu", 3, 8)
	ids := s.submit(ctx, "ada", []int{8, 8, 4, 2, 1, 1, 8, 8}, nil) // 40 GPUs on 24
	runPlacer(t, c.Server.Endpoint(), Config{})

	var w world
	eventually(t, 20*time.Second, "placement to settle with reasons for the waiting", func() bool {
		ok, ww := s.settled(ctx, PlanOptions{})
		w = ww
		if !ok {
			return false
		}
		for id := range w.pending {
			if w.status[id].Reason != "Capacity" {
				return false
			}
		}
		return true
	})
	if err := w.check(8); err != nil {
		t.Fatal(err)
	}
	gpus := 0
	for _, l := range w.ledgers {
		gpus += len(l.GPUOwners())
	}
	if gpus != 24 {
		t.Errorf("%d GPUs allocated of 24, want the cluster full (8+8+4+2+1+1 fit)", gpus)
	}
	if len(w.pending) != 2 {
		t.Errorf("%d pending, want the two 8-GPU sessions that came last", len(w.pending))
	}
	positions := map[int]bool{}
	for id := range w.pending {
		st := w.status[id]
		if !strings.HasPrefix(st.Message, "waiting for 8×GPU: the best node has 0 free") || !strings.Contains(st.Message, "ahead of you") && !strings.Contains(st.Message, "next in line") {
			t.Errorf("pending %s message %q", id, st.Message)
		}
		positions[st.QueuePosition] = true
	}
	if !positions[1] || !positions[2] {
		t.Errorf("queue positions %v, want 1 and 2", positions)
	}
	for _, id := range ids[:6] {
		bs := w.bindings[id]
		if len(bs) != 1 || bs[0].Scores["binpack"] == 0 || bs[0].Placer == "" || bs[0].QueueRevision == 0 {
			t.Errorf("binding of %s = %+v", id, bs)
		}
	}
}

// TestPlacersRace runs four placers on one etcd over thousands of sessions
// while agents release them, kills one placer mid-run without letting it
// clean up, and checks: no session bound twice, no GPU held twice at any
// sampled moment, and every session bound in the end. Sharded, all four
// write at once and the one killed is the last started; with one active,
// the one killed is the active one, and another must take over.
func TestPlacersRace(t *testing.T) {
	for _, sharded := range []bool{true, false} {
		t.Run(fmt.Sprintf("sharded=%v", sharded), func(t *testing.T) { placersRace(t, sharded) })
	}
}

func placersRace(t *testing.T, sharded bool) {
	sessions := 2400
	if testing.Short() {
		sessions = 600
	}
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newSim(t, cli)
	s.addNodes(ctx, "gpu", 40, 8)
	r := agents(t, ctx, cli, s.k, 0, 0)

	var placers []*Placer
	var stops []func()
	var clis []*clientv3.Client
	for i := 0; i < 4; i++ {
		p, stop, pc := runPlacer(t, c.Server.Endpoint(), Config{LeaseTTL: 2 * time.Second, Parallel: 2, Sharded: sharded})
		placers, stops, clis = append(placers, p), append(stops, stop), append(clis, pc)
	}
	rng := rand.New(rand.NewSource(1))
	var submitters sync.WaitGroup
	for u := 0; u < 4; u++ {
		sizes := mixedSizes(rng, sessions/4)
		owner := []string{"ada", "bob", "cy", "dee"}[u]
		submitters.Add(1)
		go func() {
			defer submitters.Done()
			s.submit(ctx, owner, sizes, nil)
		}()
	}
	// Kill one placer once a third is bound: close its connection so it
	// neither finishes its transactions nor revokes its lease.
	eventually(t, 60*time.Second, "a third of the sessions bound", func() bool { return r.bound() >= sessions/3 })
	victim := 3
	if !sharded {
		victim = -1
		for i, p := range placers {
			if p.role.Load() == roleActive {
				if victim >= 0 {
					t.Fatalf("placers %s and %s are both active", placers[victim].ID(), p.ID())
				}
				victim = i
			}
		}
		if victim < 0 {
			t.Fatal("no placer is active")
		}
	}
	_ = clis[victim].Close()
	killed := placers[victim].ID()
	boundBefore := placers[victim].Stats().Bound
	// Sample the invariants while the others carry on.
	for i := 0; i < 5; i++ {
		if err := s.read(ctx).checkNoDoubleGPU(); err != nil {
			t.Fatal(err)
		}
	}
	submitters.Wait()
	eventually(t, 120*time.Second, "every session bound", func() bool { return r.bound() == sessions })
	r.mu.Lock()
	if len(r.doubles) > 0 {
		t.Errorf("sessions bound twice: %v", r.doubles)
	}
	r.mu.Unlock()
	stops[victim]() // reap the killed placer's goroutines
	var total Stats
	for i, p := range placers {
		st := p.Stats()
		t.Logf("placer %d %s: %+v", i, p.ID(), st)
		total.Bound += st.Bound
		total.Conflicts += st.Conflicts
	}
	if !sharded && total.Bound-placers[victim].Stats().Bound == 0 {
		t.Errorf("no placer took over from the killed active one (it bound %d)", boundBefore)
	}
	if !sharded {
		// Of the live placers, exactly one says it is active.
		var active []string
		for i, p := range placers {
			if i != victim && activeGauge(t, p) == 1 {
				active = append(active, p.ID())
			}
		}
		if len(active) != 1 {
			t.Errorf("placers reporting voyager_placer_active 1: %v, want one", active)
		}
	}
	// The killed placer may have had transactions commit on the server
	// after its connection closed, unseen by its counters: so at most, not
	// exactly, one count per session.
	if total.Bound > int64(sessions) {
		t.Errorf("placers report %d bindings for %d sessions: some session counted twice", total.Bound, sessions)
	}
	t.Logf("killed %s; conflicts per binding: %.3f", killed, float64(total.Conflicts)/float64(total.Bound))
}

// activeGauge reads p's voyager_placer_active.
func activeGauge(t *testing.T, p *Placer) float64 {
	t.Helper()
	for _, c := range p.Collectors() {
		ch := make(chan *prometheus.Desc, 1)
		c.Describe(ch)
		if strings.Contains((<-ch).String(), `"voyager_placer_active"`) {
			return testutil.ToFloat64(c)
		}
	}
	t.Fatal("no voyager_placer_active collector")
	return 0
}

// checkNoDoubleGPU is the part of check that holds at any instant, even
// while agents release and placers bind.
func (w world) checkNoDoubleGPU() error {
	seen := map[string]string{}
	for _, l := range w.ledgers {
		for id, a := range l.Allocations {
			for _, g := range a.GPUs {
				if prev, dup := seen[g]; dup {
					return &doubleErr{g, prev, id}
				}
				seen[g] = id
			}
		}
	}
	return nil
}

type doubleErr struct{ gpu, a, b string }

func (e *doubleErr) Error() string { return "GPU " + e.gpu + " held by " + e.a + " and " + e.b }

// TestPassedAfterTheFirstPassCommits: Passed closes once the first pass
// has ended, by which time what was queued at the start and fits is bound
// (a process starts its lifecycle controller on it).
func TestPassedAfterTheFirstPassCommits(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	s.addNodes(ctx, "gpu", 2, 8)
	ids := s.submit(ctx, "ada", []int{8, 4, 2, 1, 1}, nil) // 16 GPUs on 16
	p, _, _ := runPlacer(t, c.Server.Endpoint(), Config{})
	select {
	case <-p.Passed():
	case <-time.After(20 * time.Second):
		t.Fatal("the first pass did not end within 20 s")
	}
	resp, err := cli.Get(ctx, s.k.AllBindings(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if resp.Count != int64(len(ids)) {
		t.Errorf("%d bindings when Passed closed, want all %d queued sessions bound by the first pass", resp.Count, len(ids))
	}
}

// TestOwnBindsCallForNoPass: a pass that binds its whole plan is followed by
// no pass until something else changes. Its binds coming back through the
// watch are no change: they are laid over the caches already, and a pass
// on them would bind nothing. Once the placer has bound a first queue and
// waits, one new session costs one pass; before, each binding pass was
// followed at once by one that bound nothing.
func TestOwnBindsCallForNoPass(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	s.addNodes(ctx, "gpu", 2, 8)
	s.submit(ctx, "ada", []int{4, 2, 1}, nil)
	// No tick: only a change may start a pass.
	p, _, _ := runPlacer(t, c.Server.Endpoint(), Config{Tick: time.Hour})
	settled := func(want int64) func() bool {
		return func() bool {
			last := p.lastBind.Load()
			return p.Stats().Bound == want && p.pending.Revision() >= last && p.ledgers.Revision() >= last && p.idle.Load()
		}
	}
	// The first queue also takes whatever passes the placer's start and
	// its own registration cost.
	eventually(t, 20*time.Second, "3 sessions bound, the placer's caches showing the binds and the placer waiting for a change", settled(3))
	before := p.Stats().Passes
	s.submit(ctx, "bob", []int{1}, nil)
	eventually(t, 20*time.Second, "the 4th session bound, the placer's caches showing it and the placer waiting for a change", settled(4))
	if passes := p.Stats().Passes - before; passes != 1 {
		t.Errorf("one new session took %d passes, want 1: a pass was planned on the placer's own binds coming back", passes)
	}
}

// TestOthersBindsCallForNoPass: with two sharded placers, each plans the
// whole queue and commits its share; the other's binds of the rest of the plan,
// coming back through the watch, are no change either. Sixteen nodes
// registered in one transaction under a queue of sixteen waiting sessions
// cost one pass of each placer, not two: before, each planned again at
// once after its share was bound and the other's shown. One pass more is
// allowed for a change delivered as a pass was starting.
func TestOthersBindsCallForNoPass(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	cfg := Config{Tick: time.Hour, Sharded: true} // only a change may start a pass
	a, _, _ := runPlacer(t, c.Server.Endpoint(), cfg)
	b, _, _ := runPlacer(t, c.Server.Endpoint(), cfg)
	ps := []*Placer{a, b}
	settled := func(bound int64, queued int) func() bool {
		return func() bool {
			if a.Stats().Bound+b.Stats().Bound != bound {
				return false
			}
			last := max(a.lastBind.Load(), b.lastBind.Load())
			for _, p := range ps {
				if p.placers.Len() != 2 || p.pending.Len() != queued || p.ledgers.Revision() < last {
					return false
				}
			}
			return true
		}
	}
	// 2 nodes taken and 16 sessions waiting: the placers' start and each
	// other's registration cost what passes they cost here, and every
	// cache a pass reads has delivered changes since its list (etcd's
	// watches that start behind its revision catch up in their own time,
	// and a nodes cache behind the ledgers cache sees lost nodes).
	s.submit(ctx, "ada", []int{8, 8}, nil)
	s.submit(ctx, "bob", []int{8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}, nil)
	s.addNodes(ctx, "gpu", 2, 8)
	eventually(t, 20*time.Second, "2 sessions bound, 16 waiting, both placers' caches showing it and both waiting for a change", func() bool {
		return settled(2, 16)() && a.nodes.Len() == 2 && b.nodes.Len() == 2 && a.idle.Load() && b.idle.Load()
	})
	lease, err := cli.Grant(ctx, 3600)
	if err != nil {
		t.Fatal(err)
	}
	// Up to three rounds, each of 16 nodes under 16 waiting sessions:
	// one round in about ten on this machine costs a pass more than it
	// should for reasons that are not the plan's binds (a placer's nodes
	// watch delivering the new nodes after its ledgers watch delivered
	// the other's binds on them, so it plans once without them). The
	// defect this test is for costs the extra passes every round.
	var rounds []int64
	for round := range 3 {
		bound := int64(2 + 16*(round+1))
		if round > 0 {
			s.submit(ctx, "bob", []int{8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}, nil)
			eventually(t, 20*time.Second, "16 more sessions waiting, both placers' caches showing them and both waiting for a change", func() bool {
				return settled(bound-16, 16)() && a.idle.Load() && b.idle.Load()
			})
		}
		before := a.Stats().Passes + b.Stats().Passes
		var ops []clientv3.Op
		for i := range 16 {
			n := gpuNode(fmt.Sprintf("new%d-%04d", round, i), 8, "NVIDIA A100-SXM4-80GB")
			n.Simulated = true
			v, err := state.Encode(n)
			if err != nil {
				t.Fatal(err)
			}
			ops = append(ops, clientv3.OpPut(s.k.Node(n.Name), v, clientv3.WithLease(lease.ID)))
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
		eventually(t, 20*time.Second, fmt.Sprintf("%d sessions bound and both placers' caches showing them", bound), settled(bound, 0))
		passes := a.Stats().Passes + b.Stats().Passes - before
		if passes <= 3 {
			return
		}
		rounds = append(rounds, passes)
	}
	t.Errorf("16 sessions on 16 new nodes took %v passes of the two placers in three rounds, want 2 (3 at most) in one at least: a pass was planned on the plan's own binds coming back", rounds)
}

// TestAnEpochPlannedWithoutPartOfTheQueueIsLeft: an epoch's plan can have
// been made on a snapshot whose queue cache was behind its nodes cache
// (each cache is at its own revision): bob's entry, older than the epoch,
// was not in it. A later snapshot shows bob's entry, nothing newer than
// the epoch, so it plans the epoch again with its binds pinned, and fair
// share puts bob first, on the devices ada's pinned session holds: every
// pass planned the same bind, refused at commit ("went stale"), for as
// long as nothing else changed. A pass whose binds all went stale on a
// pinned epoch now leaves the epoch: the next plans afresh, ada's session
// held where it is, and bob waits with a reason.
func TestAnEpochPlannedWithoutPartOfTheQueueIsLeft(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	bob := s.submit(ctx, "bob", []int{8}, nil)[0]
	name := s.addNodes(ctx, "gpu", 1, 8)[0]
	nodeResp, err := cli.Get(ctx, s.k.Node(name))
	if err != nil || len(nodeResp.Kvs) != 1 {
		t.Fatalf("read node %s: %v", name, err)
	}
	node, err := state.Decode[state.Node](nodeResp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	// ada's session, bound in the epoch of the node's registration: a
	// plan on a snapshot that showed the node but not bob's entry.
	a := state.Allocation{Kind: state.KindBatch, Owner: "ada", Role: state.RoleSingle, CPUMilli: 8000, MemoryMiB: 8 * 4096,
		Plan: nodeResp.Kvs[0].ModRevision, Queued: time.Now().UTC()}
	for _, g := range node.GPUs {
		a.GPUs = append(a.GPUs, g.UUID)
	}
	if _, err := state.Put(ctx, cli, s.k.Ledger(name), state.Ledger{Node: name, Allocations: map[string]state.Allocation{"s-ada-bound": a}}); err != nil {
		t.Fatal(err)
	}
	p, _, _ := runPlacer(t, c.Server.Endpoint(), Config{})
	eventually(t, 20*time.Second, "bob's session told why it waits", func() bool {
		resp, err := cli.Get(ctx, s.k.Status(bob))
		if err != nil || len(resp.Kvs) != 1 {
			return false
		}
		st, err := state.Decode[state.Status](resp.Kvs[0].Value)
		return err == nil && st.Phase == state.PhasePending && st.QueuePosition > 0
	})
	if n := p.Stats().Bound; n != 0 {
		t.Errorf("%d sessions bound on a node ada's session fills", n)
	}
}

// TestStoppedSharedCachesAreAShutdown: caches shared with the other
// components of a process (Config.Shared) run under their own context, and
// on a shutdown they can stop before the placer's context is cancelled.
// Here they have stopped before the placer even starts: the placer stops
// cleanly, as on its own cancellation, rather than failing the process's
// shutdown with "cache stopped before its first sync" (which is what
// voyager dev once printed on a Ctrl-C just after start).
func TestStoppedSharedCachesAreAShutdown(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	shared := NewSharedCaches(cli, state.MustKeys(state.DefaultPrefix), quietLogger())
	p := New(cli, Config{Shared: shared, Logger: quietLogger()})
	sctx, stop := context.WithCancel(context.Background())
	stop()
	if err := shared.Run(sctx); err != nil {
		t.Fatalf("shared caches: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := p.Run(ctx); err != nil {
		t.Errorf("Run after the shared caches were stopped = %v, want nil", err)
	}
	if ctx.Err() != nil {
		t.Errorf("Run waited for its own context to end, want it to stop with the caches it reads")
	}
}

// TestOwnLedgersComeBackAsWritten: the ledgers a placer writes come back
// through its cache without being decoded (its own values, byte for byte),
// and what the cache then holds is what decoding etcd's bytes gives.
func TestOwnLedgersComeBackAsWritten(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	nodes := s.addNodes(ctx, "gpu", 4, 8)
	s.submit(ctx, "ada", []int{8, 4, 2, 1, 1, 8, 2, 2, 4}, func(sess *state.Session) { sess.Groups = []string{"lab"} })
	p, _, _ := runPlacer(t, c.Server.Endpoint(), Config{})
	eventually(t, 20*time.Second, "placement to settle", func() bool {
		ok, _ := s.settled(ctx, PlanOptions{})
		return ok
	})
	// Each cached ledger comes to be what etcd's bytes decode to, and
	// stays so: the cache decodes no value twice, so a ledger taken wrong
	// would never be mended.
	for _, name := range nodes {
		key := s.k.Ledger(name)
		var got, want state.Ledger
		eventually(t, 10*time.Second, "the cached ledger of "+name+" to be etcd's", func() bool {
			resp, err := cli.Get(ctx, key)
			if err != nil || len(resp.Kvs) != 1 {
				return false
			}
			if want, err = decodeLedger(key, resp.Kvs[0].Value); err != nil {
				t.Fatal(err)
			}
			var ok bool
			got, ok = p.ledgers.Get(key)
			return ok && reflect.DeepEqual(got, want)
		})
	}
	p.own.mu.Lock()
	taken := p.own.taken
	p.own.mu.Unlock()
	if taken == 0 {
		t.Errorf("no ledger this placer wrote came back undecoded")
	}
	t.Logf("%d of the ledger writes came back undecoded", taken)
}
