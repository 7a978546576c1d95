package nodeagent_test

import (
	"context"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// slowStop is the in-memory runtime with a container that takes delay
// to stop after SIGTERM.
type slowStop struct {
	*runtime.Fake
	delay time.Duration
}

func (s slowStop) Stop(ctx context.Context, id string, grace time.Duration) error {
	select {
	case <-time.After(s.delay):
	case <-ctx.Done():
	}
	return s.Fake.Stop(ctx, id, grace)
}

// partPhases returns the phases session id's part went through on the
// node from revision from on, up to its end.
func partPhases(t *testing.T, cli *clientv3.Client, id string, from int64) []state.Phase {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var phases []state.Phase
	for resp := range cli.Watch(ctx, keys.Part(node, id), clientv3.WithRev(from)) {
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return phases
			}
			p, err := state.Decode[state.PartStatus](ev.Kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			if len(phases) == 0 || phases[len(phases)-1] != p.Phase {
				phases = append(phases, p.Phase)
			}
			if p.Ended() {
				return phases
			}
		}
	}
	t.Fatalf("the part of %s did not end; phases so far %v", id, phases)
	return nil
}

// TestAgentReportsStoppingOnlyForASlowStop: a container that stops at
// SIGTERM within Config.StopReportAfter is reported by its end alone (its
// part goes from Running to Stopped: one write, not two); one that takes
// longer is reported Stopping meanwhile, as every stop was before.
func TestAgentReportsStoppingOnlyForASlowStop(t *testing.T) {
	for _, tc := range []struct {
		name  string
		delay time.Duration
		want  []state.Phase
	}{
		{"quick", 0, []state.Phase{state.PhaseStarting, state.PhaseRunning, state.PhaseStopped}},
		{"slow", 2 * time.Second, []state.Phase{state.PhaseStarting, state.PhaseRunning, state.PhaseStopping, state.PhaseStopped}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdtest.New(t)
			cfg := testConfig(t, cli, slowStop{Fake: newFake(), delay: tc.delay})
			cfg.StopReportAfter = 500 * time.Millisecond
			runAgent(t, cfg)
			id := "stop-" + tc.name
			bind(t, cli, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}},
				state.Binding{CPUMilli: 100, MemoryMiB: 64})
			br, err := cli.Get(context.Background(), keys.Binding(node, id))
			if err != nil || len(br.Kvs) == 0 {
				t.Fatalf("read binding: %v", err)
			}
			from := br.Kvs[0].CreateRevision
			waitPhase(t, cli, id, state.PhaseRunning, 10*time.Second)
			updateSession(t, cli, id, func(s *state.Session) { s.Desired = state.DesiredStopped })
			waitPhase(t, cli, id, state.PhaseStopped, 30*time.Second)
			if got := partPhases(t, cli, id, from); !slices.Equal(got, tc.want) {
				t.Errorf("the part went through %v, want %v", got, tc.want)
			}
		})
	}
}

// TestAgentReportsRunningOnlyForALastingBatchContainer: a batch part whose
// container exits within Config.RunReportAfter is reported by its end
// alone, which carries the container's start (its part goes from
// Starting to Succeeded: two writes, not three); one that runs longer
// says Running, with the same start, once RunReportAfter has passed.
func TestAgentReportsRunningOnlyForALastingBatchContainer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		exits bool
		want  []state.Phase
	}{
		{"quick", true, []state.Phase{state.PhaseStarting, state.PhaseSucceeded}},
		{"lasting", false, []state.Phase{state.PhaseStarting, state.PhaseRunning, state.PhaseStopped}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdtest.New(t)
			rt := newFake()
			rt.Exit = func(runtime.Spec) (int, bool) { return 0, tc.exits }
			cfg := testConfig(t, cli, rt)
			cfg.RunReportAfter = 500 * time.Millisecond
			runAgent(t, cfg)
			id := "run-" + tc.name
			before := time.Now().UTC()
			// The part's history from the revision after this one: a
			// quick container can be started, ended and released (its
			// binding gone) before a read after the bind.
			rr, err := cli.Get(context.Background(), keys.Binding(node, id))
			if err != nil {
				t.Fatal(err)
			}
			from := rr.Header.Revision + 1
			bind(t, cli, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"job"}},
				state.Binding{CPUMilli: 100, MemoryMiB: 64})
			if !tc.exits {
				st := waitPhase(t, cli, id, state.PhaseRunning, 10*time.Second)
				if st.Started == nil || st.Started.Before(before) || time.Since(*st.Started) < cfg.RunReportAfter {
					t.Errorf("Running status started %v: want the container's start, at least %s before it said so", st.Started, cfg.RunReportAfter)
				}
				updateSession(t, cli, id, func(s *state.Session) { s.Desired = state.DesiredStopped })
			}
			st := waitPhase(t, cli, id, tc.want[len(tc.want)-1], 10*time.Second)
			if st.Started == nil || st.Started.Before(before) {
				t.Errorf("final status started %v, want the container's start", st.Started)
			}
			if got := partPhases(t, cli, id, from); !slices.Equal(got, tc.want) {
				t.Errorf("the part went through %v, want %v", got, tc.want)
			}
		})
	}
}
