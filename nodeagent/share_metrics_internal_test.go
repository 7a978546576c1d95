package nodeagent

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// TestShareMetrics: each fraction the agent drives is reported with its
// GPU, session, memory limit and compute share, marked simulated on a
// simulated node; whole-GPU sessions are not.
func TestShareMetrics(t *testing.T) {
	a := New(Config{Node: "n1", Simulated: true})
	a.workers = map[string]*worker{
		"s1-q1": {item: watcher.Item[state.Binding]{Value: state.Binding{Session: "s1", GPUs: []string{"GPU-a"}, Share: &state.GPUShare{MemoryMiB: 10240, ComputePercent: 25, GPUMemoryMiB: 81920}}}},
		"s2-q1": {item: watcher.Item[state.Binding]{Value: state.Binding{Session: "s2", GPUs: []string{"GPU-b"}}}},
	}
	want := `
# HELP voyager_agent_session_gpu_compute_share_ratio Compute share of each fraction of a shared GPU (1: no cap of its own).
# TYPE voyager_agent_session_gpu_compute_share_ratio gauge
voyager_agent_session_gpu_compute_share_ratio{gpu="GPU-a",node="n1",session="s1",simulated="true"} 0.25
# HELP voyager_agent_session_gpu_share_bytes Memory limit of each fraction of a shared GPU a session holds here (enforced by CUDA MPS; simulated="true": nothing enforces it).
# TYPE voyager_agent_session_gpu_share_bytes gauge
voyager_agent_session_gpu_share_bytes{gpu="GPU-a",node="n1",session="s1",simulated="true"} 1.073741824e+10
# HELP voyager_agent_mps_daemons CUDA MPS control daemons the agent runs, one per shared GPU holding fractions.
# TYPE voyager_agent_mps_daemons gauge
voyager_agent_mps_daemons{node="n1"} 0
`
	c := newShareCollector(a, prometheus.Labels{"node": "n1"})
	if err := testutil.CollectAndCompare(c, strings.NewReader(want)); err != nil {
		t.Fatal(err)
	}
}
