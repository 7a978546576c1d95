package state_test

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestStopEndsAWaitingSessionStoppedEvenIfAlreadyStopping is issue 11's
// item 5: a stop that lands during an eviction's grace (or between the
// agent's back-off read and its release) left the session Pending, waiting,
// with desired=stopped; the controller does not re-queue a stopped session,
// and a second stop answered "already stopped" and wrote nothing, so the
// session stayed so forever. Now the stop ends it Stopped, and a third stop
// is idempotent.
func TestStopEndsAWaitingSessionStoppedEvenIfAlreadyStopping(t *testing.T) {
	for _, reason := range []string{state.ReasonPreempted, state.ReasonBackOff} {
		t.Run(reason, func(t *testing.T) {
			cli := etcdtest.New(t)
			ctx := context.Background()
			k := state.MustKeys(state.DefaultPrefix)
			now := time.Now().UTC()
			s := state.Session{ID: "s1", Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredStopped, Created: now}
			if _, err := state.Put(ctx, cli, k.Session("s1"), s); err != nil {
				t.Fatal(err)
			}
			if _, err := state.Put(ctx, cli, k.Status("s1"), state.Status{Session: "s1", Phase: state.PhasePending, Reason: reason, RetryAt: &now}); err != nil {
				t.Fatal(err)
			}
			out, err := state.StopSession(ctx, cli, k, "s1", "ada", now)
			if err != nil || out != state.StopCancelled {
				t.Fatalf("stop of a waiting session already asked to stop = %q, %v; want %q", out, err, state.StopCancelled)
			}
			st, _, err := state.Get[state.Status](ctx, cli, k.Status("s1"))
			if err != nil || st.Phase != state.PhaseStopped || st.Finished == nil || st.RetryAt != nil {
				t.Fatalf("status after the stop = %+v, %v; want Stopped and finished", st, err)
			}
			if out, err := state.StopSession(ctx, cli, k, "s1", "ada", now); err != nil || out != state.StopAlready {
				t.Errorf("repeated stop = %q, %v; want %q", out, err, state.StopAlready)
			}
		})
	}
}
