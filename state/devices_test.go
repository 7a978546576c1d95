package state_test

import (
	"reflect"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// TestHoldersArePhysicalFirst: a GPU held whole keeps its MIG devices from
// being free after the node splits it, a held MIG device keeps its GPU
// whole from being free after the node joins it (its sibling stays free),
// and a GPU its agent withheld is not free while its holder holds
// anything on the node.
func TestHoldersArePhysicalFirst(t *testing.T) {
	split := func(g state.GPU) state.GPU {
		g.MIGEnabled = true
		g.MIGDevices = []state.MIGDevice{{UUID: g.UUID + "-a", Profile: "3g.40gb"}, {UUID: g.UUID + "-b", Profile: "3g.40gb"}}
		return g
	}
	g0, g1, g2 := state.GPU{UUID: "GPU-0"}, state.GPU{UUID: "GPU-1"}, state.GPU{UUID: "GPU-2"}
	withheld := g2
	withheld.HeldBy = "w"
	n := state.Node{Name: "n", GPUs: []state.GPU{split(g0), g1, withheld}}
	l := state.Ledger{Node: "n", Allocations: map[string]state.Allocation{
		"whole": {GPUs: []string{"GPU-0"}},                                                   // bound before GPU 0 was split
		"part":  {GPUs: []string{"GPU-1-a"}, Parents: map[string]string{"GPU-1-a": "GPU-1"}}, // bound before GPU 1 was joined
		"w":     {CPUMilli: 100},
	}}
	want := map[string]string{"GPU-0-a": "whole", "GPU-0-b": "whole", "GPU-1": "part", "GPU-2": "w"}
	if got := state.Holders(n, l); !reflect.DeepEqual(got, want) {
		t.Errorf("Holders = %v, want %v", got, want)
	}
	// Two MIG devices of one GPU exclude only themselves.
	n = state.Node{Name: "n", GPUs: []state.GPU{split(g0)}}
	l = state.Ledger{Node: "n", Allocations: map[string]state.Allocation{"x": {GPUs: []string{"GPU-0-a"}}}}
	if got := state.Holders(n, l); !reflect.DeepEqual(got, map[string]string{"GPU-0-a": "x"}) {
		t.Errorf("Holders of a split GPU with one MIG device held = %v, want GPU-0-a only", got)
	}
}
