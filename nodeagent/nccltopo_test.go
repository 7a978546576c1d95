package nodeagent_test

import (
	"encoding/xml"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// ncclFile is NCCL's topology XML as its xml.cc reads it, decoded here by
// a schema of the test's own (not the writer's types): the attributes
// NCCL requires of a system, CPU, PCI device and NVLink.
type ncclFile struct {
	XMLName xml.Name `xml:"system"`
	Version string   `xml:"version,attr"`
	Name    string   `xml:"name,attr"`
	CPUs    []struct {
		NUMAID string `xml:"numaid,attr"`
		PCI    []struct {
			BusID     string `xml:"busid,attr"`
			Class     string `xml:"class,attr"`
			LinkSpeed string `xml:"link_speed,attr"`
			LinkWidth string `xml:"link_width,attr"`
			GPUs      []struct {
				SM      string `xml:"sm,attr"`
				NVLinks []struct {
					Target string `xml:"target,attr"`
					Count  string `xml:"count,attr"`
					TClass string `xml:"tclass,attr"`
				} `xml:"nvlink"`
			} `xml:"gpu"`
		} `xml:"pci"`
	} `xml:"cpu"`
}

// parseNCCL decodes an NCCL topology file and returns, by GPU bus id, its
// NUMA node and the sorted bus ids of its NVLink targets. It fails the
// test on anything NCCL's parser would refuse or misread.
func parseNCCL(t *testing.T, b []byte) (ncclFile, map[string]string, map[string][]string) {
	t.Helper()
	s := string(b)
	if strings.HasPrefix(s, "<?xml") || strings.Contains(s, "\t") {
		t.Errorf("NCCL's parser reads neither an XML header nor tabs:\n%s", s)
	}
	var f ncclFile
	if err := xml.Unmarshal(b, &f); err != nil {
		t.Fatalf("parse NCCL topology: %v\n%s", err, s)
	}
	if f.Version != "1" {
		t.Errorf("system version %q; want 1 (NCCL_TOPO_XML_VERSION)", f.Version)
	}
	numa, links := map[string]string{}, map[string][]string{}
	for _, c := range f.CPUs {
		for _, p := range c.PCI {
			if !strings.HasPrefix(p.Class, "0x03") || p.LinkSpeed == "" || p.LinkWidth == "" || len(p.GPUs) != 1 {
				t.Errorf("pci %+v; want a GPU's (class 0x03…) with its link speed and width and one gpu", p)
				continue
			}
			numa[p.BusID] = c.NUMAID
			links[p.BusID] = []string{}
			for _, l := range p.GPUs[0].NVLinks {
				if l.Count == "" || !strings.HasPrefix(l.TClass, "0x03") {
					t.Errorf("nvlink %+v of %s; want a count and a GPU's class", l, p.BusID)
				}
				links[p.BusID] = append(links[p.BusID], l.Target)
			}
			slices.Sort(links[p.BusID])
		}
	}
	return f, numa, links
}

// TestNCCLTopologyOfBoundGPUs writes NCCL's topology for bindings of the
// mock DGX A100 (NVLink pairs 0↔1, 2↔3, …; NUMA 0 for GPUs 0-3) and
// parses it back: exactly the bound GPUs, each under its NUMA node's CPU,
// with an NVLink to exactly its bound NVLink peers; none for a MIG device
// or an empty binding.
func TestNCCLTopologyOfBoundGPUs(t *testing.T) {
	gpus, err := nodeagent.ReadNVML(dgx())
	if err != nil {
		t.Fatal(err)
	}
	u := func(i int) string { return gpus[i].UUID }
	bus := func(i int) string { return fmt.Sprintf("0000:%02x:00.0", 0x10+i) }
	for _, tc := range []struct {
		name  string
		bound []int
		links map[string][]string
		numa  map[string]string
	}{
		{"one NVLink pair", []int{2, 3}, map[string][]string{bus(2): {bus(3)}, bus(3): {bus(2)}}, map[string]string{bus(2): "0", bus(3): "0"}},
		{"GPUs of two pairs, no link between them", []int{1, 2}, map[string][]string{bus(1): {}, bus(2): {}}, map[string]string{bus(1): "0", bus(2): "0"}},
		{"two pairs across NUMA nodes", []int{0, 5, 1, 4}, map[string][]string{bus(0): {bus(1)}, bus(1): {bus(0)}, bus(4): {bus(5)}, bus(5): {bus(4)}},
			map[string]string{bus(0): "0", bus(1): "0", bus(4): "1", bus(5): "1"}},
		{"half a pair", []int{6}, map[string][]string{bus(6): {}}, map[string]string{bus(6): "1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var uuids []string
			for _, i := range tc.bound {
				uuids = append(uuids, u(i))
			}
			b, ok, err := nodeagent.Topology("gpu-01", false, gpus, uuids).NCCLXML()
			if err != nil || !ok {
				t.Fatalf("NCCLXML: ok %v, %v", ok, err)
			}
			f, numa, links := parseNCCL(t, b)
			if fmt.Sprint(links) != fmt.Sprint(tc.links) || fmt.Sprint(numa) != fmt.Sprint(tc.numa) {
				t.Errorf("GPUs' NVLink targets %v, NUMA nodes %v; want %v, %v\n%s", links, numa, tc.links, tc.numa, b)
			}
			if f.Name != "voyager gpu-01" || f.CPUs[0].PCI[0].GPUs[0].SM != "80" {
				t.Errorf("name %q, sm %q; want voyager gpu-01, 80 (the mock's A100)", f.Name, f.CPUs[0].PCI[0].GPUs[0].SM)
			}
		})
	}
	for name, uuids := range map[string][]string{"a MIG device": {"MIG-7-1"}, "no GPU": nil} {
		if b, ok, err := nodeagent.Topology("gpu-01", false, gpus, uuids).NCCLXML(); ok || err != nil || b != nil {
			t.Errorf("%s: NCCLXML = %q, %v, %v; want nothing to write", name, b, ok, err)
		}
	}

	// A simulated inventory's file says so, and its made-up GPUs all link.
	sim, _ := nodeagent.SimulatedGPUs("sim-01", "4xH100-80GB")
	b, ok, err := nodeagent.Topology("sim-01", true, sim, []string{sim[3].UUID, sim[0].UUID}).NCCLXML()
	if err != nil || !ok {
		t.Fatalf("simulated NCCLXML: %v, %v", ok, err)
	}
	f, numa, links := parseNCCL(t, b)
	if f.Name != "voyager sim-01 (simulated)" || fmt.Sprint(links) != fmt.Sprint(map[string][]string{bus(0): {bus(3)}, bus(3): {bus(0)}}) ||
		fmt.Sprint(numa) != fmt.Sprint(map[string]string{bus(0): "0", bus(3): "1"}) {
		t.Errorf("simulated: name %q, links %v, NUMA %v\n%s", f.Name, links, numa, b)
	}
}

// TestContainerSpecNCCLTopoFile: a container of whole GPUs gets NCCL's
// topology mounted read-only and NCCL_TOPO_FILE naming it, unless the
// session sets NCCL_TOPO_FILE itself (its own file wins, the agent's is
// still mounted); one of MIG devices, or of no GPU, gets neither.
func TestContainerSpecNCCLTopoFile(t *testing.T) {
	gpus, _ := nodeagent.SimulatedGPUs(node, "2xA100-80GB")
	a := nodeagent.New(nodeagent.Config{Node: node, Image: "img", GPUs: gpus, Simulated: true, LogDir: t.TempDir()})
	mounted := func(spec runtime.Spec) bool {
		return slices.ContainsFunc(spec.Mounts, func(m runtime.Mount) bool { return m.Target == nodeagent.NCCLTopoPath && m.ReadOnly })
	}
	for _, tc := range []struct {
		name      string
		env       map[string]string
		gpus      []string
		wantMount bool
		wantEnv   string
	}{
		{"two GPUs", nil, []string{gpus[0].UUID, gpus[1].UUID}, true, nodeagent.NCCLTopoPath},
		{"the session's own file", map[string]string{"NCCL_TOPO_FILE": "/home/jovyan/topo.xml"}, []string{gpus[0].UUID}, true, "/home/jovyan/topo.xml"},
		{"a MIG device", nil, []string{"MIG-x"}, false, ""},
		{"no GPU", nil, nil, false, ""},
	} {
		spec, err := a.ContainerSpec(state.Session{ID: "s", Owner: "ada", Kind: state.KindBatch, Env: tc.env},
			state.Binding{Session: "s", GPUs: tc.gpus, QueueRevision: 4, MemoryMiB: 100}, []string{"true"}, "")
		if err != nil {
			t.Fatal(err)
		}
		if mounted(spec) != tc.wantMount || spec.Env["NCCL_TOPO_FILE"] != tc.wantEnv {
			t.Errorf("%s: NCCL topology mounted %v, NCCL_TOPO_FILE %q; want %v, %q", tc.name, mounted(spec), spec.Env["NCCL_TOPO_FILE"], tc.wantMount, tc.wantEnv)
		}
	}
}
