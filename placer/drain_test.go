package placer

import (
	"maps"
	"strings"
	"testing"
	"time"
)

// TestHoldDrainsTheNodeFreeSoonest: an aged 8-GPU request holds the node
// whose sessions' max runtimes free it soonest, not the emptiest one; a
// node full of the holder's own sessions is not worth holding (it frees
// for its owner anyway), and a node whose sessions declare no max runtime
// comes after every node whose drain time is known, the emptiest of them
// first. Holding the emptiest node (the rule before drain.go) fails the
// first case: node "a" has 2 GPUs free, but its session runs 4 more hours.
func TestHoldDrainsTheNodeFreeSoonest(t *testing.T) {
	ends := func(v NodeView, id string, at time.Duration) NodeView {
		a := v.Ledger.Allocations[id]
		a.Ends = t0.Add(at)
		v.Ledger.Allocations[id] = a
		return v
	}
	a := ends(holding(view(gpuNode("a", 8, "A100")), "a1", "bob", 6), "a1", 4*time.Hour)    // 2 free, drains in 4 h
	b := ends(holding(view(gpuNode("b", 8, "A100")), "b1", "bob", 7), "b1", 30*time.Minute) // 1 free, drains in 30 min
	own := ends(holding(view(gpuNode("c", 8, "A100")), "c1", "ada", 8), "c1", 10*time.Minute)
	none3 := holding(view(gpuNode("d", 8, "A100")), "d1", "bob", 5) // 3 free, no max runtime
	none1 := holding(view(gpuNode("e", 8, "A100")), "e1", "bob", 7) // 1 free, no max runtime
	opt := PlanOptions{ReserveAfter: 10 * time.Minute}
	for _, tc := range []struct {
		name  string
		nodes []NodeView
		want  string
	}{
		{"the earliest drain, not the most free", []NodeView{a, b}, "b"},
		{"not a node of the holder's own sessions", []NodeView{b, own}, "b"},
		{"a known drain before an unknown one", []NodeView{none3, a}, "a"},
		{"unknown drains: the most free", []NodeView{none1, none3}, "d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []NodeView
			for _, v := range tc.nodes {
				v.Ledger.Allocations = maps.Clone(v.Ledger.Allocations)
				nodes = append(nodes, v)
			}
			plan := NewPlan(snap(nodes, req("big", "ada", 8, time.Hour)), opt)
			if len(plan.Bound) != 0 {
				t.Fatalf("bound %d sessions, want none (no node has 8 free)", len(plan.Bound))
			}
			held := heldFor(plan, "big")
			if len(held) != 1 || held[0] != tc.want {
				t.Fatalf("nodes held for the 8-GPU request: %v, want [%s]", held, tc.want)
			}
			if msg := plan.Waiting[0].Message; !strings.Contains(msg, "node "+tc.want+" (") {
				t.Errorf("reason %q does not name the held node %s", msg, tc.want)
			}
		})
	}
}
