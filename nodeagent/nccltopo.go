package nodeagent

import (
	"encoding/xml"
	"fmt"
	goruntime "runtime"
	"slices"
	"strings"
)

// NCCLTopoPath is where a container with GPUs finds NCCL's topology file
// (read-only); NCCL_TOPO_FILE names it, unless the session set that
// variable itself.
const NCCLTopoPath = "/etc/voyager/nccl-topo.xml"

// ncclTopoSuffix ends the name of a container's NCCL topology file in
// the log directory, next to its log, and pruned with it.
const ncclTopoSuffix = ".nccl-topo.xml"

// NCCL's topology XML, as its src/graph/xml.cc reads it (version 1): a
// system of CPUs (NUMA nodes), each holding the PCI devices attached to
// it; a GPU's PCI device holds the GPU and its NVLinks, each naming the
// PCI address of the device at the far end and its class. Only what
// NCCL cannot learn inside a container (where /sys shows no PCI tree and
// NVML's NVLink peers may be hidden) is written; what it learns from its
// own process (the device's CUDA index "dev", its "rank", GPUDirect
// "gdr", the CPU's affinity and model) it fills in itself, because only
// the process knows them: a container's CUDA device 0 is not the host's
// GPU 0.
type ncclSystem struct {
	XMLName xml.Name  `xml:"system"`
	Version int       `xml:"version,attr"`
	Name    string    `xml:"name,attr,omitempty"`
	CPUs    []ncclCPU `xml:"cpu"`
}

type ncclCPU struct {
	NUMAID int       `xml:"numaid,attr"`
	Arch   string    `xml:"arch,attr,omitempty"`
	PCI    []ncclPCI `xml:"pci"`
}

type ncclPCI struct {
	BusID string `xml:"busid,attr"`
	// Class 0x0302xx is a 3D controller: NCCL takes any 0x03 as a GPU.
	Class  string `xml:"class,attr"`
	Vendor string `xml:"vendor,attr"`
	// The link to the CPU: NCCL weighs PCI paths by it. The inventory
	// does not record it; Gen4 x16 is what data-centre GPUs of the
	// A100 generation have, and NVLink outweighs it either way.
	LinkSpeed string  `xml:"link_speed,attr"`
	LinkWidth int     `xml:"link_width,attr"`
	GPU       ncclGPU `xml:"gpu"`
}

type ncclGPU struct {
	// SM is the compute capability (major*10+minor); left out when the
	// inventory does not know it, and NCCL asks the GPU.
	SM      int          `xml:"sm,attr,omitempty"`
	NVLinks []ncclNVLink `xml:"nvlink"`
}

type ncclNVLink struct {
	Target string `xml:"target,attr"`
	// Count is the number of links to Target. The inventory records
	// peers, not links, so it is 1: NCCL then counts less NVLink
	// bandwidth than there is, but still routes over NVLink.
	Count  int    `xml:"count,attr"`
	TClass string `xml:"tclass,attr"`
}

// ncclGPUClass is the PCI class NCCL's topology gives GPUs.
const ncclGPUClass = "0x030200"

// NCCLXML returns t as NCCL's topology XML (NCCL_TOPO_FILE): each GPU
// under its NUMA node's CPU, by PCI address, with an NVLink to each of
// its NVLink peers among t's GPUs and to no other. ok is false, with
// nothing to write, when NCCL could not use it: no GPU, a MIG device
// (NCCL does not run across MIG devices), or a GPU whose PCI address is
// unknown. A simulated inventory's file says so in its name.
func (t GPUTopology) NCCLXML() (out []byte, ok bool, err error) {
	if len(t.GPUs) == 0 {
		return nil, false, nil
	}
	sys := ncclSystem{Version: 1, Name: "voyager " + t.Node}
	if t.Simulated {
		sys.Name += " (simulated)"
	}
	arch := map[string]string{"amd64": "x86_64", "arm64": "arm64", "ppc64le": "ppc64"}[goruntime.GOARCH]
	for _, g := range t.GPUs {
		if g.MIGProfile != "" || g.PCIBusID == "" {
			return nil, false, nil
		}
		pci := ncclPCI{BusID: g.PCIBusID, Class: ncclGPUClass, Vendor: "0x10de", LinkSpeed: "16.0 GT/s PCIe", LinkWidth: 16,
			GPU: ncclGPU{SM: g.CUDACompute}}
		for _, p := range g.NVLinkPeers {
			pci.GPU.NVLinks = append(pci.GPU.NVLinks, ncclNVLink{Target: t.GPUs[p].PCIBusID, Count: 1, TClass: ncclGPUClass})
		}
		i := slices.IndexFunc(sys.CPUs, func(c ncclCPU) bool { return c.NUMAID == g.NUMANode })
		if i < 0 {
			sys.CPUs = append(sys.CPUs, ncclCPU{NUMAID: g.NUMANode, Arch: arch})
			i = len(sys.CPUs) - 1
		}
		sys.CPUs[i].PCI = append(sys.CPUs[i].PCI, pci)
	}
	// NCCL keeps a CPU's PCI devices in bus order.
	for _, c := range sys.CPUs {
		slices.SortFunc(c.PCI, func(a, b ncclPCI) int { return strings.Compare(a.BusID, b.BusID) })
	}
	slices.SortFunc(sys.CPUs, func(a, b ncclCPU) int { return a.NUMAID - b.NUMAID })
	// Indented with spaces and no <?xml?> header: NCCL's own parser skips
	// spaces and newlines between elements, but not tabs or a header.
	b, err := xml.MarshalIndent(sys, "", "  ")
	if err != nil {
		return nil, false, fmt.Errorf("encode NCCL topology: %w", err)
	}
	return append(b, '\n'), true, nil
}
