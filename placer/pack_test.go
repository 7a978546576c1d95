package placer

import (
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// ending returns v with its allocation id ending at t (max runtime).
func ending(v NodeView, id string, t time.Time) NodeView {
	a := v.Ledger.Allocations[id]
	a.Ends = t
	v.Ledger.Allocations[id] = a
	return v
}

// TestPackPlacesBesideTheLongestRunning: a 1-GPU session of 4 h max
// runtime. Binpack takes the fullest node ("soon", whose 7 GPUs' session
// ends in 10 minutes), which then stays on for 4 hours more; pack takes
// the node whose session runs 8 hours ("late"), so that "soon" empties in
// 10 minutes. Neither starts the empty node. With nothing in use that
// fits, pack starts an empty node; a session without a max runtime goes
// beside one that has none.
func TestPackPlacesBesideTheLongestRunning(t *testing.T) {
	nodes := func() []NodeView {
		return []NodeView{
			ending(holding(view(gpuNode("soon", 8, "A100")), "x", "bob", 7), "x", t0.Add(10*time.Minute)),
			ending(holding(view(gpuNode("late", 8, "A100")), "y", "bob", 4), "y", t0.Add(8*time.Hour)),
			view(gpuNode("empty", 8, "A100")),
		}
	}
	withLimit := func(p Pending, d time.Duration) Pending { p.Entry.MaxRuntime = state.Duration(d); return p }
	for _, tc := range []struct {
		strategy Strategy
		want     string
	}{{Binpack, "soon"}, {Pack, "late"}} {
		p := NewPlan(snap(nodes(), withLimit(req("s1", "ada", 1, 0), 4*time.Hour)), PlanOptions{Strategy: tc.strategy})
		if len(p.Bound) != 1 || p.Bound[0].Parts[0].Node != tc.want {
			t.Fatalf("%s: plan %+v, want s1 on %s", tc.strategy, p.Bound, tc.want)
		}
		if _, ok := p.Bound[0].Parts[0].Scores[string(tc.strategy)]; !ok {
			t.Errorf("%s: binding scores %v do not name the strategy", tc.strategy, p.Bound[0].Parts[0].Scores)
		}
	}
	// No node in use fits 5 GPUs: pack starts the empty node.
	p := NewPlan(snap(nodes(), withLimit(req("s2", "ada", 5, 0), time.Hour)), PlanOptions{Strategy: Pack})
	if len(p.Bound) != 1 || p.Bound[0].Parts[0].Node != "empty" {
		t.Fatalf("pack: plan %+v, want s2 on empty", p.Bound)
	}
	// A session without a max runtime: beside the one that has none.
	ns := nodes()
	ns[0] = holding(view(gpuNode("soon", 8, "A100")), "x", "bob", 7) // no end
	p = NewPlan(snap(ns, req("s3", "ada", 1, 0)), PlanOptions{Strategy: Pack})
	if len(p.Bound) != 1 || p.Bound[0].Parts[0].Node != "soon" {
		t.Fatalf("pack: plan %+v, want s3 beside the session of unknown length on soon", p.Bound)
	}
}

// TestPackNeverStartsAnEmptyNodeWhileOneInUseFits: on random clusters and
// queues, every session pack places on a node that ran nothing had no
// node in use, at its turn, that fitted it; checked by replaying the
// plan's decisions in order.
func TestPackNeverStartsAnEmptyNodeWhileOneInUseFits(t *testing.T) {
	for seed := int64(1); seed <= 60; seed++ {
		var nodes []NodeView
		for i := 0; i < 6; i++ {
			v := view(gpuNode(string(rune('a'+i)), 8, "A100"))
			if k := int(seed+int64(i)) % 9; k > 0 && k < 8 && i%2 == 0 {
				v = ending(holding(v, "held"+string(rune('a'+i)), "bob", k), "held"+string(rune('a'+i)), t0.Add(time.Duration(k)*time.Hour))
			}
			nodes = append(nodes, v)
		}
		var pending []Pending
		for j := 0; j < 8; j++ {
			g := 1 + int(seed*int64(j+3))%4
			pending = append(pending, req("s"+string(rune('0'+j)), "ada", g, time.Duration(10-j)*time.Minute))
		}
		plan := NewPlan(snap(nodes, pending...), PlanOptions{Strategy: Pack})
		used := map[string]int{}
		for _, v := range nodes {
			for _, a := range v.Ledger.Allocations {
				used[v.Node.Name] += len(a.GPUs)
			}
		}
		for _, d := range plan.Bound {
			pt := d.Parts[0]
			g := len(pt.Devices)
			if used[pt.Node] == 0 {
				for _, v := range nodes {
					if u := used[v.Node.Name]; u > 0 && u+g <= 8 {
						t.Fatalf("seed %d: %s (%d GPUs) started empty node %s while %s (%d used) fitted it", seed, d.Pending.Entry.Session, g, pt.Node, v.Node.Name, u)
					}
				}
			}
			used[pt.Node] += g
		}
	}
}
