package nodeagent_test

import (
	"reflect"
	"testing"

	"github.com/voyager-gpu/voyager/nodeagent"
)

// TestTopologyOfBoundGPUs reads the mock DGX A100's inventory through NVML
// (NVLink pairs 0↔1, 2↔3, …) and checks the topology a container gets for
// different bindings: only its own GPUs, in the binding's order, with the
// links among them and none to GPUs outside it.
func TestTopologyOfBoundGPUs(t *testing.T) {
	gpus, err := nodeagent.ReadNVML(dgx())
	if err != nil {
		t.Fatal(err)
	}
	u := func(i int) string { return gpus[i].UUID }
	for _, tc := range []struct {
		name  string
		bound []string
		peers [][]int
		numa  []int
	}{
		{"one NVLink pair", []string{u(2), u(3)}, [][]int{{1}, {0}}, []int{0, 0}},
		{"the pair in the other order", []string{u(3), u(2)}, [][]int{{1}, {0}}, []int{0, 0}},
		{"GPUs of two pairs, no link between them", []string{u(1), u(2)}, [][]int{{}, {}}, []int{0, 0}},
		{"two pairs across NUMA nodes", []string{u(0), u(5), u(1), u(4)}, [][]int{{2}, {3}, {0}, {1}}, []int{0, 1, 0, 1}},
		{"a lone GPU", []string{u(6)}, [][]int{{}}, []int{1}},
		{"a MIG device", []string{"MIG-7-1"}, [][]int{{}}, []int{1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			top := nodeagent.Topology("gpu-01", false, gpus, tc.bound)
			if top.Node != "gpu-01" || top.Simulated || len(top.GPUs) != len(tc.bound) {
				t.Fatalf("topology %+v", top)
			}
			for i, g := range top.GPUs {
				if g.Index != i || g.UUID != tc.bound[i] || !reflect.DeepEqual(g.NVLinkPeers, tc.peers[i]) || g.NUMANode != tc.numa[i] {
					t.Errorf("GPU %d = %+v; want uuid %s, peers %v, NUMA %d", i, g, tc.bound[i], tc.peers[i], tc.numa[i])
				}
				if g.Model == "" {
					t.Errorf("GPU %d has no model", i)
				}
			}
		})
	}
	if mig := nodeagent.Topology("gpu-01", false, gpus, []string{"MIG-7-1"}).GPUs[0]; mig.MIGProfile != "1g.5gb" {
		t.Errorf("MIG device %+v; want profile 1g.5gb", mig)
	}
}
