package placer_test

import (
	"fmt"
	"time"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// A 4-GPU node with two GPUs taken, and two requests: the 2-GPU one fits on
// the free pair, the 4-GPU one waits with a plain reason.
func ExampleNewPlan() {
	now := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	node := state.Node{Name: "gpu-01", CPUMilli: 32000, MemoryMiB: 131072}
	for i := 0; i < 4; i++ {
		node.GPUs = append(node.GPUs, state.GPU{Index: i, UUID: fmt.Sprintf("GPU-%d", i), Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, Healthy: true})
	}
	ledger := state.Ledger{Node: "gpu-01", Allocations: map[string]state.Allocation{
		"s-old": {Owner: "bob", Role: state.RoleSingle, GPUs: []string{"GPU-0", "GPU-1"}, CPUMilli: 4000, MemoryMiB: 8192},
	}}
	queue := func(id string, gpus int) placer.Pending {
		return placer.Pending{Revision: 1, Entry: &state.QueueEntry{
			Session: id, Kind: state.KindBatch, Owner: "ada", Created: now,
			Request: state.Resources{GPUs: gpus, GPUModel: "*A100*", CPUMilli: 4000, MemoryMiB: 8192},
		}}
	}
	plan := placer.NewPlan(&placer.Snapshot{
		Nodes:   []placer.NodeView{{Node: node, Ledger: ledger, LedgerRevision: 7}},
		Pending: []placer.Pending{queue("s-big", 4), queue("s-pair", 2)},
		Now:     now,
	}, placer.PlanOptions{})
	for _, d := range plan.Bound {
		fmt.Println(d.Pending.Entry.Session, "→", d.Parts[0].Node, d.Parts[0].Devices)
	}
	for _, w := range plan.Waiting {
		fmt.Println(w.Pending.Entry.Session, w.Reason+":", w.Message)
	}
	// Output:
	// s-pair → gpu-01 [GPU-2 GPU-3]
	// s-big Capacity: waiting for 4×A100: the best node has 2 free
}
