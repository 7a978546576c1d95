package placer

import (
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// split returns n with GPU i partitioned into two 1g.10gb MIG devices.
func split(n state.Node, i int) state.Node {
	n.GPUs = append([]state.GPU(nil), n.GPUs...)
	g := &n.GPUs[i]
	g.MIGEnabled = true
	g.MIGDevices = []state.MIGDevice{{UUID: g.UUID + "-mig0", Profile: "1g.10gb", MemoryMiB: 9856}, {UUID: g.UUID + "-mig1", Profile: "1g.10gb", MemoryMiB: 9856}}
	return n
}

func migReq(id string, g int) Pending {
	p := req(id, "bob", g, 0)
	p.Entry.Request.MIGProfile = "1g.10gb"
	return p
}

// TestHeldDeviceOutlivesItsInventory is point 3 of issue 33: a node
// registers again with its GPU split into MIG devices while a session holds
// the whole GPU (or with MIG turned off while a session holds one of its
// MIG devices). What the ledger holds still counts against the physical
// GPU: the plan offers none of it, and refit (the bind's re-check against
// a newer ledger) refuses it. Before, the ledger's UUIDs that the new
// inventory lacked were ignored, and one physical GPU went to two sessions.
func TestHeldDeviceOutlivesItsInventory(t *testing.T) {
	whole := gpuNode("n", 1, "A100")
	gpu := whole.GPUs[0].UUID
	mig := split(whole, 0)
	holdsWhole := state.Allocation{Owner: "ada", Role: state.RoleSingle, GPUs: []string{gpu}, CPUMilli: 1000, MemoryMiB: 1024}
	holdsPart := state.Allocation{Owner: "ada", Role: state.RoleSingle, GPUs: []string{gpu + "-mig0"}, Parents: map[string]string{gpu + "-mig0": gpu}, CPUMilli: 1000, MemoryMiB: 1024}
	for _, tc := range []struct {
		name string
		node state.Node
		held state.Allocation
		ask  Pending
	}{
		{"whole GPU held, node now split into MIG devices", mig, holdsWhole, migReq("s", 1)},
		{"MIG device held, node now whole", whole, holdsPart, req("s", "bob", 1, 0)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := view(tc.node)
			v.Ledger.Allocations["held"] = tc.held
			p := NewPlan(snap([]NodeView{v}, tc.ask), PlanOptions{})
			if len(p.Bound) != 0 {
				t.Fatalf("bound %+v on a physical GPU that session held holds", p.Bound[0].Parts)
			}
			// The bind's own re-check refuses the same choice.
			dev := tc.node.GPUs[0].UUID
			if tc.node.GPUs[0].MIGEnabled {
				dev = tc.node.GPUs[0].MIGDevices[1].UUID
			}
			a := state.Allocation{Owner: "bob", GPUs: []string{dev}, CPUMilli: 1000, MemoryMiB: 1024}
			err := refit(&tc.node, &v.Ledger, "s", &a, 0)
			if err == nil || !strings.Contains(err.Error(), "held by session held") {
				t.Fatalf("refit of %s beside the held allocation = %v, want it refused", dev, err)
			}
		})
	}
}

// TestSiblingMIGDevicesStayFree: a held MIG device excludes its GPU whole,
// not the other MIG devices of that GPU; refit records the device's
// physical GPU in the allocation it accepts.
func TestSiblingMIGDevicesStayFree(t *testing.T) {
	n := split(gpuNode("n", 1, "A100"), 0)
	gpu := n.GPUs[0].UUID
	v := view(n)
	v.Ledger.Allocations["held"] = state.Allocation{Owner: "ada", GPUs: []string{gpu + "-mig0"}, CPUMilli: 1000, MemoryMiB: 1024}
	p := NewPlan(snap([]NodeView{v}, migReq("s", 1)), PlanOptions{})
	if len(p.Bound) != 1 || p.Bound[0].Parts[0].Devices[0] != gpu+"-mig1" {
		t.Fatalf("plan %+v, want s on the free sibling %s-mig1", p.Bound, gpu)
	}
	a := state.Allocation{Owner: "bob", GPUs: []string{gpu + "-mig1"}, CPUMilli: 1000, MemoryMiB: 1024}
	if err := refit(&n, &v.Ledger, "s", &a, 0); err != nil {
		t.Fatalf("refit of a free sibling: %v", err)
	}
	if a.Parents[gpu+"-mig1"] != gpu {
		t.Errorf("refit recorded parents %v, want %s-mig1 → %s", a.Parents, gpu, gpu)
	}
}

// TestWithheldGPUStaysTaken: a GPU its agent published as held by a
// session (state.GPU.HeldBy) offers none of its devices while that session
// holds anything on the node, and all of them once it holds nothing.
func TestWithheldGPUStaysTaken(t *testing.T) {
	n := split(gpuNode("n", 1, "A100"), 0)
	n.GPUs[0].HeldBy = "old"
	v := view(n)
	v.Ledger.Allocations["old"] = state.Allocation{Owner: "ada", CPUMilli: 1000, MemoryMiB: 1024}
	if p := NewPlan(snap([]NodeView{v}, migReq("s", 1)), PlanOptions{}); len(p.Bound) != 0 {
		t.Fatalf("bound %+v on a GPU withheld for a session that holds it", p.Bound[0].Parts)
	}
	a := state.Allocation{Owner: "bob", GPUs: []string{n.GPUs[0].MIGDevices[0].UUID}, CPUMilli: 1000, MemoryMiB: 1024}
	if err := refit(&n, &v.Ledger, "s", &a, 0); err == nil {
		t.Fatal("refit accepted a device of a withheld GPU")
	}
	delete(v.Ledger.Allocations, "old")
	if p := NewPlan(snap([]NodeView{v}, migReq("s", 2)), PlanOptions{}); len(p.Bound) != 1 {
		t.Fatalf("the GPU stayed withheld after its holder ended: %+v", p.Waiting)
	}
}
