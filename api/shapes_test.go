package api

import (
	"fmt"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

func shapeNode(name string, gpus int, model string, labels map[string]string) state.Node {
	n := state.Node{Name: name, Address: "10.0.0." + name, Agent: "v-" + name, Labels: labels, CPUMilli: 64000, MemoryMiB: 1 << 19}
	for i := 0; i < gpus; i++ {
		n.GPUs = append(n.GPUs, state.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: model, MemoryMiB: 81920, Healthy: true})
	}
	for i := range n.GPUs {
		for j := range n.GPUs {
			if i != j {
				n.GPUs[i].NVLinkPeers = append(n.GPUs[i].NVLinkPeers, n.GPUs[j].UUID)
			}
		}
	}
	return n
}

// TestShapeKey: nodes that differ only in name, address, agent, device
// UUIDs and PCI addresses share a shape; a difference in what a request could get (labels,
// model, GPU count, NVLink wiring, health) makes another.
func TestShapeKey(t *testing.T) {
	base := shapeKey(shapeNode("a", 8, "A100", nil))
	if got := shapeKey(shapeNode("b", 8, "A100", nil)); got != base {
		t.Errorf("same hardware, other names: shapes differ:\n%s\n%s", base, got)
	}
	rebused := shapeNode("h", 8, "A100", nil)
	for i := range rebused.GPUs {
		rebused.GPUs[i].PCIBusID = fmt.Sprintf("0000:%02x:00.0", 0x40+i)
	}
	if got := shapeKey(rebused); got != base {
		t.Errorf("same hardware, other PCI addresses: shapes differ:\n%s\n%s", base, got)
	}
	unwired := shapeNode("c", 8, "A100", nil)
	unwired.GPUs[0].NVLinkPeers = nil
	sick := shapeNode("d", 8, "A100", nil)
	sick.GPUs[3].Healthy = false
	for name, n := range map[string]state.Node{
		"labels":  shapeNode("e", 8, "A100", map[string]string{"zone": "x"}),
		"model":   shapeNode("f", 8, "H100", nil),
		"gpus":    shapeNode("g", 4, "A100", nil),
		"nvlink":  unwired,
		"healthy": sick,
	} {
		if shapeKey(n) == base {
			t.Errorf("%s differs, yet the shape is the same", name)
		}
	}
}
