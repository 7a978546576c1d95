package nodeagent_test

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// ours lists the goroutines running code of the agent or its watcher
// (etcd's and gRPC's own, and the test containerd's, are not the agent's).
func ours() []string {
	buf := make([]byte, 4<<20)
	var out []string
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		for _, pkg := range []string{"voyager/nodeagent.", "voyager/watcher."} {
			if strings.Contains(g, pkg) {
				out = append(out, g)
				break
			}
		}
	}
	return out
}

// TestAgentRunLeavesNoGoroutines: once Run has returned, every goroutine
// the agent started is gone.
func TestAgentRunLeavesNoGoroutines(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	_, stop := runAgent(t, testConfig(t, cli, rt))
	bind(t, cli, state.Session{ID: "g1", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}}, state.Binding{})
	waitPhase(t, cli, "g1", state.PhaseRunning, 10*time.Second)
	if len(ours()) == 0 {
		t.Fatal("no agent goroutine found while it runs: the check sees nothing")
	}
	stop()
	deadline := time.Now().Add(10 * time.Second)
	for left := ours(); len(left) > 0; left = ours() {
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines of the agent left after Run returned:\n%s", len(left), strings.Join(left, "\n\n"))
		}
		time.Sleep(20 * time.Millisecond) // polling, bounded by deadline
	}
}
