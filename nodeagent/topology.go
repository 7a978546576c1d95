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
	// PCIBusID is the GPU's PCI address ("0000:07:00.0"), the same inside
	// the container; empty for a MIG device or when NVML did not say.
	PCIBusID string `json:"pciBusId,omitempty"`
	// CUDACompute is the compute capability, major*10+minor; 0: unknown.
	CUDACompute int `json:"cudaCompute,omitempty"`
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
			e.Model, e.NUMANode, e.PCIBusID, e.CUDACompute = g.Model, g.NUMANode, g.PCIBusID, g.CUDACompute
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

// writeTopology writes container id's topology files of the devices
// uuids into the log directory: the JSON topology, and NCCL's XML when
// NCCL can use one (whole GPUs with known PCI addresses). It returns the
// paths; ncclFile is empty without an NCCL file.
func (a *Agent) writeTopology(id string, uuids []string) (file, ncclFile string, err error) {
	top := Topology(a.cfg.Node, a.cfg.Simulated, a.cfg.GPUs, uuids)
	b, err := json.Marshal(top)
	if err != nil {
		return "", "", fmt.Errorf("encode GPU topology: %w", err)
	}
	if err := os.MkdirAll(a.cfg.LogDir, 0o750); err != nil {
		return "", "", fmt.Errorf("write GPU topology: %w", err)
	}
	file = filepath.Join(a.cfg.LogDir, id+topologySuffix)
	if err := os.WriteFile(file, append(b, '\n'), 0o644); err != nil {
		return "", "", fmt.Errorf("write GPU topology: %w", err)
	}
	x, ok, err := top.NCCLXML()
	if err != nil || !ok {
		return file, "", err
	}
	ncclFile = filepath.Join(a.cfg.LogDir, id+ncclTopoSuffix)
	if err := os.WriteFile(ncclFile, x, 0o644); err != nil {
		return "", "", fmt.Errorf("write NCCL topology: %w", err)
	}
	return file, ncclFile, nil
}
