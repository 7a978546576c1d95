package placer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// claimCluster is 20 nodes of 8 GPUs (160): n00 has 4 GPUs free (bob
// holds 4), n01–n05 are ada's (40 GPUs), n06–n19 bob's (112). ada waits
// with twelve 4-GPU requests (demand 88: she is owed 80 and holds half
// of it), bob with 8-GPU requests, every request aged past its hold
// delay.
func claimCluster() *Snapshot {
	nodes := []NodeView{holding(view(gpuNode("n00", 8, "A100")), "b00", "bob", 4)}
	for i := 1; i < 20; i++ {
		name, owner := fmt.Sprintf("n%02d", i), "bob"
		if i <= 5 {
			owner = "ada"
		}
		nodes = append(nodes, holding(view(gpuNode(name, 8, "A100")), "s"+name, owner, 8))
	}
	var pending []Pending
	for i := range 12 {
		pending = append(pending, req(fmt.Sprintf("a%02d", i), "ada", 4, time.Hour-time.Duration(i)*time.Second))
	}
	for i := range 10 {
		pending = append(pending, req(fmt.Sprintf("b%02d", i), "bob", 8, 2*time.Hour-time.Duration(i)*time.Second))
	}
	return snap(nodes, pending...)
}

// TestBelowShareFitClaimsItsNode: a request of an owner below its fair
// share that fits a node now keeps that node from the holds of owners
// after it in the fair order. ada holds 40 GPUs of the 80 she is owed;
// her oldest 4-GPU request fits n00, the one node with GPUs free, which
// is also the node closest to fitting bob's 8-GPU requests (he holds 116,
// above his share). Before claims, ada's request counted as fitting, bob's
// hold took n00, and at her turn she found no room: the node she had
// waited for went to the owner above his share (flood-drain with spread
// at 200 nodes, where this was a third of the flooder's 8-GPU starts).
func TestBelowShareFitClaimsItsNode(t *testing.T) {
	plan := NewPlan(claimCluster(), PlanOptions{ReserveAfter: 10 * time.Minute, Strategy: Spread})
	if id := plan.Reserved["n00"]; id != "" {
		t.Errorf("n00 is held for %s, want it left to ada's fitting request (held: %v)", id, plan.Reserved)
	}
	if len(plan.Bound) != 1 || plan.Bound[0].Pending.Entry.Session != "a00" || plan.Bound[0].Parts[0].Node != "n00" {
		t.Fatalf("bound %v, want ada's a00 on n00", plan.Bound)
	}
	// bob still holds a node, one not claimed, for his oldest request.
	held := 0
	for n, id := range plan.Reserved {
		if id == "b00" {
			held++
			if n == "n00" {
				t.Errorf("bob's b00 holds n00")
			}
		}
	}
	if held != 1 {
		t.Errorf("bob's oldest request holds %d nodes, want 1 (held: %v)", held, plan.Reserved)
	}
}

// TestOnlyNewcomersClaimBelowTwentyNodes: on a cluster of fewer than 20
// nodes only a newcomer's fitting request claims (the 16-node suite lost
// more to the over-share owners' lost drains than claims by every owner
// below its share won): the same cluster less four of bob's full nodes,
// where ada holds half her share, leaves n00 to bob's hold as before
// claims. TestNewcomerClaimsOnAFullCluster has a newcomer claim there.
func TestOnlyNewcomersClaimBelowTwentyNodes(t *testing.T) {
	s := claimCluster()
	s.Nodes = s.Nodes[:16]
	plan := NewPlan(s, PlanOptions{ReserveAfter: 10 * time.Minute, Strategy: Spread})
	if id := plan.Reserved["n00"]; id != "b00" {
		t.Errorf("n00 is held for %q, want bob's b00 (held: %v)", id, plan.Reserved)
	}
}

// TestYoungRequestClaims: an owner far below its share claims before its
// requests may hold. carol has just arrived (nothing held): her 4-GPU
// request, queued 30 s ago, may not hold nodes for another two minutes,
// but it fits n00 now, and bob's hold, read after it, leaves n00 to her.
// Before, bob's hold took n00 and carol, first in the order, found no
// room (two-floods at 200 nodes: the second flooder's first passes).
func TestYoungRequestClaims(t *testing.T) {
	s := claimCluster()
	var pending []Pending
	for _, it := range s.Pending {
		if it.Entry.Owner == "bob" {
			pending = append(pending, it)
		}
	}
	s.Pending = append(pending, req("c00", "carol", 4, 30*time.Second))
	plan := NewPlan(s, PlanOptions{ReserveAfter: 10 * time.Minute})
	if id := plan.Reserved["n00"]; id != "" {
		t.Errorf("n00 is held for %s, want it left to carol's young request (held: %v)", id, plan.Reserved)
	}
	if len(plan.Bound) != 1 || plan.Bound[0].Pending.Entry.Session != "c00" || plan.Bound[0].Parts[0].Node != "n00" {
		t.Fatalf("bound %v, want carol's c00 on n00", plan.Bound)
	}
}

// fullOf is n nodes of 8 GPUs, each running eight 1-GPU sessions of
// owner's but for free GPUs left free on the first node, n00.
func fullOf(n int, owner string, free int) []NodeView {
	var nodes []NodeView
	for i := range n {
		v := view(gpuNode(fmt.Sprintf("n%02d", i), 8, "A100"))
		for j := range 8 {
			if i == 0 && j >= 8-free {
				break
			}
			v = holdingAt(v, fmt.Sprintf("s%02d-%d", i, j), owner, j, 1)
		}
		nodes = append(nodes, v)
	}
	return nodes
}

// TestNewcomerClaimsOnAFullCluster: on 20 nodes full of ada's sessions
// but one GPU just freed, bob, who has just come (his 1-GPU requests a
// second old, nothing held), gets that GPU. ada, above her share, has
// aged 2-GPU requests, which count as large (more than the one GPU free)
// and hold on her charge the nodes closest to fitting them, the freed
// GPU's first; bob's young request may not hold (not for ReserveAfter)
// but claims the GPU it fits before her holds are read. So it is on 16
// nodes, where only a newcomer claims (newcomerBelow). With claims off
// her hold takes n00 and bob waits: every GPU that frees would go to her
// holds until his requests had aged (placer/README.md: TestFairShare on
// a loaded machine, ada 67 GPUs, bob 12, before newcomers claimed below
// 20 nodes).
func TestNewcomerClaimsOnAFullCluster(t *testing.T) {
	newcomer := func(nodes int) *Snapshot {
		s := snap(fullOf(nodes, "ada", 1))
		for i := range 10 {
			s.Pending = append(s.Pending, req(fmt.Sprintf("a1-%02d", i), "ada", 1, time.Hour-time.Duration(i)*time.Second),
				req(fmt.Sprintf("a2-%02d", i), "ada", 2, time.Hour-time.Duration(i)*time.Second))
		}
		s.Pending = append(s.Pending, req("bob-0", "bob", 1, time.Second), req("bob-1", "bob", 1, time.Second/2))
		return s
	}
	opt := PlanOptions{ReserveAfter: 10 * time.Minute}
	for _, nodes := range []int{20, 16, 4} {
		plan := NewPlan(newcomer(nodes), opt)
		if id := plan.Reserved["n00"]; id != "" {
			t.Errorf("%d nodes: n00 is held for %s, want it left to bob's young request (held: %v)", nodes, id, plan.Reserved)
		}
		if len(plan.Bound) != 1 || plan.Bound[0].Pending.Entry.Session != "bob-0" || plan.Bound[0].Parts[0].Node != "n00" {
			t.Errorf("%d nodes: bound %v, want bob's bob-0 on n00", nodes, plan.Bound)
		}
	}
	for _, nodes := range []int{20, 16} {
		o := opt
		o.Without = RuleClaims
		plan := NewPlan(newcomer(nodes), o)
		if id := plan.Reserved["n00"]; !strings.HasPrefix(id, "a2-") || len(plan.Bound) != 0 {
			t.Errorf("%d nodes without claims: n00 held for %q, bound %v; want it held for one of ada's 2-GPU requests and nothing bound", nodes, id, plan.Bound)
		}
	}
}

// TestClaimYieldsToAHoldItBackfills: below 20 nodes a newcomer's claim
// keeps holds off its node only where its request could not backfill
// them. On 16 nodes where every session ends by its max runtime, n00
// (one GPU free) draining in an hour and the others in two, bob's
// 10-minute request would end before n00 drains: ada's 2-GPU hold takes
// n00, the node that drains soonest, and bob's request backfills it.
// Without a max runtime on bob's request, his claim keeps ada's hold
// off n00 and her hold drains a node an hour later.
func TestClaimYieldsToAHoldItBackfills(t *testing.T) {
	s := func(bobMax time.Duration) *Snapshot {
		v := fullOf(16, "ada", 1)
		for i := range v {
			end := t0.Add(2 * time.Hour)
			if i == 0 {
				end = t0.Add(time.Hour)
			}
			for id, a := range v[i].Ledger.Allocations {
				a.Ends = end
				v[i].Ledger.Allocations[id] = a
			}
		}
		s := snap(v)
		for i := range 10 {
			s.Pending = append(s.Pending, req(fmt.Sprintf("a2-%02d", i), "ada", 2, time.Hour-time.Duration(i)*time.Second))
		}
		b := req("bob-0", "bob", 1, time.Second)
		b.Entry.MaxRuntime = state.Duration(bobMax)
		s.Pending = append(s.Pending, b)
		return s
	}
	opt := PlanOptions{ReserveAfter: 10 * time.Minute}
	plan := NewPlan(s(10*time.Minute), opt)
	if !strings.HasPrefix(plan.Reserved["n00"], "a2-") {
		t.Errorf("bob's 10-minute request: n00 held for %q (held %v); want it held for ada's first 2-GPU request, his claim yielding", plan.Reserved["n00"], plan.Reserved)
	}
	if len(plan.Bound) != 1 || plan.Bound[0].Parts[0].Node != "n00" {
		t.Errorf("bob's 10-minute request: bound %v; want bob-0 backfilling n00", plan.Bound)
	}
	plan = NewPlan(s(0), opt)
	if id := plan.Reserved["n00"]; id != "" {
		t.Errorf("bob's request without a max runtime: n00 held for %q; want his claim to keep it", id)
	}
	if len(plan.Bound) != 1 || plan.Bound[0].Parts[0].Node != "n00" {
		t.Errorf("bob's request without a max runtime: bound %v; want bob-0 on n00", plan.Bound)
	}
}
