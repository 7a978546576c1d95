package nodeagent_test

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentWithholdsGPUHeldInAnotherSplit is the agent's half of point 3
// of issue 33: an agent that registers with a GPU split into MIG devices
// while one of its bindings holds that GPU whole (or with the GPU whole
// while a binding holds one of its MIG devices) never offers a device of
// that GPU as free: the inventory it publishes names the holding session
// (HeldBy) on that GPU alone. Before, it published the new split as it
// read it.
func TestAgentWithholdsGPUHeldInAnotherSplit(t *testing.T) {
	for _, tc := range []struct {
		name string
		// held returns the devices the binding holds, given the GPUs as
		// the agent had them before; split says whether the agent
		// registers with GPU 0 split.
		held  func(g []state.GPU) []string
		split bool
	}{
		{"held whole, registered split", func(g []state.GPU) []string { return []string{g[0].UUID} }, true},
		{"held split, registered whole", func(g []state.GPU) []string { return []string{g[0].MIGDevices[0].UUID} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdtest.New(t)
			ctx := context.Background()
			cfg := testConfig(t, cli, newFake())
			whole := append([]state.GPU(nil), cfg.GPUs...)
			split := append([]state.GPU(nil), cfg.GPUs...)
			split[0].MIGEnabled = true
			split[0].MIGDevices = []state.MIGDevice{{UUID: "MIG-" + split[0].UUID[4:] + "-a", Profile: "3g.40gb", MemoryMiB: 40192},
				{UUID: "MIG-" + split[0].UUID[4:] + "-b", Profile: "3g.40gb", MemoryMiB: 40192}}
			before, after := whole, split
			if !tc.split {
				before, after = split, whole
			}
			// The node as an earlier registration left it, and a session
			// holding a device of GPU 0 in that split.
			if _, err := state.Put(ctx, cli, keys.Node(node), state.Node{Name: node, GPUs: before}); err != nil {
				t.Fatal(err)
			}
			bind(t, cli, state.Session{ID: "s1", Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredStopped},
				state.Binding{GPUs: tc.held(before), CPUMilli: 100, MemoryMiB: 64})
			cfg.GPUs = after
			runAgent(t, cfg)
			var n state.Node
			waitFor(t, "the agent's registration", 10*time.Second, func() (bool, string) {
				got, _, err := state.Get[state.Node](ctx, cli, keys.Node(node))
				n = got
				return err == nil && got.Registered.After(time.Time{}) && got.Simulated, ""
			})
			if n.GPUs[0].HeldBy != "s1" || n.GPUs[1].HeldBy != "" {
				t.Fatalf("published GPUs held by %q and %q, want GPU 0 withheld for s1 and GPU 1 offered", n.GPUs[0].HeldBy, n.GPUs[1].HeldBy)
			}
		})
	}
}
