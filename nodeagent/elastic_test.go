package nodeagent_test

import (
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentElasticJobEnvironmentAndResize: an elastic job's container sees
// its size as VOYAGER_GPUS and WORLD_SIZE (with the single-node ranks and
// its range), and a resize's eviction ends it Pending with reason Resized,
// not finished, for the lifecycle controller to queue it again at the new
// size.
func TestAgentElasticJobEnvironmentAndResize(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	runAgent(t, testConfig(t, cli, rt))
	s := state.Session{ID: "el", Owner: "ada", Kind: state.KindBatch, Command: []string{"train"},
		Resources: state.Resources{GPUs: 1}, Elastic: &state.Elastic{Min: 1, Max: 4, Resizes: 1}}
	b := bind(t, cli, s, state.Binding{GPUs: []string{"GPU-x", "GPU-y"}, CPUMilli: 100, MemoryMiB: 64})
	waitPhase(t, cli, "el", state.PhaseRunning, 10*time.Second)
	spec, ok := rt.Spec(nodeagent.ContainerID(b))
	if !ok {
		t.Fatal("no container")
	}
	for k, want := range map[string]string{"VOYAGER_GPUS": "2", "WORLD_SIZE": "2", "NPROC_PER_NODE": "2", "NNODES": "1", "NODE_RANK": "0",
		"VOYAGER_ELASTIC_MIN": "1", "VOYAGER_ELASTIC_MAX": "4", "VOYAGER_RESIZES": "1"} {
		if got := spec.Env[k]; got != want {
			t.Errorf("%s=%q, want %q", k, got, want)
		}
	}
	updateSession(t, cli, "el", func(s *state.Session) {
		s.Elastic.Size = 4
		s.Eviction = &state.Eviction{Reason: state.ReasonResized, Message: "resized to 4 GPUs", At: time.Now().UTC(), Requeue: true}
	})
	st := waitPhase(t, cli, "el", state.PhasePending, 10*time.Second)
	if st.Reason != state.ReasonResized || st.RetryAt == nil || st.Finished != nil {
		t.Errorf("status %s/%s %q retryAt %v finished %v; want Pending/Resized, waiting to run again", st.Phase, st.Reason, st.Message, st.RetryAt, st.Finished)
	}
	// A fixed-size job gets none of it.
	f := bind(t, cli, state.Session{ID: "fixed", Owner: "ada", Kind: state.KindBatch, Command: []string{"train"}, Resources: state.Resources{GPUs: 1}},
		state.Binding{GPUs: []string{"GPU-x"}, CPUMilli: 100, MemoryMiB: 64})
	waitPhase(t, cli, "fixed", state.PhaseRunning, 10*time.Second)
	if spec, _ := rt.Spec(nodeagent.ContainerID(f)); spec.Env["WORLD_SIZE"] != "" || spec.Env["VOYAGER_GPUS"] != "" {
		t.Errorf("a fixed-size job's environment has elastic variables: %v", spec.Env)
	}
}
