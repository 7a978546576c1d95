package nodeagent_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// updateSession applies change to session id's spec, as the API or the
// lifecycle controller does.
func updateSession(t testing.TB, cli *clientv3.Client, id string, change func(*state.Session)) {
	t.Helper()
	ctx := context.Background()
	s, _, err := state.Get[state.Session](ctx, cli, keys.Session(id))
	if err != nil {
		t.Fatal(err)
	}
	change(&s)
	if _, err := state.Put(ctx, cli, keys.Session(id), s); err != nil {
		t.Fatal(err)
	}
}

// released reports whether session id holds nothing on the node any more:
// no binding, no ledger allocation.
func released(t testing.TB, cli *clientv3.Client, id string) bool {
	t.Helper()
	if !gone(t, cli, keys.Binding(node, id)) {
		return false
	}
	l, _, err := state.Get[state.Ledger](context.Background(), cli, keys.Ledger(node))
	if err != nil {
		return true // no ledger: nothing allocated
	}
	_, held := l.Allocations[id]
	return !held
}

// idOf makes a session id of a test case's name.
func idOf(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r == ' ':
			return '-'
		}
		return -1
	}, strings.ToLower(name))
}

func TestAgentEvictionFinalStatus(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	runAgent(t, testConfig(t, cli, rt))
	jport := listen(t)
	for _, tc := range []struct {
		name    string
		kind    state.SessionKind
		ev      state.Eviction
		owner   bool // the owner stopped it too
		phase   state.Phase
		reason  string
		message string
	}{
		{"idle notebook", state.KindNotebook, state.Eviction{Reason: state.ReasonIdle, Message: "idle for 2h0m0s"},
			false, state.PhaseStopped, state.ReasonIdle, "idle for 2h0m0s"},
		{"drained notebook", state.KindNotebook, state.Eviction{Reason: state.ReasonDrained, Message: "node gpu-01 is drained"},
			false, state.PhaseStopped, state.ReasonDrained, "node gpu-01 is drained"},
		{"notebook past max runtime", state.KindNotebook, state.Eviction{Reason: state.ReasonMaxRuntime, Message: "reached its max runtime of 1h0m0s"},
			false, state.PhaseStopped, state.ReasonMaxRuntime, "reached its max runtime of 1h0m0s"},
		{"batch past max runtime fails", state.KindBatch, state.Eviction{Reason: state.ReasonMaxRuntime, Message: "reached its max runtime of 1h0m0s"},
			false, state.PhaseFailed, state.ReasonMaxRuntime, "reached its max runtime of 1h0m0s"},
		{"owner's stop wins over a preemption", state.KindBatch, state.Eviction{Reason: state.ReasonPreempted, Message: "preempted by s2", Requeue: true, By: "s2"},
			true, state.PhaseStopped, "StopRequested", "stopped on request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := idOf(tc.name)
			b := state.Binding{CPUMilli: 100, MemoryMiB: 64}
			s := state.Session{ID: id, Owner: "ada", Kind: tc.kind, Command: []string{"sleep", "1d"}}
			if tc.kind == state.KindNotebook {
				b.Ports = []int{jport}
			}
			b = bind(t, cli, s, b)
			waitPhase(t, cli, id, state.PhaseRunning, 10*time.Second)
			updateSession(t, cli, id, func(s *state.Session) {
				ev := tc.ev
				ev.At = time.Now().UTC()
				s.Eviction = &ev
				if tc.owner {
					s.Desired = state.DesiredStopped
				}
			})
			st := waitPhase(t, cli, id, tc.phase, 10*time.Second)
			if st.Reason != tc.reason || st.Message != tc.message || st.Finished == nil || st.RetryAt != nil {
				t.Errorf("final status %s/%s %q finished %v retryAt %v; want %s/%s %q, finished, no retryAt",
					st.Phase, st.Reason, st.Message, st.Finished, st.RetryAt, tc.phase, tc.reason, tc.message)
			}
			if st.ExitCode == nil || *st.ExitCode != 143 {
				t.Errorf("exit code %v; want 143 (SIGTERM)", st.ExitCode)
			}
			waitFor(t, "the release and the container's removal", 10*time.Second, func() (bool, string) {
				_, exists := rt.Spec(nodeagent.ContainerID(b))
				return released(t, cli, id) && !exists, fmt.Sprintf("container exists: %v", exists)
			})
		})
	}
}

func TestAgentPreemptionLeavesSessionPendingToRequeue(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	runAgent(t, testConfig(t, cli, rt))
	b := bind(t, cli, state.Session{ID: "victim", Owner: "bob", Kind: state.KindBatch, Preemptible: true, Command: []string{"train"}},
		state.Binding{GPUs: []string{"GPU-x"}, CPUMilli: 100, MemoryMiB: 64})
	waitPhase(t, cli, "victim", state.PhaseRunning, 10*time.Second)
	before := time.Now()
	updateSession(t, cli, "victim", func(s *state.Session) {
		s.Eviction = &state.Eviction{Reason: state.ReasonPreempted, Message: "preempted by s2 (priority 50)", At: time.Now().UTC(), Requeue: true, By: "s2"}
	})
	st := waitPhase(t, cli, "victim", state.PhasePending, 10*time.Second)
	after := time.Now()
	if st.Reason != state.ReasonPreempted || st.Message != "preempted by s2 (priority 50); re-queued" || st.Finished != nil {
		t.Errorf("status %s/%s %q finished %v; want Pending/Preempted, the eviction's message; re-queued, not finished", st.Phase, st.Reason, st.Message, st.Finished)
	}
	if st.RetryAt == nil || st.RetryAt.Before(before.Add(-time.Second)) || st.RetryAt.After(after.Add(time.Second)) {
		t.Errorf("retryAt %v; want now (between %v and %v)", st.RetryAt, before, after)
	}
	if st.URLs["jupyter"] != "" || st.Activity != nil {
		t.Errorf("a re-queued session keeps the gone container's URL or activity: %+v", st)
	}
	waitFor(t, "the release and the container's removal", 10*time.Second, func() (bool, string) {
		_, exists := rt.Spec(nodeagent.ContainerID(b))
		return released(t, cli, "victim") && !exists, ""
	})
	if !gone(t, cli, keys.Pending("victim")) {
		t.Error("the agent wrote a queue entry: re-queueing is the lifecycle controller's")
	}
}

func TestAgentEvictedBeforeStartOnlyReleases(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	// Bound and evicted while no agent ran: the agent finds it stopping.
	bind(t, cli, state.Session{ID: "early", Owner: "ada", Kind: state.KindBatch, Command: []string{"x"},
		Eviction: &state.Eviction{Reason: state.ReasonDrained, Message: "node gpu-01 is drained", At: time.Now().UTC()}}, state.Binding{})
	runAgent(t, testConfig(t, cli, rt))
	st := waitPhase(t, cli, "early", state.PhaseStopped, 10*time.Second)
	if st.Reason != state.ReasonDrained || st.Message != "node gpu-01 is drained" {
		t.Errorf("status %+v; want Stopped/NodeDrained", st)
	}
	if rt.Starts() != 0 || !released(t, cli, "early") {
		t.Errorf("%d containers started, released %v; want none and released", rt.Starts(), released(t, cli, "early"))
	}
}

// TestAgentEvictionOnContainerd: a real container past its max runtime
// is stopped (SIGTERM, grace, SIGKILL: sleep as PID 1 ignores SIGTERM)
// and the batch session fails with MaxRuntime.
func TestAgentEvictionOnContainerd(t *testing.T) {
	cli := etcdtest.New(t)
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	cfg := testConfig(t, cli, rt)
	cfg.Image = runtimetest.ImageRef
	runAgent(t, cfg)
	b := bind(t, cli, state.Session{ID: "long", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "3600"}},
		state.Binding{CPUMilli: 200, MemoryMiB: 64})
	waitPhase(t, cli, "long", state.PhaseRunning, 30*time.Second)
	updateSession(t, cli, "long", func(s *state.Session) {
		s.Eviction = &state.Eviction{Reason: state.ReasonMaxRuntime, Message: "reached its max runtime of 1m0s", At: time.Now().UTC()}
	})
	st := waitPhase(t, cli, "long", state.PhaseFailed, 30*time.Second)
	if st.Reason != state.ReasonMaxRuntime || st.Message != "reached its max runtime of 1m0s" || st.ExitCode == nil || *st.ExitCode != 137 {
		t.Errorf("final status %s/%s %q exit %v; want Failed/MaxRuntime, exit 137 (SIGKILL after the grace)", st.Phase, st.Reason, st.Message, st.ExitCode)
	}
	waitFor(t, "the container removed and the session released", 30*time.Second, func() (bool, string) {
		_, err := rt.Status(context.Background(), nodeagent.ContainerID(b))
		return err != nil && released(t, cli, "long"), ""
	})
}

func TestRestartDelayDoublesUpToMax(t *testing.T) {
	for _, tc := range []struct {
		backoff, def, max time.Duration
		attempt           int
		want              time.Duration
	}{
		{0, 10 * time.Second, 10 * time.Minute, 0, 10 * time.Second},
		{0, 10 * time.Second, 10 * time.Minute, 1, 20 * time.Second},
		{0, 10 * time.Second, 10 * time.Minute, 3, 80 * time.Second},
		{30 * time.Second, 10 * time.Second, 10 * time.Minute, 2, 2 * time.Minute},
		{30 * time.Second, 10 * time.Second, 10 * time.Minute, 5, 10 * time.Minute},
		{time.Second, time.Second, time.Hour, 200, time.Hour}, // no overflow
	} {
		if got := nodeagent.RestartDelay(tc.backoff, tc.def, tc.max, tc.attempt); got != tc.want {
			t.Errorf("RestartDelay(%v, %v, %v, %d) = %v; want %v", tc.backoff, tc.def, tc.max, tc.attempt, got, tc.want)
		}
	}
}

func TestAgentRestartPolicy(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	cfg.RestartBackoff, cfg.RestartBackoffMax = 3*time.Second, 20*time.Second
	runAgent(t, cfg)
	for _, tc := range []struct {
		name    string
		restart state.RestartPolicy
		attempt int // restarts so far, as the controller counted them
		phase   state.Phase
		delay   time.Duration // until RetryAt
		message string
	}{
		{"never", state.RestartPolicy{Policy: state.RestartNever, MaxRestarts: 3}, 0, state.PhaseFailed, 0, "exited with code 1"},
		{"default policy", state.RestartPolicy{}, 0, state.PhaseFailed, 0, "exited with code 1"},
		{"first failure", state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 3, Backoff: state.Duration(2 * time.Second)}, 0,
			state.PhasePending, 2 * time.Second, "exited with code 1; restart 1 of 3 in 2s"},
		{"third failure doubles twice", state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 3, Backoff: state.Duration(2 * time.Second)}, 2,
			state.PhasePending, 8 * time.Second, "exited with code 1; restart 3 of 3 in 8s"},
		{"agent's default backoff, capped", state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 9}, 3,
			state.PhasePending, 20 * time.Second, "exited with code 1; restart 4 of 9 in 20s"},
		{"no restarts left", state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 3, Backoff: state.Duration(2 * time.Second)}, 3,
			state.PhaseFailed, 0, "exited with code 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := idOf(tc.name)
			b := bind(t, cli, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"train"}, Restart: tc.restart},
				state.Binding{CPUMilli: 100, MemoryMiB: 64, Attempt: tc.attempt})
			waitPhase(t, cli, id, state.PhaseRunning, 10*time.Second)
			before := time.Now()
			if err := rt.Finish(nodeagent.ContainerID(b), 1, "boom\n"); err != nil {
				t.Fatal(err)
			}
			st := waitPhase(t, cli, id, tc.phase, 10*time.Second)
			after := time.Now()
			if st.ExitCode == nil || *st.ExitCode != 1 || st.Message != tc.message || st.Attempt != tc.attempt {
				t.Errorf("status exit %v %q attempt %d; want exit 1, %q, attempt %d (the agent never counts)", st.ExitCode, st.Message, st.Attempt, tc.message, tc.attempt)
			}
			switch tc.phase {
			case state.PhasePending:
				if st.Reason != state.ReasonBackOff || st.Finished != nil || st.RetryAt == nil ||
					st.RetryAt.Before(before.Add(tc.delay-time.Second)) || st.RetryAt.After(after.Add(tc.delay+time.Second)) {
					t.Errorf("status %s/%s finished %v retryAt %v; want BackOff, not finished, retryAt %v after the exit", st.Phase, st.Reason, st.Finished, st.RetryAt, tc.delay)
				}
			default:
				if st.Reason != "Exited" || st.Finished == nil || st.RetryAt != nil {
					t.Errorf("status %s/%s finished %v retryAt %v; want Failed/Exited, finished, no retryAt", st.Phase, st.Reason, st.Finished, st.RetryAt)
				}
			}
			waitFor(t, "the release", 10*time.Second, func() (bool, string) { return released(t, cli, id), "" })
		})
	}
}

func TestAgentStartFailureBacksOffUnderOnFailure(t *testing.T) {
	cli := etcdtest.New(t)
	runAgent(t, testConfig(t, cli, newFake()))
	bind(t, cli, state.Session{ID: "noimg", Owner: "ada", Kind: state.KindBatch, Image: "nowhere:1", Command: []string{"true"},
		Restart: state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 2}}, state.Binding{})
	st := waitPhase(t, cli, "noimg", state.PhasePending, 10*time.Second)
	if st.Reason != state.ReasonBackOff || !strings.Contains(st.Message, "nowhere:1") || !strings.HasSuffix(st.Message, "; restart 1 of 2 in 10s") || st.RetryAt == nil {
		t.Errorf("status %s/%s %q retryAt %v; want BackOff, the pull error; restart 1 of 2 in 10s (the agent's default)", st.Phase, st.Reason, st.Message, st.RetryAt)
	}
}

// A batch session evicted as it fails is not restarted: the eviction's
// status wins over the back-off.
func TestAgentDoesNotRestartAnEvictedSession(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	runAgent(t, testConfig(t, cli, rt))
	bind(t, cli, state.Session{ID: "ev", Owner: "ada", Kind: state.KindBatch, Command: []string{"train"},
		Restart: state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 3}}, state.Binding{})
	waitPhase(t, cli, "ev", state.PhaseRunning, 10*time.Second)
	updateSession(t, cli, "ev", func(s *state.Session) {
		s.Eviction = &state.Eviction{Reason: state.ReasonDrained, Message: "drained", At: time.Now().UTC()}
	})
	st := waitPhase(t, cli, "ev", state.PhaseStopped, 10*time.Second)
	if st.Reason != state.ReasonDrained || st.RetryAt != nil {
		t.Errorf("status %s/%s retryAt %v; want Stopped/NodeDrained without a retry", st.Phase, st.Reason, st.RetryAt)
	}
}
