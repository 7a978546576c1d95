package state_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestLaunchOncePerBinding: a binding's launch is recorded once; a second
// Launch of the same binding is refused (ErrLaunched) unless again says
// nothing of the attempt ran; ten concurrent launches of one binding
// record exactly one; a binding gone or replaced is ErrStale; what the
// part said before (its phase, reason) is kept.
func TestLaunchOncePerBinding(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	rev := seedBound(t, cli, k, "s1")
	b := state.Binding{Session: "s1", Node: "n1", Attempt: 2}
	pulling := state.NewPartStatus(b, rev)
	pulling.Phase, pulling.Reason = state.PhaseStarting, "Pulling"
	if _, err := state.Put(ctx, cli, k.Part("n1", "s1"), pulling); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	won, refused := 0, 0
	for range 10 {
		wg.Go(func() {
			_, _, err := state.Launch(ctx, cli, k, b, rev, false, time.Now())
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				won++
			case errors.Is(err, state.ErrLaunched):
				refused++
			default:
				t.Errorf("launch: %v", err)
			}
		})
	}
	wg.Wait()
	if won != 1 || refused != 9 {
		t.Fatalf("%d launches recorded, %d refused; want 1 and 9", won, refused)
	}
	p, prev, err := state.Get[state.PartStatus](ctx, cli, k.Part("n1", "s1"))
	if err != nil || p.Launched == nil || p.Phase != state.PhaseStarting || p.Reason != "Launching" || p.Attempt != 2 || p.BindingRevision != rev {
		t.Fatalf("part %+v (%v); want the launch recorded on the part as it was, Starting for Launching", p, err)
	}
	first := *p.Launched
	if _, r, err := state.Launch(ctx, cli, k, b, rev, false, first); err != nil || r != prev {
		t.Fatalf("a retry of the launch that committed (the same time): revision %d, %v; want it found as its own, of revision %d", r, err, prev)
	}
	again, _, err := state.Launch(ctx, cli, k, b, rev, true, first.Add(time.Second))
	if err != nil || again.Launched == nil || !again.Launched.After(first) {
		t.Fatalf("launch again (nothing ran): %+v, %v; want it recorded anew", again, err)
	}

	if _, err := cli.Delete(ctx, k.Binding("n1", "s1")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.Launch(ctx, cli, k, b, rev, false, time.Now()); !errors.Is(err, state.ErrStale) {
		t.Fatalf("launch of a binding that is gone: %v; want ErrStale", err)
	}
	newer, err := state.Put(ctx, cli, k.Binding("n1", "s1"), state.Binding{Session: "s1", Node: "n1", Attempt: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.Launch(ctx, cli, k, b, rev, false, time.Now()); !errors.Is(err, state.ErrStale) {
		t.Fatalf("launch of a replaced binding: %v; want ErrStale", err)
	}
	// The newer binding's first launch is its own, whatever the old part said.
	if _, _, err := state.Launch(ctx, cli, k, state.Binding{Session: "s1", Node: "n1", Attempt: 3}, newer, false, time.Now()); err != nil {
		t.Fatalf("first launch of the newer binding: %v", err)
	}
}

// TestMergeFencedPart: a part ended Fenced becomes the session's status
// through the state machine: waiting to be re-queued (restarts left), Lost
// (none left, also when the part's agent decided from an older spec), or
// Stopped when the owner asked to stop meanwhile.
func TestMergeFencedPart(t *testing.T) {
	now := time.Now().UTC()
	onFailure := state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 1}
	for _, tc := range []struct {
		name    string
		spec    state.Session
		attempt int
		part    state.Phase
		want    state.Phase
		event   state.Event
	}{
		{"restarts left", state.Session{ID: "s", Kind: state.KindBatch, Restart: onFailure, Desired: state.DesiredRunning}, 0, state.PhasePending, state.PhasePending, state.EventFenced},
		{"none left", state.Session{ID: "s", Kind: state.KindBatch, Desired: state.DesiredRunning}, 0, state.PhaseLost, state.PhaseLost, state.EventFencedLost},
		{"used up since the agent decided", state.Session{ID: "s", Kind: state.KindBatch, Restart: onFailure, Desired: state.DesiredRunning}, 1, state.PhasePending, state.PhaseLost, state.EventFencedLost},
		{"stopped since", state.Session{ID: "s", Kind: state.KindBatch, Restart: onFailure, Desired: state.DesiredStopped}, 0, state.PhasePending, state.PhaseStopped, state.EventHalt},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := state.Status{Session: "s", Phase: state.PhaseRunning, Nodes: []string{"n1"}, QueueRevision: 7, Attempt: tc.attempt}
			p := state.PartStatus{Session: "s", Node: "n1", Role: state.RoleSingle, Phase: tc.part, Reason: state.ReasonFenced,
				Message: "attempt 0 on n1 was fenced", QueueRevision: 7, Attempt: tc.attempt, Updated: now}
			if tc.part == state.PhasePending {
				p.RetryAt = &now
			}
			ev, st, changed, err := state.MergeParts(tc.spec, cur, []state.PartStatus{p}, now)
			if err != nil || !changed || ev != tc.event || st.Phase != tc.want {
				t.Fatalf("merge: %s → %s (changed %v, %v); want %s → %s", ev, st.Phase, changed, err, tc.event, tc.want)
			}
			if tc.want == state.PhasePending && !st.Waiting() {
				t.Fatalf("status %+v is not waiting to be re-queued", st)
			}
		})
	}
}

// TestLaunchRefusedOnceTheSessionEnded: a binding whose session's status
// is final, waits to be queued again, names another queueing, or is gone
// is not launched (ErrEnded), and nothing is written: a multi-node job
// whose rank 0 ended before another part launched must not start that
// part (the soak's launched-twice rule found it).
func TestLaunchRefusedOnceTheSessionEnded(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	rev := seedBound(t, cli, k, "s1")
	b := state.Binding{Session: "s1", Node: "n1", QueueRevision: 7}
	for _, st := range []*state.Status{
		{Session: "s1", Phase: state.PhaseSucceeded, QueueRevision: 7},
		{Session: "s1", Phase: state.PhaseFailed},
		{Session: "s1", Phase: state.PhasePending, QueueRevision: 7},
		{Session: "s1", Phase: state.PhaseRunning, QueueRevision: 9},
		nil,
	} {
		if st == nil {
			if _, err := cli.Delete(ctx, k.Status("s1")); err != nil {
				t.Fatal(err)
			}
		} else if _, err := state.Put(ctx, cli, k.Status("s1"), *st); err != nil {
			t.Fatal(err)
		}
		if _, _, err := state.Launch(ctx, cli, k, b, rev, false, time.Now()); !errors.Is(err, state.ErrEnded) {
			t.Errorf("launch with status %+v: %v; want ErrEnded", st, err)
		}
		if r, err := cli.Get(ctx, k.Part("n1", "s1")); err != nil || len(r.Kvs) != 0 {
			t.Fatalf("part after a refused launch: %v, %v; want none", r.Kvs, err)
		}
	}
	if _, err := state.Put(ctx, cli, k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseBound, QueueRevision: 7}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.Launch(ctx, cli, k, b, rev, false, time.Now()); err != nil {
		t.Fatalf("launch while the status is Bound for its queueing: %v", err)
	}
}

// TestLaunchFromAnEarlierRead: a launch that decides from reads made
// earlier (state.LaunchReads, as the agent reads them with the spec)
// records the launch when nothing moved since, in one transaction; when
// another launch landed in between, its transaction is refused and it
// reads again and finds the launch (ErrLaunched), never a second one.
func TestLaunchFromAnEarlierRead(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	rev := seedBound(t, cli, k, "s1")
	b := state.Binding{Session: "s1", Node: "n1", Attempt: 1}
	read := func() *clientv3.TxnResponse {
		t.Helper()
		r, err := cli.Txn(ctx).Then(state.LaunchReads(k, b)...).Commit()
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	early := read()
	p, r, err := state.LaunchFrom(ctx, cli, k, b, rev, false, time.Now(), early.Responses)
	if err != nil || p.Launched == nil {
		t.Fatalf("launch from a read that still holds: %+v, %v", p, err)
	}
	if r != early.Header.Revision+1 {
		t.Errorf("launched at revision %d, want %d: the read's next, nothing read again", r, early.Header.Revision+1)
	}

	rev2 := seedBound(t, cli, k, "s2")
	b2 := state.Binding{Session: "s2", Node: "n1", Attempt: 1}
	b = b2 // read() reads b's
	stale := read()
	if _, _, err := state.Launch(ctx, cli, k, b2, rev2, false, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.LaunchFrom(ctx, cli, k, b2, rev2, false, time.Now().Add(time.Second), stale.Responses); !errors.Is(err, state.ErrLaunched) {
		t.Fatalf("launch from a read that another launch overtook: %v, want ErrLaunched", err)
	}
}
