package placer

import (
	"context"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestStreamedPassChainsANodesBatches: one 8-GPU node, eight 1-GPU
// sessions, and transactions of at most 8 operations: two sessions on one
// node (state.BindSize: its ledger and 3 per session). The
// plan fills the node, so its eight decisions go out together, in several
// batches that all write the node's ledger: each is sent after the one
// before and builds on its write. The first pass binds all eight, with no
// transaction refused.
func TestStreamedPassChainsANodesBatches(t *testing.T) {
	c, s := simOnEtcd(t)
	ctx := context.Background()
	s.addNodes(ctx, "gpu", 1, 8)
	ids := s.submit(ctx, "ada", []int{1, 1, 1, 1, 1, 1, 1, 1}, nil)
	p, _, _ := runPlacer(t, c.Server.Endpoint(), Config{MaxTxnOps: 8})
	<-p.Passed()
	w := s.read(ctx)
	for _, id := range ids {
		if w.status[id].Phase != state.PhaseBound {
			t.Errorf("after the first pass %s is %q, want Bound", id, w.status[id].Phase)
		}
	}
	st := p.Stats()
	if st.Txns != 4 {
		t.Errorf("%d transactions, want 4 of two sessions each", st.Txns)
	}
	if st.Conflicts != 0 {
		t.Errorf("%d refused transactions: a batch on a ledger an earlier batch of the pass writes must build on that write", st.Conflicts)
	}
	if err := w.check(8); err != nil {
		t.Fatal(err)
	}
}

// streamedBatches plans snap with planEmitting, feeding a streamer whose
// committer records the batches sent (and what each is sent after) instead
// of committing them. sentBefore is how many were sent before the plan
// ended.
func streamedBatches(t *testing.T, snap *Snapshot, opt PlanOptions, cfg Config) (sent []*bindBatch, after [][]<-chan struct{}, sentBefore int, st *streamer) {
	t.Helper()
	cfg.Logger = quietLogger()
	cfg.defaults()
	p := &Placer{cfg: cfg, log: cfg.Logger, own: newOwnWrites()}
	nodes := map[string]*NodeView{}
	for i := range snap.Nodes {
		nodes[snap.Nodes[i].Node.Name] = &snap.Nodes[i]
	}
	st = p.newStreamer(&committer{p: p, nodes: nodes, snap: snap})
	st.send = func(b *bindBatch, a []<-chan struct{}) <-chan struct{} {
		sent = append(sent, b)
		after = append(after, a)
		done := make(chan struct{})
		close(done)
		return done
	}
	_, ok := planEmitting(snap, opt, st.offer)
	if !ok {
		t.Fatal("planEmitting refused a snapshot with nothing pinned")
	}
	sentBefore = len(sent)
	st.end()
	return sent, after, sentBefore, st
}

// holdUntilFullSnapshot is the snapshot TestStreamerHoldsANodeUntilFull
// describes: nodes a and b of 4 GPUs and c of 2, sessions s1-s5 of 3, 2, 1,
// 1 and 2 GPUs, oldest first.
func holdUntilFullSnapshot() *Snapshot {
	s := &Snapshot{Now: t0}
	for _, n := range []struct {
		name string
		gpus int
	}{{"a", 4}, {"b", 4}, {"c", 2}} {
		s.Nodes = append(s.Nodes, view(gpuNode(n.name, n.gpus, "NVIDIA A100-SXM4-80GB")))
	}
	for i, g := range []int{3, 2, 1, 1, 2} {
		p := req("s"+string(rune('1'+i)), "ada", g, time.Duration(5-i)*time.Second)
		p.Revision = int64(i + 1)
		s.Pending = append(s.Pending, p)
	}
	return s
}

// TestStreamerHoldsANodeUntilFull: a node's decisions go out together once
// the plan has filled it, not in plan order; on a node it did not fill
// they wait for the plan's end. Two sessions per transaction, nodes a and
// b of 4 GPUs and c of 2; binpack places s1 (3 GPUs) on b, s2 (2) on c,
// filling it, s3 (1) on b, filling it, then s4 (1) and s5 (2) on a, which
// keeps one GPU free. In plan order the batches would be {s1 b, s2 c},
// {s3 b, s4 a} and {s5 a}, the last two each sent after the one before;
// held, they are {s2 c} (sent during the plan, when b's two do not fit
// beside it), {s1 b, s3 b} and {s4 a, s5 a}, none after another.
func TestStreamerHoldsANodeUntilFull(t *testing.T) {
	s := holdUntilFullSnapshot()
	var order []string
	for _, d := range NewPlan(s, PlanOptions{}).Bound {
		order = append(order, d.Pending.Entry.Session+"@"+d.Parts[0].Node)
	}
	if want := []string{"s1@b", "s2@c", "s3@b", "s4@a", "s5@a"}; !slices.Equal(order, want) {
		t.Fatalf("the plan is %q, the test is written for %q", order, want)
	}
	sent, after, before, st := streamedBatches(t, s, PlanOptions{}, Config{MaxTxnOps: 8})
	var got []string
	for _, b := range sent {
		var ds []string
		for _, d := range b.decisions {
			ds = append(ds, d.Pending.Entry.Session+"@"+d.Parts[0].Node)
		}
		got = append(got, strings.Join(ds, " "))
	}
	want := []string{"s2@c", "s1@b s3@b", "s4@a s5@a"}
	if !slices.Equal(got, want) {
		t.Fatalf("batches %q, want %q", got, want)
	}
	if before != 1 {
		t.Errorf("%d batches went out before the plan ended, want 1 (c's)", before)
	}
	for i, a := range after {
		if len(a) != 0 {
			t.Errorf("batch %d is sent after %d others, though no batch before it writes its ledger", i, len(a))
		}
	}
	if st.chains != 0 {
		t.Errorf("%d batches chained, want none", st.chains)
	}
}

// TestStreamerChainsWhatRevisitsASentNode: a decision on a node whose
// batch already went out is sent after that batch; a node's decisions
// that no longer fit the open batch close it and go on in the next, sent
// after it.
func TestStreamerChainsWhatRevisitsASentNode(t *testing.T) {
	s := &Snapshot{Now: t0}
	s.Nodes = append(s.Nodes, view(gpuNode("a", 8, "NVIDIA A100-SXM4-80GB")))
	for i := range 8 {
		p := req("s"+string(rune('1'+i)), "ada", 1, 0)
		p.Revision = int64(i + 1)
		s.Pending = append(s.Pending, p)
	}
	sent, after, _, st := streamedBatches(t, s, PlanOptions{}, Config{MaxTxnOps: 8})
	if len(sent) != 4 {
		t.Fatalf("%d batches, want the node's 8 decisions in 4 of two", len(sent))
	}
	n := 0
	for i, b := range sent {
		n += len(b.decisions)
		if i > 0 && len(after[i]) != 1 {
			t.Errorf("batch %d is sent after %d batches, want after the one before it", i, len(after[i]))
		}
	}
	if n != 8 || len(after[0]) != 0 || st.chains != len(sent)-1 {
		t.Errorf("%d decisions sent, the first batch after %d, %d chained; want 8, 0, %d", n, len(after[0]), st.chains, len(sent)-1)
	}
}

// TestStreamedBatchStartsWhileThePlanRuns: a batch sent while the plan
// runs starts at once, not when the plan next stops. The committer starts
// each batch in a goroutine of its own, which waits on the plan's P; with
// one P (as a placer whose other cores are busy with etcd has, in effect)
// it used to start only when the plan was preempted (every 10 ms) or done,
// so batches went out in clumps. The snapshot is the one of
// TestStreamerHoldsANodeUntilFull: c's batch goes out during the plan.
// The plan takes microseconds, so without the yield the batch never
// starts during it; with it, Go's scheduler still picks the global run
// queue first one time in 61 (and the race detector shuffles), so the
// test plans 40 times and asks for the batch to start during the plan in
// at least 30.
func TestStreamedBatchStartsWhileThePlanRuns(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	const plans, want = 40, 30
	var started int
	for range plans {
		if streamedBatchStartedDuringPlan(t) {
			started++
		}
	}
	t.Logf("started %d of %d", started, plans)
	if started < want {
		t.Errorf("the batch sent during the plan started before the plan ended in %d of %d plans, want at least %d", started, plans, want)
	}
}

// streamedBatchStartedDuringPlan plans holdUntilFullSnapshot once with a
// streamer whose send starts each batch in a goroutine, and says whether
// the one batch sent during the plan started before the plan ended.
func streamedBatchStartedDuringPlan(t *testing.T) bool {
	t.Helper()
	s := holdUntilFullSnapshot()
	cfg := Config{MaxTxnOps: 8, Logger: quietLogger()}
	cfg.defaults()
	p := &Placer{cfg: cfg, log: cfg.Logger, own: newOwnWrites()}
	nodes := map[string]*NodeView{}
	for i := range s.Nodes {
		nodes[s.Nodes[i].Node.Name] = &s.Nodes[i]
	}
	st := p.newStreamer(&committer{p: p, nodes: nodes, snap: s})
	var planning atomic.Bool
	var sent, startedWhilePlanning atomic.Int32
	var wg sync.WaitGroup
	st.send = func(*bindBatch, []<-chan struct{}) <-chan struct{} {
		sent.Add(1)
		done := make(chan struct{})
		wg.Go(func() { // as committer.send starts a batch
			defer close(done)
			if planning.Load() {
				startedWhilePlanning.Add(1)
			}
		})
		return done
	}
	planning.Store(true)
	if _, ok := planEmitting(s, PlanOptions{}, st.offer); !ok {
		t.Fatal("planEmitting refused a snapshot with nothing pinned")
	}
	during := sent.Load()
	planning.Store(false)
	st.end()
	wg.Wait()
	if during != 1 {
		t.Fatalf("%d batches were sent during the plan, the test is written for 1", during)
	}
	return startedWhilePlanning.Load() == 1
}
