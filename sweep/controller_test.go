package sweep_test

import (
	"context"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/sweep"
)

func countElements(t *testing.T, cli *clientv3.Client, k state.Keys, id string) int64 {
	t.Helper()
	r, err := cli.Get(context.Background(), k.Session(id+"-"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return r.Count
}

// TestReconcileFillsTransactionsToTheBudget: an array without a cap is
// created in as many transactions as etcd's operation limit needs (one
// record write and three keys an element: 42 elements in 128 operations),
// each complete, and never past its size.
func TestReconcileFillsTransactionsToTheBudget(t *testing.T) {
	cli := etcdtest.New(t)
	k := state.MustKeys(state.DefaultPrefix)
	ctx := context.Background()
	a := state.Array{ID: "sw1", Owner: "ada", Indices: "0-99", MaxRunning: 100, Created: time.Now().UTC(),
		Template: state.Session{Kind: state.KindBatch, Command: []string{"true"}, Desired: state.DesiredRunning}}
	if err := state.CreateArray(ctx, cli, k, a); err != nil {
		t.Fatal(err)
	}
	if err := state.CreateArray(ctx, cli, k, a); err == nil {
		t.Fatal("a second create of one id succeeded")
	}
	c := sweep.New(cli, sweep.Config{Keys: k, Logger: quiet()})
	for _, want := range []int64{42, 84, 100, 100} {
		if err := c.Reconcile(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if got := countElements(t, cli, k, a.ID); got != want {
			t.Fatalf("%d elements after a pass, want %d", got, want)
		}
	}
	rec, _, err := state.Get[state.Array](ctx, cli, k.Array(a.ID))
	if err != nil || rec.Next != 100 || rec.Finished != nil {
		t.Fatalf("record %+v, %v", rec, err)
	}
	// A smaller budget makes smaller steps.
	small := sweep.New(cli, sweep.Config{Keys: k, Logger: quiet(), Budget: state.TxnBudget{MaxOps: 16}})
	b := a
	b.ID = "sw2"
	if err := state.CreateArray(ctx, cli, k, b); err != nil {
		t.Fatal(err)
	}
	if err := small.Reconcile(ctx, b.ID); err != nil {
		t.Fatal(err)
	}
	if got := countElements(t, cli, k, b.ID); got != 5 {
		t.Fatalf("%d elements after a pass of 16 operations, want 5", got)
	}
}

// TestRayElementsGetTheirTokens: the elements of an array of Ray batch
// jobs are made with their Ray tokens, as a session's create makes one,
// in steps that count the fourth key (31 elements in 128 operations).
func TestRayElementsGetTheirTokens(t *testing.T) {
	cli := etcdtest.New(t)
	k := state.MustKeys(state.DefaultPrefix)
	ctx := context.Background()
	a := state.Array{ID: "swray", Owner: "ada", Indices: "0-39", MaxRunning: 40, Created: time.Now().UTC(),
		Template: state.Session{Kind: state.KindBatch, Command: []string{"true"}, Desired: state.DesiredRunning, Ray: &state.Ray{Workers: 1}}}
	if err := state.CreateArray(ctx, cli, k, a); err != nil {
		t.Fatal(err)
	}
	c := sweep.New(cli, sweep.Config{Keys: k, Logger: quiet()})
	for _, want := range []int64{31, 40} {
		if err := c.Reconcile(ctx, a.ID); err != nil {
			t.Fatal(err)
		}
		if got := countElements(t, cli, k, a.ID); got != want {
			t.Fatalf("%d elements after a pass, want %d", got, want)
		}
	}
	r, err := cli.Get(ctx, k.SpecSecretsDir(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, kv := range r.Kvs {
		sec, err := state.Decode[state.SpecSecrets](kv.Value)
		if err != nil || len(sec.RayToken) < 32 || seen[sec.RayToken] {
			t.Fatalf("secrets %s: %+v, %v; want a fresh token per element", kv.Key, sec, err)
		}
		seen[sec.RayToken] = true
	}
	if len(seen) != 40 {
		t.Errorf("%d Ray tokens for 40 Ray elements", len(seen))
	}
}

// TestConcurrentControllersKeepTheCap: eight controllers reconciling one
// array at once, while its elements end, never make more than the cap
// unfinished; the ones that lose a race count a conflict and re-read.
func TestConcurrentControllersKeepTheCap(t *testing.T) {
	cli := etcdtest.New(t)
	k := state.MustKeys(state.DefaultPrefix)
	ctx := context.Background()
	a := state.Array{ID: "sw3", Owner: "ada", Indices: "0-59", MaxRunning: 5, Created: time.Now().UTC(),
		Template: state.Session{Kind: state.KindBatch, Command: []string{"true"}, Desired: state.DesiredRunning}}
	if err := state.CreateArray(ctx, cli, k, a); err != nil {
		t.Fatal(err)
	}
	var ctrls []*sweep.Controller
	for i := 0; i < 8; i++ {
		ctrls = append(ctrls, sweep.New(cli, sweep.Config{Keys: k, Logger: quiet()}))
	}
	for round := 0; ; round++ {
		var wg sync.WaitGroup
		for _, c := range ctrls {
			wg.Go(func() {
				if err := c.Reconcile(ctx, a.ID); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		// Count the unfinished and end them all (Pending → Stopped: a
		// cancel, an edge of the state machine).
		r, err := cli.Get(ctx, k.Status(a.ID+"-"), clientv3.WithPrefix())
		if err != nil {
			t.Fatal(err)
		}
		unfinished := 0
		for _, kv := range r.Kvs {
			st, err := state.Decode[state.Status](kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			if st.Phase.Terminal() {
				continue
			}
			unfinished++
			st.Phase = state.PhaseStopped
			if _, err := state.Put(ctx, cli, string(kv.Key), st); err != nil {
				t.Fatal(err)
			}
		}
		if unfinished > 5 {
			t.Fatalf("round %d: %d unfinished, the cap is 5", round, unfinished)
		}
		rec, _, err := state.Get[state.Array](ctx, cli, k.Array(a.ID))
		if err != nil {
			t.Fatal(err)
		}
		if rec.Finished != nil {
			if rec.Next != 60 || len(rec.Done) != 60 {
				t.Fatalf("finished with next %d, %d done", rec.Next, len(rec.Done))
			}
			break
		}
		if round > 100 {
			t.Fatalf("not finished after %d rounds: %+v", round, rec)
		}
	}
	var conflicts int64
	for _, c := range ctrls {
		conflicts += c.Stats().Conflicts
	}
	t.Logf("%d conflicts among 8 controllers", conflicts)
}

// TestOnlyEndsReconcileAnArray: an element created (Pending), bound,
// starting and running changes nothing an array's reconcile decides, so
// the controller does not read the array for it; the element's end does
// (the next element is created under the cap). Before, each status
// change read the array and its elements' statuses (five or more
// reconciles here, not four).
func TestOnlyEndsReconcileAnArray(t *testing.T) {
	cli := etcdtest.New(t)
	k := state.MustKeys(state.DefaultPrefix)
	ctx, cancel := context.WithCancel(context.Background())
	a := state.Array{ID: "sw4", Owner: "ada", Indices: "0-1", MaxRunning: 1, Created: time.Now().UTC(),
		Template: state.Session{Kind: state.KindBatch, Command: []string{"true"}, Desired: state.DesiredRunning}}
	if err := state.CreateArray(ctx, cli, k, a); err != nil {
		t.Fatal(err)
	}
	c := sweep.New(cli, sweep.Config{Keys: k, Logger: quiet(), Every: time.Hour})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	waitCreated := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for countElements(t, cli, k, a.ID) != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d elements, want %d", countElements(t, cli, k, a.ID), n)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitCreated(1)
	el := a.ID + "-0"
	st, _, err := state.Get[state.Status](ctx, cli, k.Status(el))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for _, ph := range []state.Phase{state.PhaseBound, state.PhaseStarting, state.PhaseRunning, state.PhaseSucceeded} {
		st.Phase, st.Updated = ph, now
		if ph == state.PhaseBound {
			st.Bound = &now
		}
		if ph == state.PhaseSucceeded {
			code := 0
			st.Finished, st.ExitCode = &now, &code
		}
		if _, err := state.Put(ctx, cli, k.Status(el), st); err != nil {
			t.Fatal(err)
		}
	}
	waitCreated(2)
	// The first pass (element 0 created), the echo of its own write to
	// the record, the end (element 1 created) and that write's echo.
	deadline := time.Now().Add(30 * time.Second)
	for c.Stats().Reconciles < 4 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := c.Stats().Reconciles; got != 4 {
		t.Errorf("%d reconciles, want 4: the first pass, the element's end and the echoes of their writes to the record; "+
			"none for the element's and its successor's other status changes", got)
	}
}
