package placer

import (
	"fmt"
	"maps"
	"math/rand"
	"slices"
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

// TestSortRanksMatchesBefore: sortRanks orders a ranking as
// readyRank.before does (known times first, soonest first; then most GPUs
// free; then by name), whether it sorts by its counts and radix sort or
// falls back to a comparison sort: on rankings with many equal times and
// equal free counts, times a nanosecond apart or years apart, times
// before the pass's clock, nodes of every free count, rankings of only
// some of the pass's nodes, and times too far apart for nanoseconds.
func TestSortRanksMatchesBefore(t *testing.T) {
	rng := rand.New(rand.NewSource(11))
	type shape struct {
		name  string
		nodes int
		at    func() time.Time
		some  bool // a ranking of only some of the nodes
	}
	shapes := []shape{
		{"one time", 500, func() time.Time { return t0 }, false},
		{"few times", 2000, func() time.Time { return t0.Add(time.Duration(rng.Intn(4)) * time.Hour) }, false},
		{"nanoseconds", 1000, func() time.Time { return t0.Add(time.Duration(rng.Intn(100) - 50)) }, false},
		{"years", 1000, func() time.Time { return t0.Add(time.Duration(rng.Int63n(int64(200 * 365 * 24 * time.Hour)))) }, false},
		{"too far apart", 300, func() time.Time { return t0.AddDate(rng.Intn(600), 0, 0) }, false},
		{"some nodes", 400, func() time.Time { return t0.Add(time.Duration(rng.Intn(600)) * time.Second) }, true},
		{"one node", 1, func() time.Time { return t0 }, false},
	}
	for _, sh := range shapes {
		t.Run(sh.name, func(t *testing.T) {
			p := &planner{buf: new(passBuffers)}
			for i := 0; i < sh.nodes; i++ {
				p.nodes = append(p.nodes, &nodeState{name: fmt.Sprintf("n%05d", i), byName: int32(i)})
			}
			for round := 0; round < 3; round++ {
				var r []readyRank
				for _, n := range p.nodes {
					if sh.some && rng.Intn(2) == 0 {
						continue
					}
					rk := readyRank{n: n, free: rng.Intn(9)}
					if rng.Intn(4) > 0 {
						rk.known, rk.at = true, sh.at()
					}
					r = append(r, rk)
				}
				rng.Shuffle(len(r), func(i, j int) { r[i], r[j] = r[j], r[i] })
				want := slices.Clone(r)
				slices.SortFunc(want, func(a, b readyRank) int {
					if a.before(b) {
						return -1
					}
					return 1
				})
				p.sortRanks(r)
				for i := range r {
					if !r[i].same(want[i]) {
						t.Fatalf("round %d, place %d: %s (known %v, %v, %d free), want %s (known %v, %v, %d free)", round, i,
							r[i].n.name, r[i].known, r[i].at, r[i].free, want[i].n.name, want[i].known, want[i].at, want[i].free)
					}
				}
			}
		})
	}
}
