package placer

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestNodeLoss kills nodes under bound sessions with two placers running:
// each lost session is handled exactly once, by its restart policy, and a
// Ray session loses all its parts together.
func TestNodeLoss(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	s.addNodes(ctx, "gpu", 4, 8)
	gang := s.submit(ctx, "ada", []int{8}, func(x *state.Session) {
		x.Kind = state.KindNotebook
		x.Ray = &state.Ray{Workers: 1}
	})[0]
	retry := s.submit(ctx, "bob", []int{2, 2}, func(x *state.Session) {
		x.Restart = state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 2}
	})
	never := s.submit(ctx, "cy", []int{2, 2}, nil)
	p1, _, _ := runPlacer(t, c.Server.Endpoint(), Config{})
	p2, _, _ := runPlacer(t, c.Server.Endpoint(), Config{})

	var w world
	eventually(t, 20*time.Second, "all sessions bound", func() bool {
		w = s.read(ctx)
		return len(w.pending) == 0 && len(w.bindings) == 5
	})
	if err := w.check(8); err != nil {
		t.Fatal(err)
	}
	smallNode := w.bindings[retry[0]][0].Node
	for _, id := range append(retry[1:], never...) {
		if n := w.bindings[id][0].Node; n != smallNode {
			t.Fatalf("binpack put the 2-GPU sessions on %s and %s", smallNode, n)
		}
	}
	var head, worker string
	for _, b := range w.bindings[gang] {
		if b.Role == state.RoleHead {
			head = b.Node
		} else {
			worker = b.Node
		}
	}
	// The agents' reports of the parts that will be lost (parts/<node>/<id>).
	reported := []string{s.k.Part(head, gang), s.k.Part(worker, gang)}
	for _, id := range never {
		reported = append(reported, s.k.Part(smallNode, id))
	}
	for _, key := range reported {
		node, id, _ := s.k.PartKey(key)
		if _, err := state.Put(ctx, cli, key, state.PartStatus{Session: id, Node: node, Phase: state.PhaseRunning}); err != nil {
			t.Fatal(err)
		}
	}
	s.killNode(ctx, smallNode)
	s.killNode(ctx, worker)

	eventually(t, 20*time.Second, "lost sessions handled and re-queued ones bound again", func() bool {
		w = s.read(ctx)
		for _, id := range never {
			if w.status[id].Phase != state.PhaseLost {
				return false
			}
		}
		for _, id := range retry {
			if w.status[id].Phase != state.PhaseBound {
				return false
			}
		}
		return w.status[gang].Phase == state.PhaseLost
	})
	if err := w.check(8); err != nil {
		t.Fatal(err)
	}
	// Node loss deletes the lost sessions' parts with their bindings, the
	// gang's part on its live head node too.
	for _, key := range reported {
		if r, err := cli.Get(ctx, key); err != nil || len(r.Kvs) != 0 {
			t.Errorf("part %s left after its node was lost (%v)", key, err)
		}
	}
	for _, id := range retry {
		st := w.status[id]
		if st.Attempt != 1 {
			t.Errorf("re-queued %s has attempt %d, want exactly 1", id, st.Attempt)
		}
		if b := w.bindings[id]; len(b) != 1 || b[0].Node == smallNode || b[0].Node == worker || b[0].Attempt != 1 {
			t.Errorf("re-queued %s bound as %+v", id, b)
		}
	}
	for _, id := range never {
		if st := w.status[id]; st.Reason != "NodeLost" || st.Finished == nil || len(w.bindings[id]) != 0 {
			t.Errorf("lost %s: %+v, bindings %v", id, st, w.bindings[id])
		}
	}
	if len(w.bindings[gang]) != 0 {
		t.Errorf("the Ray session kept bindings after its worker's node died: %+v", w.bindings[gang])
	}
	if _, held := w.ledgers[head].Allocations[gang]; held {
		t.Errorf("the Ray head's node still holds the lost session: %v", w.ledgers[head].Allocations)
	}
	for _, n := range []string{smallNode, worker} {
		if _, ok := w.ledgers[n]; ok {
			t.Errorf("ledger of lost node %s still exists", n)
		}
		// The transaction that deleted the ledger recorded when.
		if rec, _, err := state.Get[state.Emptied](ctx, cli, s.k.Emptied(n)); err != nil || rec.Node != n || rec.Since.IsZero() {
			t.Errorf("no emptied record for %s after its ledger was cleared: %+v, %v", n, rec, err)
		}
	}
	if got := p1.Stats().Lost + p2.Stats().Lost; got != 5 {
		t.Errorf("placers handled %d lost sessions, want exactly 5", got)
	}
}

// TestLiveNodeIsNotCleared: a ledger whose node the placer's nodes cache
// does not show (a cache lagging its ledgers cache, or a node registered
// again) is cleared only if its node key is gone: clearLostNode reads it
// with the ledger and leaves a live node's ledger as it is, at once,
// without a refused transaction per attempt.
func TestLiveNodeIsNotCleared(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	s := newSim(t, cli)
	s.addNodes(ctx, "gpu", 1, 8)
	s.submit(ctx, "ada", []int{2}, nil)
	p, _, _ := runPlacer(t, c.Server.Endpoint(), Config{})
	var w world
	eventually(t, 20*time.Second, "the session bound", func() bool {
		w = s.read(ctx)
		return len(w.pending) == 0 && len(w.bindings) == 1
	})
	before, err := cli.Get(ctx, s.k.Ledger("gpu0000"))
	if err != nil || len(before.Kvs) != 1 {
		t.Fatalf("read ledger: %v, %d keys", err, len(before.Kvs))
	}
	conflicts := p.Stats().Conflicts
	rev, err := p.clearLostNode(ctx, "gpu0000")
	if err != nil || rev != 0 {
		t.Fatalf("clearLostNode of a live node = %d, %v; want 0, nil", rev, err)
	}
	if got := p.Stats().Conflicts - conflicts; got != 0 {
		t.Errorf("clearing a live node's ledger was tried %d times, want none", got)
	}
	after, err := cli.Get(ctx, s.k.Ledger("gpu0000"))
	if err != nil || len(after.Kvs) != 1 || after.Kvs[0].ModRevision != before.Kvs[0].ModRevision {
		t.Errorf("the live node's ledger changed: %v", after.Kvs)
	}
}

// TestNodeLossFreesEveryPartFromWhatItReads is point 4 of issue 33: a
// multi-node job loses one part's node while the placer that handles the
// loss has a ledgers cache that does not show the other part (it trails
// the nodes cache), and the other part's agent does nothing (dead or
// paused; here there is none). The job is ended or re-queued with every
// part's binding and allocation gone, found from the status and ledgers
// the transaction reads. Before, the other node kept its binding and its
// GPUs for a session that had ended.
func TestNodeLossFreesEveryPartFromWhatItReads(t *testing.T) {
	for _, tc := range []struct {
		name    string
		restart state.RestartPolicy
		want    state.Phase
	}{
		{"ended", state.RestartPolicy{}, state.PhaseLost},
		{"re-queued", state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 1}, state.PhasePending},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := etcdtest.Start(t, etcdtest.Options{})
			cli := c.Client(t)
			ctx := context.Background()
			s := newSim(t, cli)
			s.addNodes(ctx, "gpu", 2, 8)
			job := s.submit(ctx, "ada", []int{4}, func(x *state.Session) {
				x.Nodes = 2
				x.Restart = tc.restart
			})[0]
			_, stop, _ := runPlacer(t, c.Server.Endpoint(), Config{})
			var w world
			eventually(t, 20*time.Second, "the job bound on both nodes", func() bool {
				w = s.read(ctx)
				return len(w.bindings[job]) == 2 && w.status[job].Phase == state.PhaseBound
			})
			stop() // only the placer below handles the loss
			lost, other := w.bindings[job][0].Node, w.bindings[job][1].Node

			// A placer whose nodes cache runs and whose ledgers cache shows
			// nothing: the ledgers cache trails.
			p := New(cli, Config{ID: "trailing", Logger: quietLogger()})
			cctx, cancel := context.WithCancel(ctx)
			t.Cleanup(cancel)
			go func() { _ = p.nodes.Run(cctx) }()
			if err := p.nodes.WaitSynced(cctx); err != nil {
				t.Fatal(err)
			}
			s.killNode(ctx, lost)
			if _, err := p.clearLostNode(ctx, lost); err != nil {
				t.Fatal(err)
			}
			w = s.read(ctx)
			if st := w.status[job]; st.Phase != tc.want || st.Reason != "NodeLost" {
				t.Fatalf("job is %s (%s), want %s NodeLost", st.Phase, st.Reason, tc.want)
			}
			if bs := w.bindings[job]; len(bs) != 0 {
				t.Errorf("bindings left for a job that was %s: %+v", tc.name, bs)
			}
			if a, held := w.ledgers[other].Allocations[job]; held {
				t.Errorf("node %s still allocates %v to a job that was %s", other, a.GPUs, tc.name)
			}
		})
	}
}

// TestNodeLossFreesAnOlderQueueingAlone: the lost node holds a part of a
// session's older queueing (left there while the session was re-queued
// and bound again elsewhere). Only that part is freed: the session's
// current binding, allocation and status are not the lost node's.
func TestNodeLossFreesAnOlderQueueingAlone(t *testing.T) {
	_, s := simOnEtcd(t)
	ctx := context.Background()
	nodes := s.addNodes(ctx, "gpu", 2, 8)
	lost, live := nodes[0], nodes[1]
	id := "s1"
	now := time.Now().UTC()
	if _, err := state.Put(ctx, s.cli, s.k.Session(id), state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredRunning, Created: now,
		Restart: state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 3}}); err != nil {
		t.Fatal(err)
	}
	part := func(node string, q int64) {
		a := state.Allocation{Owner: "ada", Role: state.RoleSingle, GPUs: []string{"GPU-" + node + "-0"}, CPUMilli: 1000, MemoryMiB: 1024}
		if _, err := state.Put(ctx, s.cli, s.k.Ledger(node), state.Ledger{Node: node, Allocations: map[string]state.Allocation{id: a}}); err != nil {
			t.Fatal(err)
		}
		if _, err := state.Put(ctx, s.cli, s.k.Binding(node, id), state.Binding{Session: id, Node: node, Role: state.RoleSingle, GPUs: a.GPUs, QueueRevision: q}); err != nil {
			t.Fatal(err)
		}
	}
	part(lost, 5)
	part(live, 9)
	cur := state.Status{Session: id, Phase: state.PhaseRunning, Nodes: []string{live}, QueueRevision: 9, Attempt: 1, Created: now, Updated: now}
	if _, err := state.Put(ctx, s.cli, s.k.Status(id), cur); err != nil {
		t.Fatal(err)
	}
	p := New(s.cli, Config{ID: "p1", Logger: quietLogger()})
	startCaches(t, p)
	s.killNode(ctx, lost)
	if _, err := p.clearLostNode(ctx, lost); err != nil {
		t.Fatal(err)
	}
	w := s.read(ctx)
	if _, ok := w.ledgers[lost]; ok {
		t.Errorf("the lost node's ledger is left: %+v", w.ledgers[lost])
	}
	if st := w.status[id]; st.Phase != state.PhaseRunning || st.Attempt != 1 {
		t.Errorf("status %s attempt %d, want Running attempt 1 untouched", st.Phase, st.Attempt)
	}
	if len(w.bindings[id]) != 1 || w.bindings[id][0].Node != live {
		t.Errorf("bindings %+v, want the current one on %s only", w.bindings[id], live)
	}
	if _, held := w.ledgers[live].Allocations[id]; !held {
		t.Errorf("the live node's current allocation was freed")
	}
}
