package placer

import (
	"fmt"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestDrainFitOrders: a part that ends by the node's drain ranks above
// one whose drain is unknown, the tightest first, and both above a part
// that delays the drain, the less the better; a part without a max
// runtime ranks last on a node that would drain.
func TestDrainFitOrders(t *testing.T) {
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	order := []struct {
		name        string
		ends, drain time.Time
	}{
		{"ends with the drain", at(time.Hour), at(time.Hour)},
		{"ends 20 min before", at(time.Hour), at(80 * time.Minute)},
		{"ends 2 h before", at(time.Hour), at(3 * time.Hour)},
		{"drain unknown", at(time.Hour), time.Time{}},
		{"delays it 20 min", at(time.Hour), at(40 * time.Minute)},
		{"delays it 2 h", at(3 * time.Hour), at(time.Hour)},
		{"no max runtime", time.Time{}, at(time.Hour)},
	}
	prev := 2.0
	for _, c := range order {
		got := drainFit(c.ends, c.drain)
		if got < 0 || got > 1 || got >= prev {
			t.Errorf("%s: fit %.3f, want in [0, 1] and below the case before (%.3f)", c.name, got, prev)
		}
		prev = got
	}
	if got := drainFit(time.Time{}, time.Time{}); got != 0.5 {
		t.Errorf("no max runtime, drain unknown: fit %.3f, want 0.5", got)
	}
}

// drainCluster is 20 8-GPU nodes (blocks are kept from 20 on): "soon"
// runs sessions on used GPUs that end, by their max runtimes, 20 minutes
// after the snapshot, "late" 3 hours after, "open" a session without a
// max runtime; "big" an 8-GPU session queued 20 minutes ago (a
// whole-machine arrival within the hour), and 16 more are full with
// sessions that end in 10 minutes (so the standing reserve, which keeps
// the node that frees first, keeps one of them).
func drainCluster(used int) []NodeView {
	ending := func(v NodeView, id string, after time.Duration) NodeView {
		a := v.Ledger.Allocations[id]
		if after > 0 {
			a.Ends = t0.Add(after)
		}
		v.Ledger.Allocations[id] = a
		return v
	}
	big := holding(view(gpuNode("big", 8, "A100")), "s-big", "ada", 8)
	a := big.Ledger.Allocations["s-big"]
	a.Queued, a.Ends = t0.Add(-20*time.Minute), t0.Add(2*time.Hour)
	big.Ledger.Allocations["s-big"] = a
	nodes := []NodeView{
		big,
		ending(holding(view(gpuNode("soon", 8, "A100")), "s-soon", "ada", used), "s-soon", 20*time.Minute),
		ending(holding(view(gpuNode("late", 8, "A100")), "s-late", "ada", used), "s-late", 3*time.Hour),
		ending(holding(view(gpuNode("open", 8, "A100")), "s-open", "ada", used), "s-open", 0),
	}
	for i := 0; len(nodes) < 20; i++ {
		id := fmt.Sprintf("full%02d", i)
		nodes = append(nodes, ending(holding(view(gpuNode(id, 8, "A100")), "s-"+id, "carl", 8), "s-"+id, 10*time.Minute))
	}
	return nodes
}

// TestDrainFitBreaksTies: among nodes binpack scores alike (7 of 8 GPUs
// used on each), a 1-GPU request goes to the node it fits in time: one
// of 15 minutes to "soon" (its sessions end in 20), one of an hour to
// "late" (in 3 h), one without a max runtime to "open". Each session's
// name is chosen so that the hash alone would put it elsewhere, as it
// does below 20 nodes, where no drain is fitted.
func TestDrainFitBreaksTies(t *testing.T) {
	opt := PlanOptions{Strategy: Binpack, ReserveAfter: 10 * time.Minute}
	for _, c := range []struct {
		name       string
		maxRuntime time.Duration
		want       string
	}{
		{"15 min", 15 * time.Minute, "soon"},
		{"1 h", time.Hour, "late"},
		{"no max runtime", 0, "open"},
	} {
		t.Run(c.name, func(t *testing.T) {
			place := func(nodes []NodeView, session string) (string, map[string]float64) {
				p := req(session, "bob", 1, time.Minute)
				p.Entry.MaxRuntime = state.Duration(c.maxRuntime)
				plan := NewPlan(snap(nodes, p), opt)
				if len(plan.Bound) != 1 {
					t.Fatalf("%s: bound %v, waiting %v", session, plan.Bound, plan.Waiting)
				}
				return plan.Bound[0].Parts[0].Node, plan.Bound[0].Parts[0].Scores
			}
			session := ""
			for i := 0; i < 100 && session == ""; i++ {
				s := fmt.Sprintf("s%02d", i)
				if n, scores := place(drainCluster(7)[:19], s); n != c.want {
					if _, ok := scores["drain"]; ok {
						t.Fatalf("19 nodes: scores %v name a drain fit", scores)
					}
					session = s
				}
			}
			if session == "" {
				t.Fatal("no session name the hash puts elsewhere at 19 nodes")
			}
			n, scores := place(drainCluster(7), session)
			if n != c.want {
				t.Fatalf("%s on %s (scores %v), want %s", session, n, scores, c.want)
			}
			if _, ok := scores["drain"]; !ok {
				t.Errorf("scores %v do not name the drain fit that chose the node", scores)
			}
		})
	}
}

// TestSpreadRanksItsBandByDrainFit: spread, keeping whole machines for
// the 8-GPU arrivals, places a 1-GPU request of an hour on "late" (3 of
// 8 GPUs free, sessions ending in 3 h) rather than the emptier "soon"
// (5 free, ending in 20 min), both in the band below a whole machine;
// with nothing to tell them apart by drain (no max runtimes), on the
// emptier.
func TestSpreadRanksItsBandByDrainFit(t *testing.T) {
	nodes := drainCluster(3)
	late := nodes[2]
	delete(late.Ledger.Allocations, "s-late")
	late = holding(late, "s-late", "ada", 5)
	a := late.Ledger.Allocations["s-late"]
	a.Ends = t0.Add(3 * time.Hour)
	late.Ledger.Allocations["s-late"] = a
	nodes[2] = late
	nodes[3] = holding(view(gpuNode("open", 8, "A100")), "s-open", "ada", 8) // no room there
	p := req("small", "bob", 1, time.Minute)
	p.Entry.MaxRuntime = state.Duration(time.Hour)
	plan := NewPlan(snap(nodes, p), PlanOptions{Strategy: Spread, ReserveAfter: 10 * time.Minute})
	if len(plan.Bound) != 1 || plan.Bound[0].Parts[0].Node != "late" {
		t.Fatalf("bound %v, want the 1-GPU request on late", plan.Bound)
	}
	// Max runtimes unknown: by emptiness, as spread was.
	for _, i := range []int{1, 2} {
		for id, a := range nodes[i].Ledger.Allocations {
			a.Ends = time.Time{}
			nodes[i].Ledger.Allocations[id] = a
		}
	}
	plan = NewPlan(snap(nodes, p), PlanOptions{Strategy: Spread, ReserveAfter: 10 * time.Minute})
	if len(plan.Bound) != 1 || plan.Bound[0].Parts[0].Node != "soon" {
		t.Fatalf("no max runtimes: bound %v, want the 1-GPU request on soon", plan.Bound)
	}
}

// TestDrainFitOffInADeepBacklog: while the queue asks for more whole GPUs
// than a quarter of the cluster's (40 of drainCluster's 160), the drain
// fit is off and no binding carries a drain score: with five 8-GPU
// requests and the 1-GPU one (41); with four (33) it is on.
func TestDrainFitOffInADeepBacklog(t *testing.T) {
	for _, c := range []struct {
		queued int // 8-GPU requests of a model no node has
		fits   bool
	}{{4, true}, {5, false}} {
		pending := []Pending{req("small", "bob", 1, time.Minute)}
		pending[0].Entry.MaxRuntime = state.Duration(time.Hour)
		for i := 0; i < c.queued; i++ {
			p := req(fmt.Sprintf("h100-%d", i), "erin", 8, time.Minute)
			p.Entry.Request.GPUModel = "H100"
			pending = append(pending, p)
		}
		plan := NewPlan(snap(drainCluster(7), pending...), PlanOptions{Strategy: Binpack, ReserveAfter: 10 * time.Minute})
		if len(plan.Bound) != 1 {
			t.Fatalf("%d queued: bound %v, want small alone", c.queued, plan.Bound)
		}
		_, fitted := plan.Bound[0].Parts[0].Scores["drain"]
		if fitted != c.fits {
			t.Errorf("%d 8-GPU requests queued: scores %v, drain fit %v, want %v", c.queued, plan.Bound[0].Parts[0].Scores, fitted, c.fits)
		}
		if c.fits && plan.Bound[0].Parts[0].Node != "late" {
			t.Errorf("%d queued: small on %s, want late", c.queued, plan.Bound[0].Parts[0].Node)
		}
	}
}
