package placer

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestResizeUnderWayKeepsItsClaim: a (2-8 GPUs) was decided to grow from
// 2 to 6 on n1 beside b (2-8, holding 2) and has been released, not yet
// bound again: its ledger entry is gone. PlanElastic counts it at 6 on n1
// (its claim), so b does not grow into the GPUs a is to run on; without
// the claim b took all 6 free GPUs and a waited. Where the plan binds a
// again, it counts once, where the plan puts it. A grow of b on a node
// with a claim names the claimant, for its warning to compare.
func TestResizeUnderWayKeepsItsClaim(t *testing.T) {
	n := func() NodeView { return view(gpuNode("n1", 8, "A100")) }
	b := ElasticJob{Session: "b", Min: 2, Max: 8, Ready: true}
	a := ElasticJob{Session: "a", Min: 2, Max: 8, Target: 6, Claim: "n1", Owner: "alice"}
	t.Run("released, not queued again: b does not grow into a's GPUs", func(t *testing.T) {
		s := snap([]NodeView{holdingAt(n(), "b", "bob", 0, 2)})
		rs := PlanElastic(s, NewPlan(s, PlanOptions{}), map[string]ElasticJob{"a": a, "b": b}, ElasticOptions{})
		if r, ok := resizeOf(rs, "b"); ok {
			t.Fatalf("b grows into the GPUs a's resize is to run on: %+v", r)
		}
		if _, ok := resizeOf(rs, "a"); ok {
			t.Fatalf("a's resize under way was decided again: %+v", rs)
		}
	})
	t.Run("a smaller target leaves the rest to b", func(t *testing.T) {
		s := snap([]NodeView{holdingAt(n(), "b", "bob", 0, 2)})
		small := a
		small.Target = 3
		rs := PlanElastic(s, NewPlan(s, PlanOptions{}), map[string]ElasticJob{"a": small, "b": b}, ElasticOptions{})
		r, ok := resizeOf(rs, "b")
		if !ok || r.To != 5 {
			t.Fatalf("b: %+v, want a grow from 2 to 5 (3 kept for a)", rs)
		}
		if !slices.Equal(r.Claims, []string{"a"}) || !strings.Contains(r.Why, "3 for a") {
			t.Fatalf("b's grow %+v: want a's claim named in Claims and Why", r)
		}
	})
	t.Run("queued again and bound by the plan: counted once", func(t *testing.T) {
		p := elasticReq("a", "alice", 2, 8, time.Minute)
		p.Entry.Elastic.Size = 6
		s := snap([]NodeView{holdingAt(n(), "b", "bob", 0, 2)}, p)
		plan := NewPlan(s, PlanOptions{})
		if got := boundGPUs(t, plan, "a"); got != 6 {
			t.Fatalf("the plan binds a at %d, want 6", got)
		}
		rs := PlanElastic(s, plan, map[string]ElasticJob{"a": a, "b": b}, ElasticOptions{})
		if len(rs) != 0 {
			t.Fatalf("resizes %+v, want none (a bound at 6 by the plan, b has no room)", rs)
		}
	})
	t.Run("no claim, nothing under way: b grows into every idle GPU", func(t *testing.T) {
		s := snap([]NodeView{holdingAt(n(), "b", "bob", 0, 2)})
		rs := PlanElastic(s, NewPlan(s, PlanOptions{}), map[string]ElasticJob{"b": b}, ElasticOptions{})
		if r, ok := resizeOf(rs, "b"); !ok || r.To != 8 || len(r.Claims) != 0 {
			t.Fatalf("b: %+v, want a grow to 8 with no claims", rs)
		}
	})
}
