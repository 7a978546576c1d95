package placer

import (
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

func TestFilters(t *testing.T) {
	base := gpuNode("n1", 4, "NVIDIA A100-SXM4-80GB")
	cordoned := view(base)
	cordoned.Cordon = &state.Cordon{Node: "n1", Reason: "fan"}
	labelled := view(base)
	labelled.Node.Labels = map[string]string{"zone": "a"}
	half := holding(view(base), "x", "bob", 2)
	mig := base
	mig.GPUs = append([]state.GPU(nil), base.GPUs...)
	mig.GPUs[0].MIGEnabled = true
	mig.GPUs[0].MIGDevices = []state.MIGDevice{{UUID: "MIG-a", Profile: "1g.10gb", MemoryMiB: 9856}, {UUID: "MIG-b", Profile: "1g.10gb", MemoryMiB: 9856}}
	noPorts := view(base)
	noPorts.Node.Ports = state.PortRange{First: 40000, Last: 40000}

	for _, tc := range []struct {
		name   string
		node   NodeView
		req    state.Resources
		ports  int
		filter string // "" means feasible
		msg    string
	}{
		{"fits", view(base), state.Resources{GPUs: 4, CPUMilli: 1000}, 0, "", ""},
		{"cordoned", cordoned, state.Resources{GPUs: 1}, 0, "cordon", "cordoned (fan)"},
		{"label missing", view(base), state.Resources{NodeSelector: map[string]string{"zone": "a"}}, 0, "labels", "lacks label zone=a"},
		{"label present", labelled, state.Resources{NodeSelector: map[string]string{"zone": "a"}}, 0, "", ""},
		{"label differs", labelled, state.Resources{NodeSelector: map[string]string{"zone": "b"}}, 0, "labels", "zone=b"},
		{"too many gpus", half, state.Resources{GPUs: 3}, 0, "gpus", "has 2 free, needs 3"},
		{"model pattern", view(base), state.Resources{GPUs: 1, GPUModel: "*H100*"}, 0, "gpus", "has 0 free"},
		{"model pattern matches", view(base), state.Resources{GPUs: 1, GPUModel: "*A100*"}, 0, "", ""},
		{"gpu memory", view(base), state.Resources{GPUs: 1, GPUMemoryMiB: 90000}, 0, "gpus", "has 0 free"},
		{"cpu", view(base), state.Resources{CPUMilli: 200000}, 0, "cpu", "128 cores free, needs 200 cores"},
		{"memory", view(base), state.Resources{MemoryMiB: 2 << 20}, 0, "memory", "needs 2097152 MiB"},
		{"mig profile", view(mig), state.Resources{GPUs: 2, MIGProfile: "1g.10gb"}, 0, "", ""},
		{"mig profile short", view(mig), state.Resources{GPUs: 3, MIGProfile: "1g.10gb"}, 0, "gpus", "has 2 free, needs 3"},
		{"mig gpu not whole", view(mig), state.Resources{GPUs: 4}, 0, "gpus", "has 3 free, needs 4"},
		{"ports", noPorts, state.Resources{}, 2, "ports", "no 2 free ports"},
		{"cpu only", half, state.Resources{CPUMilli: 1000, MemoryMiB: 10}, 1, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := newNodeState(&tc.node)
			s := feasible(&part{req: &tc.req, ports: tc.ports, id: "s"}, n)
			if tc.filter == "" {
				if s != nil {
					t.Fatalf("want feasible, got %s: %s", s.Filter, s.Message)
				}
				return
			}
			if s == nil || s.Filter != tc.filter {
				t.Fatalf("want filter %q, got %+v", tc.filter, s)
			}
			if !strings.Contains(s.Message, tc.msg) {
				t.Errorf("message %q does not say %q", s.Message, tc.msg)
			}
		})
	}
}

func TestReservedFilter(t *testing.T) {
	v := view(gpuNode("n1", 8, "A100"))
	n := newNodeState(&v)
	n.reservedFor = "old"
	r := state.Resources{GPUs: 1}
	if s := feasible(&part{req: &r, id: "young"}, n); s == nil || s.Filter != "reserved" {
		t.Errorf("reserved node accepted another session: %+v", s)
	}
	if s := feasible(&part{req: &r, id: "old"}, n); s != nil {
		t.Errorf("reserved node refused its holder: %+v", s)
	}
}

func TestValidateModelPattern(t *testing.T) {
	if err := ValidateModelPattern("*A100*"); err != nil {
		t.Error(err)
	}
	if err := ValidateModelPattern("[A100"); err == nil || !strings.Contains(err.Error(), "*A100*") {
		t.Errorf("bad pattern error = %v", err)
	}
}

func TestScores(t *testing.T) {
	full := holding(view(gpuNode("full", 8, "A100")), "x", "bob", 6)
	empty := view(gpuNode("empty", 8, "A100"))
	r := state.Resources{GPUs: 2}
	pt := &part{req: &r, id: "s"}
	nf, ne := newNodeState(&full), newNodeState(&empty)
	if got := scoreBinpack(pt, nf, nil); got != 1 {
		t.Errorf("binpack on a node left full = %v, want 1", got)
	}
	if got := scoreBinpack(pt, ne, nil); got != 0.25 {
		t.Errorf("binpack on an empty node = %v, want 0.25", got)
	}
	for _, tc := range []struct {
		name string
		devs []int
		want float64
	}{
		{"one gpu", []int{0}, 1},
		{"nvlink pair", []int{0, 1}, 1},
		{"across numa", []int{0, 7}, 0},
		{"four in one half", []int{0, 1, 2, 3}, 1},
	} {
		if got := scoreLocality(pt, ne, tc.devs); got != tc.want {
			t.Errorf("%s: locality = %v, want %v", tc.name, got, tc.want)
		}
	}
	// Same NUMA, no NVLink: half score.
	v := view(gpuNode("pcie", 4, "L4"))
	for i := range v.Node.GPUs {
		v.Node.GPUs[i].NVLinkPeers = nil
	}
	if got := scoreLocality(pt, newNodeState(&v), []int{0, 1}); got != 0.5 {
		t.Errorf("same-NUMA PCIe pair = %v, want 0.5", got)
	}
}

func TestChooseDevicesPrefersOneNUMADomain(t *testing.T) {
	v := holding(view(gpuNode("n", 8, "A100")), "x", "bob", 1) // GPU 0 taken: NUMA 0 has 3 free, NUMA 1 has 4
	n := newNodeState(&v)
	for _, tc := range []struct {
		g    int
		numa int
	}{{2, 0}, {3, 0}, {4, 1}} {
		devs := chooseDevices(n, &state.Resources{GPUs: tc.g})
		if len(devs) != tc.g {
			t.Fatalf("chose %v for %d GPUs", devs, tc.g)
		}
		for _, d := range devs {
			if n.devices[d].numa != tc.numa || n.taken[d] {
				t.Errorf("%d GPUs: chose %v, want all free and on NUMA %d (the fullest that fits)", tc.g, devs, tc.numa)
			}
		}
	}
	if devs := chooseDevices(n, &state.Resources{GPUs: 7}); len(devs) != 7 {
		t.Errorf("7 GPUs across NUMA: %v", devs)
	}
	if devs := chooseDevices(n, &state.Resources{GPUs: 8}); devs != nil {
		t.Errorf("8 GPUs with 7 free: %v", devs)
	}
}

// TestFitsAgreesWithFeasible checks fits, the filters' tests without
// their reasons (what best asks of each candidate), against feasible on
// every pair of a set of nodes (free, partly used, cordoned, labelled,
// held or kept for another, short of ports, CPU or memory, with MIG
// devices or shared GPUs) and of requests of every kind and size.
func TestFitsAgreesWithFeasible(t *testing.T) {
	base := gpuNode("n1", 8, "NVIDIA A100-SXM4-80GB")
	var views []NodeView
	for k := 0; k <= 8; k += 2 {
		views = append(views, holding(view(base), "x", "bob", k))
	}
	cordoned := view(base)
	cordoned.Cordon = &state.Cordon{Node: "n1"}
	labelled := view(base)
	labelled.Node.Labels = map[string]string{"zone": "a"}
	fewPorts := holding(view(base), "x", "bob", 3)
	fewPorts.Node.Ports = state.PortRange{First: 40000, Last: 40001}
	small := view(base)
	small.Node.CPUMilli, small.Node.MemoryMiB = 2000, 4096
	mig := base
	for g := range 4 {
		mig = split(mig, g)
	}
	views = append(views, cordoned, labelled, fewPorts, small, view(mig), view(shareNode(base, 0, 1, 2, 3)))
	var reqs []state.Resources
	for _, g := range []int{0, 1, 2, 4, 5, 8} {
		reqs = append(reqs, state.Resources{GPUs: g, CPUMilli: 1000, MemoryMiB: 1024},
			state.Resources{GPUs: g, CPUMilli: 3000, MemoryMiB: 1024},
			state.Resources{GPUs: g, CPUMilli: 1000, MemoryMiB: 8192, NodeSelector: map[string]string{"zone": "a"}})
	}
	reqs = append(reqs, state.Resources{GPUs: 2, MIGProfile: "1g.10gb"}, state.Resources{GPUs: 9, MIGProfile: "1g.10gb"},
		state.Resources{GPUs: 1, GPUShareMiB: 20480}, state.Resources{GPUs: 1, GPUShareMiB: 200000}, state.Resources{GPUs: 1, GPUModel: "*H100*"})
	checked, refused := 0, 0
	for vi := range views {
		for _, held := range []string{"", "other", reserveMark} {
			n := newNodeState(&views[vi])
			n.reservedFor = held
			for ri := range reqs {
				for _, ports := range []int{0, 1, 3} {
					for _, backfill := range []bool{false, true} {
						pt := &part{req: &reqs[ri], ports: ports, id: "s", owner: "ann", backfill: backfill, ends: t0.Add(time.Hour), now: t0, below: backfill}
						s := feasible(pt, n)
						if got := fits(pt, n); got != (s == nil) {
							t.Fatalf("node %d held for %q, %+v with %d ports: fits %v, feasible says %+v", vi, held, reqs[ri], ports, got, s)
						}
						checked++
						if s != nil {
							refused++
						}
					}
				}
			}
		}
	}
	if refused == 0 || refused == checked {
		t.Fatalf("%d of %d pairs refused: the cases do not tell fits from its negation", refused, checked)
	}
}
