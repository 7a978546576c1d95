package nodeagent

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/voyager-gpu/voyager/state"
)

// TopologyPath is where a container with GPUs finds its GPU topology file
// (read-only); VOYAGER_GPU_TOPOLOGY names it.
const TopologyPath = "/etc/voyager/gpu-topology.json"

// topologySuffix ends the name of a container's topology file in the log
// directory, next to its log, and pruned with it.
const topologySuffix = ".gpu-topology.json"

// GPUTopology is a container's GPU topology file: the GPUs of its binding
// on this node, in the binding's order, and which of them reach each
// other over NVLink, as the node's inventory (NVML) says.
type GPUTopology struct {
	Node string `json:"node"`
	// Simulated marks a made-up inventory: its links say nothing real.
	Simulated bool          `json:"simulated,omitempty"`
	GPUs      []TopologyGPU `json:"gpus"`
}

// TopologyGPU is one GPU (or MIG device) of a container.
type TopologyGPU struct {
	// Index is the device's position among the container's GPUs.
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Model string `json:"model"`
	// MIGProfile is set for a MIG device; MIG devices have no NVLink peers.
	MIGProfile string `json:"migProfile,omitempty"`
	NUMANode   int    `json:"numaNode"`
	// NVLinkPeers are the indexes of the container's other GPUs this one
	// reaches over NVLink: never a GPU outside the binding.
	NVLinkPeers []int `json:"nvlinkPeers"`
}

// Topology returns the topology of the bound devices uuids among the
// node's gpus.
func Topology(node string, simulated bool, gpus []state.GPU, uuids []string) GPUTopology {
	t := GPUTopology{Node: node, Simulated: simulated, GPUs: make([]TopologyGPU, len(uuids))}
	byUUID := map[string]state.GPU{}
	for _, g := range gpus {
		byUUID[g.UUID] = g
	}
	for i, u := range uuids {
		e := TopologyGPU{Index: i, UUID: u, NVLinkPeers: []int{}}
		if g, ok := byUUID[u]; ok {
			e.Model, e.NUMANode = g.Model, g.NUMANode
			for j, v := range uuids {
				if j != i && slices.Contains(g.NVLinkPeers, v) {
					e.NVLinkPeers = append(e.NVLinkPeers, j)
				}
			}
		} else {
			for _, g := range gpus {
				for _, m := range g.MIGDevices {
					if m.UUID == u {
						e.Model, e.MIGProfile, e.NUMANode = g.Model, m.Profile, g.NUMANode
					}
				}
			}
		}
		t.GPUs[i] = e
	}
	return t
}

// writeTopology writes container id's topology file of the devices uuids
// and returns its path.
func (a *Agent) writeTopology(id string, uuids []string) (string, error) {
	b, err := json.Marshal(Topology(a.cfg.Node, a.cfg.Simulated, a.cfg.GPUs, uuids))
	if err != nil {
		return "", fmt.Errorf("encode GPU topology: %w", err)
	}
	if err := os.MkdirAll(a.cfg.LogDir, 0o750); err != nil {
		return "", fmt.Errorf("write GPU topology: %w", err)
	}
	p := filepath.Join(a.cfg.LogDir, id+topologySuffix)
	if err := os.WriteFile(p, append(b, '\n'), 0o644); err != nil {
		return "", fmt.Errorf("write GPU topology: %w", err)
	}
	return p, nil
}
