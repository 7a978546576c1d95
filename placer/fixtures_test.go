package placer

import (
	"fmt"
	"slices"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

var t0 = time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)

// gpuNode builds a node with n whole GPUs of model, in two NUMA halves with
// NVLink inside each half.
func gpuNode(name string, n int, model string) state.Node {
	node := state.Node{Name: name, CPUMilli: 128000, MemoryMiB: 1 << 20, Ports: state.PortRange{First: 40000, Last: 40099}}
	half := (n + 1) / 2
	for i := 0; i < n; i++ {
		node.GPUs = append(node.GPUs, state.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: model, MemoryMiB: 81920, NUMANode: i / max(half, 1), Healthy: true})
	}
	for i := range node.GPUs {
		for j := range node.GPUs {
			if i != j && node.GPUs[i].NUMANode == node.GPUs[j].NUMANode {
				node.GPUs[i].NVLinkPeers = append(node.GPUs[i].NVLinkPeers, node.GPUs[j].UUID)
			}
		}
	}
	return node
}

// view wraps a node with an empty ledger.
func view(n state.Node) NodeView {
	return NodeView{Node: n, Ledger: state.Ledger{Node: n.Name, Allocations: map[string]state.Allocation{}}}
}

// holding returns v with session id holding the first k GPUs.
func holding(v NodeView, id, owner string, k int) NodeView {
	a := state.Allocation{Owner: owner, Role: state.RoleSingle, CPUMilli: 1000, MemoryMiB: 1024}
	for i := 0; i < k; i++ {
		a.GPUs = append(a.GPUs, v.Node.GPUs[i].UUID)
	}
	v.Ledger.Allocations[id] = a
	v.LedgerRevision = 7
	return v
}

// req builds a pending session of g GPUs.
func req(id, owner string, g int, age time.Duration) Pending {
	return Pending{Revision: 1, Entry: &state.QueueEntry{
		Session: id, Kind: state.KindBatch, Owner: owner, Created: t0.Add(-age), Enqueued: t0.Add(-age),
		Request: state.Resources{GPUs: g, CPUMilli: 1000, MemoryMiB: 1024},
	}}
}

func snap(nodes []NodeView, pending ...Pending) *Snapshot {
	return &Snapshot{Nodes: nodes, Pending: pending, Now: t0}
}

// heldFor is the nodes plan holds for session id, by name.
func heldFor(plan *Plan, id string) []string {
	var held []string
	for n, holder := range plan.Reserved {
		if holder == id {
			held = append(held, n)
		}
	}
	slices.Sort(held)
	return held
}
