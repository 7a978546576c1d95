package nodeagent_test

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// heldStop is the fake runtime whose Stop waits until release is closed:
// the container's grace period, held open by the test.
type heldStop struct {
	*runtime.Fake
	stopping chan struct{} // closed when Stop is called
	release  chan struct{}
}

func (h *heldStop) Stop(ctx context.Context, id string, grace time.Duration) error {
	select {
	case <-h.stopping:
	default:
		close(h.stopping)
	}
	<-h.release
	return h.Fake.Stop(ctx, id, grace)
}

// TestAgentStopDuringEvictionGraceEndsStopped is issue 11's item 5: the
// owner stops a session while its agent is stopping it for a re-queueing
// eviction (preemption). The release used to decide from the spec it saw
// when the eviction came and ended the session Pending/Preempted with
// desired=stopped, which nothing re-queued or ended. Now the release
// decides from the spec its transaction compares, and the session ends
// Stopped; a second stop changes nothing.
func TestAgentStopDuringEvictionGraceEndsStopped(t *testing.T) {
	cli := etcdtest.New(t)
	rt := &heldStop{Fake: newFake(), stopping: make(chan struct{}), release: make(chan struct{})}
	runAgent(t, testConfig(t, cli, rt))
	ctx := context.Background()
	bind(t, cli, state.Session{ID: "victim", Owner: "bob", Kind: state.KindBatch, Preemptible: true, Command: []string{"train"}},
		state.Binding{GPUs: []string{"GPU-x"}, CPUMilli: 100, MemoryMiB: 64})
	waitPhase(t, cli, "victim", state.PhaseRunning, 10*time.Second)
	updateSession(t, cli, "victim", func(s *state.Session) {
		s.Eviction = &state.Eviction{Reason: state.ReasonPreempted, Message: "preempted by s2", At: time.Now().UTC(), Requeue: true, By: "s2"}
	})
	select {
	case <-rt.stopping:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent never stopped the evicted container")
	}
	out, err := state.StopSession(ctx, cli, keys, "victim", "bob", time.Now())
	if err != nil || out != state.StopRequested {
		t.Fatalf("stop during the grace = %q, %v; want %q", out, err, state.StopRequested)
	}
	close(rt.release)
	st := waitPhase(t, cli, "victim", state.PhaseStopped, 10*time.Second)
	if st.Reason != "StopRequested" || st.RetryAt != nil || st.Finished == nil {
		t.Errorf("final status %s/%s retryAt %v finished %v; want Stopped/StopRequested, finished", st.Phase, st.Reason, st.RetryAt, st.Finished)
	}
	if out, err := state.StopSession(ctx, cli, keys, "victim", "bob", time.Now()); err != nil || out != state.StopAlready {
		t.Errorf("second stop = %q, %v; want %q", out, err, state.StopAlready)
	}
}
