package placer

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// shortRunCluster is 100 nodes of 8 GPUs: ada runs an 8-GPU session
// queued 5 minutes ago on each of the first 10 (whole-machine arrivals
// within the reserve's window), bob an 8-GPU session queued long ago on
// each of the next 70, and the last 20 are empty.
func shortRunCluster() []NodeView {
	nodes := make([]NodeView, 0, 100)
	for i := range 100 {
		v := view(gpuNode(fmt.Sprintf("n%02d", i), 8, "A100"))
		id := fmt.Sprintf("s%02d", i)
		switch {
		case i < 10:
			v = holding(v, id, "ada", 8)
			a := v.Ledger.Allocations[id]
			a.Queued = t0.Add(-5 * time.Minute)
			v.Ledger.Allocations[id] = a
		case i < 80:
			v = holding(v, id, "bob", 8)
		}
		nodes = append(nodes, v)
	}
	return nodes
}

// tenMinuteRuns is a runtime record of n finished 8-GPU runs of 10
// minutes each.
func tenMinuteRuns(owner string, n int) *state.RuntimeRecord {
	rec := &state.RuntimeRecord{Owner: owner}
	for i := range n {
		rec.Samples = append(rec.Samples, state.RuntimeSample{Session: fmt.Sprintf("done-%d", i), QueueRevision: 1, GPUs: 8,
			Seconds: 600, Declared: 3600, Ended: t0.Add(-time.Duration(n-i) * time.Minute)})
	}
	return rec
}

// TestStandingReserveCountsShortRunsThatEnded: the 10 whole-machine
// sessions ada runs, queued in the last hour, are all the snapshot shows
// of her arrivals; her record says her 8-GPU runs take 10 minutes, so
// each one running stands for six that arrived within the hour (60, ten
// within ReserveAfter), and the reserve keeps a tenth of the nodes for
// them instead of three. With fewer than state.EstimateOver runs on
// record, too few to tell a habit, the count is the snapshot's.
func TestStandingReserveCountsShortRunsThatEnded(t *testing.T) {
	opt := PlanOptions{ReserveAfter: 10 * time.Minute}
	for _, c := range []struct {
		name string
		runs int
		want int
		said string
	}{
		{"no record", 0, 3, "about 10 arrived"},
		{"too few runs", state.EstimateOver - 1, 3, "about 10 arrived"},
		{"10-minute runs", state.EstimateOver, 10, "about 60 arrived"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := snap(shortRunCluster(), req("small", "bob", 1, 0))
			if c.runs > 0 {
				s.Runtimes = map[string]*state.RuntimeRecord{"ada": tenMinuteRuns("ada", c.runs)}
			}
			plan := NewPlan(s, opt)
			if len(plan.Standing) != c.want {
				t.Fatalf("standing reserve %v (%d nodes), want %d", plan.Standing, len(plan.Standing), c.want)
			}
			if len(plan.Bound) != 1 || plan.Bound[0].Parts[0].Node < "n80" {
				t.Fatalf("bound %v, want bob's 1-GPU request on an empty node outside the reserve", plan.Bound)
			}
			for _, n := range plan.Standing {
				if n == plan.Bound[0].Parts[0].Node {
					t.Fatalf("bob's 1-GPU request placed on %s, a node of the reserve", n)
				}
			}
			bob := req("late", "bob", 1, 0)
			var msg string
			for i := range 20 - c.want {
				s.Pending = append(s.Pending, req(fmt.Sprintf("fill-%d", i), "bob", 8, 0))
			}
			s.Pending = append(s.Pending, bob)
			for _, w := range NewPlan(s, opt).Waiting {
				if w.Pending.Entry.Session == "late" {
					msg = w.Message
				}
			}
			if !strings.Contains(msg, c.said) {
				t.Fatalf("the request kept off the reserve was told %q, want it to say %q", msg, c.said)
			}
		})
	}
}

// TestSmallAgedRequestHoldsNoEmptyNode: where the cluster is full but
// for empty nodes, bob's 1-GPU requests that have waited past
// ReserveAfter hold none of them. Each would hold a whole machine and
// start ahead of its turn: ada's two 8-GPU requests, of a higher
// priority (and ada at 0.9 of her share, so they claim nothing), found
// every empty node held and waited. Now they take two empty nodes, and
// bob's requests start at their turn on the rest.
func TestSmallAgedRequestHoldsNoEmptyNode(t *testing.T) {
	nodes := make([]NodeView, 0, 40)
	for i := range 40 {
		v := view(gpuNode(fmt.Sprintf("n%02d", i), 8, "A100"))
		switch {
		case i < 18:
			v = holding(v, fmt.Sprintf("ada%02d", i), "ada", 8)
		case i < 35:
			for g := range 8 {
				v = holdingAt(v, fmt.Sprintf("bob%02d-%d", i, g), "bob", g, 1)
			}
		}
		nodes = append(nodes, v)
	}
	var pending []Pending
	for i := range 5 {
		pending = append(pending, req(fmt.Sprintf("small-%d", i), "bob", 1, 30*time.Minute))
	}
	for i := range 2 {
		big := req(fmt.Sprintf("big-%d", i), "ada", 8, 0)
		big.Entry.Priority = 1
		pending = append(pending, big)
	}
	plan := NewPlan(snap(nodes, pending...), PlanOptions{ReserveAfter: 10 * time.Minute})
	for n, id := range plan.Reserved {
		if strings.HasPrefix(id, "small-") {
			t.Errorf("bob's aged 1-GPU request %s holds %s", id, n)
		}
	}
	bound := map[string]string{}
	for _, d := range plan.Bound {
		bound[d.Pending.Entry.Session] = d.Parts[0].Node
	}
	for i := range 2 {
		if n, ok := bound[fmt.Sprintf("big-%d", i)]; !ok || n < "n35" {
			t.Errorf("ada's big-%d bound on %q, want it on an empty node (bound %v)", i, n, bound)
		}
	}
	if len(bound) != 7 {
		t.Errorf("bound %v, want all seven requests", bound)
	}
}

// TestHolderOnAReserveNodeLeavesItsHoldToTheReserve: ada's 8-GPU
// request, aged, holds n80, the first node with all eight GPUs free (a
// CPU job of bob's runs there for a day); the standing reserve keeps
// the ten empty nodes. At its turn the request is placed on a node of
// the reserve, which stays on for nothing longer (binpack's alignment),
// and n80 takes that node's place in the reserve: bob's 1-GPU requests
// wait, where before they took n80, and the reserve is a node short.
func TestHolderOnAReserveNodeLeavesItsHoldToTheReserve(t *testing.T) {
	nodes := shortRunCluster()
	cpu := holding(nodes[80], "cpu-job", "bob", 0)
	a := cpu.Ledger.Allocations["cpu-job"]
	a.Ends = t0.Add(24 * time.Hour)
	cpu.Ledger.Allocations["cpu-job"] = a
	nodes[80] = cpu
	for i := 91; i < 100; i++ {
		nodes[i] = holding(nodes[i], fmt.Sprintf("s%02d", i), "bob", 8)
	}
	s := snap(nodes, req("big", "ada", 8, 20*time.Minute))
	s.Runtimes = map[string]*state.RuntimeRecord{"ada": tenMinuteRuns("ada", state.EstimateOver)}
	for i := range 160 {
		s.Pending = append(s.Pending, req(fmt.Sprintf("small-%03d", i), "bob", 1, 0))
	}
	plan := NewPlan(s, PlanOptions{ReserveAfter: 10 * time.Minute})
	var bigOn string
	bobNodes := map[string]bool{}
	for _, d := range plan.Bound {
		if d.Pending.Entry.Session == "big" {
			bigOn = d.Parts[0].Node
		} else {
			bobNodes[d.Parts[0].Node] = true
		}
	}
	if bigOn == "" || bigOn == "n80" {
		t.Fatalf("ada's request bound on %q, want it on a node of the reserve (this test's premise)", bigOn)
	}
	if len(bobNodes) != 0 {
		t.Errorf("bob's 1-GPU requests on %v, want none placed: n80, which ada's request held, is kept in the reserve", bobNodes)
	}
	if !slices.Contains(plan.Standing, "n80") || len(plan.Standing) != 10 {
		t.Errorf("standing reserve %v, want 10 nodes with n80 among them", plan.Standing)
	}
}
