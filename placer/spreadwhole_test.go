package placer

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// spreadCluster is 20 8-GPU nodes (spread keeps blocks from 20 nodes
// on): "empty" runs nothing, "half" runs a 4-GPU session, "two" a 6-GPU
// one, "one" a 7-GPU one, "big" an 8-GPU session, and 15 more are full.
// The 8-GPU and 4-GPU sessions were queued wholeAgo and halfAgo before
// the snapshot.
func spreadCluster(wholeAgo, halfAgo time.Duration) []NodeView {
	queued := func(v NodeView, id string, ago time.Duration) NodeView {
		a := v.Ledger.Allocations[id]
		a.Queued = t0.Add(-ago)
		v.Ledger.Allocations[id] = a
		return v
	}
	nodes := []NodeView{
		queued(holding(view(gpuNode("big", 8, "A100")), "s-big", "ada", 8), "s-big", wholeAgo),
		view(gpuNode("empty", 8, "A100")),
		queued(holding(view(gpuNode("half", 8, "A100")), "s-half", "ada", 4), "s-half", halfAgo),
		holding(view(gpuNode("one", 8, "A100")), "s-one", "ada", 7),
		holding(view(gpuNode("two", 8, "A100")), "s-two", "ada", 6),
	}
	for i := 0; len(nodes) < 20; i++ {
		id := fmt.Sprintf("full%02d", i)
		nodes = append(nodes, holding(view(gpuNode(id, 8, "A100")), "s-"+id, "carl", 8))
	}
	return nodes
}

// TestSpreadKeepsBlocksForLargeArrivals: under spread, a 1-GPU request
// goes to the emptiest node that keeps the free blocks larger requests
// are arriving for. With 8- and 4-GPU sessions queued within the last
// hour it takes the node with 2 GPUs free, not the empty node nor the
// one with half its GPUs free; with only 8-GPU arrivals, the node with 4
// free (the emptiest in use; the standing reserve keeps "empty" too);
// with neither, the empty node. Spread before spreadwhole.go fails the
// first case and the queued 4-GPU one below ("half": the emptiest node
// the reserve leaves). Below 20 nodes, or with holds off, spread is as
// before.
func TestSpreadKeepsBlocksForLargeArrivals(t *testing.T) {
	for _, c := range []struct {
		name              string
		wholeAgo, halfAgo time.Duration
		want              string
	}{
		{"8- and 4-GPU arrivals", 20 * time.Minute, 30 * time.Minute, "two"},
		{"8-GPU arrivals only", 20 * time.Minute, 3 * time.Hour, "half"},
		{"no large arrivals", 2 * time.Hour, 3 * time.Hour, "empty"},
	} {
		t.Run(c.name, func(t *testing.T) {
			plan := NewPlan(snap(spreadCluster(c.wholeAgo, c.halfAgo), req("small", "bob", 1, time.Minute)), PlanOptions{Strategy: Spread, ReserveAfter: 10 * time.Minute})
			if len(plan.Bound) != 1 || plan.Bound[0].Parts[0].Node != c.want {
				t.Fatalf("bound %v, want the 1-GPU request on %s", plan.Bound, c.want)
			}
		})
	}
	// A waiting request counts as an arrival: with a 4-GPU request in the
	// queue and no session queued within the hour, the 1-GPU request
	// goes to "two", keeping "half"; the 4-GPU request itself, with no
	// whole-machine request about, spreads onto the empty node.
	plan := NewPlan(snap(spreadCluster(2*time.Hour, 3*time.Hour), req("small", "bob", 1, time.Minute), req("quad", "carl", 4, 0)), PlanOptions{Strategy: Spread, ReserveAfter: 10 * time.Minute})
	got := map[string]string{}
	for _, d := range plan.Bound {
		got[d.Pending.Entry.Session] = d.Parts[0].Node
	}
	if got["small"] != "two" || got["quad"] != "empty" {
		t.Fatalf("bound %v, want small on two and quad on empty", got)
	}
	// Below 20 nodes, and with holds off, spread is as before.
	small := spreadCluster(20*time.Minute, 30*time.Minute)[:19]
	plan = NewPlan(snap(small, req("small", "bob", 1, time.Minute)), PlanOptions{Strategy: Spread, ReserveAfter: 10 * time.Minute})
	if len(plan.Bound) != 1 || plan.Bound[0].Parts[0].Node != "empty" {
		t.Fatalf("19 nodes: bound %v, want the 1-GPU request on empty", plan.Bound)
	}
	plan = NewPlan(snap(spreadCluster(20*time.Minute, 30*time.Minute), req("small", "bob", 1, time.Minute)), PlanOptions{Strategy: Spread})
	if len(plan.Bound) != 1 || plan.Bound[0].Parts[0].Node != "empty" {
		t.Fatalf("holds off: bound %v, want the 1-GPU request on empty", plan.Bound)
	}
	// Binpack is unchanged: the fullest node that fits.
	plan = NewPlan(snap(spreadCluster(20*time.Minute, 30*time.Minute), req("small", "bob", 1, time.Minute)), PlanOptions{Strategy: Binpack, ReserveAfter: 10 * time.Minute})
	if len(plan.Bound) != 1 || plan.Bound[0].Parts[0].Node != "one" {
		t.Fatalf("binpack bound %v, want the 1-GPU request on one", plan.Bound)
	}
}

// TestSpreadOrder: the buckets spread visits, by band.
func TestSpreadOrder(t *testing.T) {
	for _, c := range []struct {
		g, top int
		levels []int
		want   []int
	}{
		{1, 8, nil, []int{8, 7, 6, 5, 4, 3, 2, 1}},
		{1, 8, []int{8}, []int{7, 6, 5, 4, 3, 2, 1, 8}},
		{1, 8, []int{4, 8}, []int{3, 2, 1, 7, 6, 5, 4, 8}},
		{4, 8, []int{4, 8}, []int{7, 6, 5, 4, 8}},
		{8, 8, []int{4, 8}, []int{8}},
		{2, 5, []int{4, 8}, []int{3, 2, 5, 4}}, // no empty node: the top bucket is 5
		{1, 3, []int{4, 8}, []int{3, 2, 1}},
	} {
		if got := spreadOrder(c.g, c.top, c.levels); !slices.Equal(got, c.want) {
			t.Errorf("spreadOrder(%d, %d, %v) = %v, want %v", c.g, c.top, c.levels, got, c.want)
		}
	}
}

// TestSpreadPacksABacklog: while the queue asks for more whole GPUs than
// are free, spread places as binpack does. The cluster of
// TestSpreadKeepsBlocksForLargeArrivals has 15 GPUs free; with a 1-GPU
// request and one 8-GPU request waiting (9 GPUs) the 1-GPU request goes
// to "two" as there (spread's bands), with two 8-GPU requests (17) to
// "one", the fullest node that fits, and its decision's score is
// binpack's. Below 20 nodes spread keeps no blocks and does not pack.
func TestSpreadPacksABacklog(t *testing.T) {
	opt := PlanOptions{Strategy: Spread, ReserveAfter: 10 * time.Minute}
	nodeOf := func(plan *Plan, session string) (string, map[string]float64) {
		for _, d := range plan.Bound {
			if d.Pending.Entry.Session == session {
				return d.Parts[0].Node, d.Parts[0].Scores
			}
		}
		return "", nil
	}
	cluster := spreadCluster(20*time.Minute, 30*time.Minute)
	plan := NewPlan(snap(cluster, req("small", "bob", 1, time.Minute), req("octo-1", "dave", 8, 0)), opt)
	if n, _ := nodeOf(plan, "small"); n != "two" {
		t.Fatalf("9 GPUs asked, 15 free: small on %q, want two (bound %v)", n, plan.Bound)
	}
	plan = NewPlan(snap(cluster, req("small", "bob", 1, time.Minute), req("octo-1", "dave", 8, 0), req("octo-2", "erin", 8, 0)), opt)
	n, scores := nodeOf(plan, "small")
	if n != "one" {
		t.Fatalf("17 GPUs asked, 15 free: small on %q, want one (bound %v)", n, plan.Bound)
	}
	if _, ok := scores["binpack"]; !ok {
		t.Errorf("17 GPUs asked: small's scores %v, want binpack's", scores)
	}
	plan = NewPlan(snap(cluster[:19], req("small", "bob", 1, time.Minute), req("octo-1", "dave", 8, 0), req("octo-2", "erin", 8, 0)), opt)
	if n, _ := nodeOf(plan, "small"); n != "empty" {
		t.Fatalf("19 nodes: small on %q, want empty (bound %v)", n, plan.Bound)
	}
}
