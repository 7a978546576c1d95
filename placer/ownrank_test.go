package placer

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestOwnerRankingMatchesReference plans 80 random clusters, where owners
// run whole nodes of their own (8-GPU sessions, most with a max runtime
// that frees the node soon) beside nodes of mixed smaller sessions, and
// queue requests of 1-8 GPUs that hold nodes, once with each owner's own
// ranking (ownrank.go: in half the rounds made at a pair's first search,
// in the others once its searches have walked far) and once with
// ownRankReference on (the walk over the ranking for anyone, as before):
// the plans (bindings, holds, every reason) are equal. It fails when the
// owner's ranking is not sorted, or is kept across owners or sizes.
func TestOwnerRankingMatchesReference(t *testing.T) {
	t.Cleanup(func() { ownRankReference, ownRankWalk = false, 2 })
	rng := rand.New(rand.NewPCG(34, 2000))
	owners := []string{"u0", "u1", "u2", "u3"}
	exercised := 0
	for round := 0; round < 80; round++ {
		var nodes []NodeView
		whole := map[string]bool{} // owners running a whole node that a max runtime frees
		for i := 0; i < 40; i++ {
			v := view(gpuNode(fmt.Sprintf("n%02d", i), 8, "A100"))
			ends := func(id string) {
				if rng.IntN(4) != 0 {
					a := v.Ledger.Allocations[id]
					a.Ends = t0.Add(time.Duration(1+rng.IntN(240)) * time.Minute)
					v.Ledger.Allocations[id] = a
				}
			}
			switch rng.IntN(3) {
			case 0: // an owner's whole node
				id, o := fmt.Sprintf("w%02d", i), owners[rng.IntN(len(owners))]
				v = holdingAt(v, id, o, 0, 8)
				ends(id)
				if !v.Ledger.Allocations[id].Ends.IsZero() {
					whole[o] = true
				}
			case 1: // smaller sessions of several owners
				for g := 0; g < 8; {
					k := 1 + rng.IntN(4)
					if g+k > 8 || rng.IntN(5) == 0 {
						break
					}
					id := fmt.Sprintf("r%02d-%d", i, g)
					v = holdingAt(v, id, owners[rng.IntN(len(owners))], g, k)
					ends(id)
					g += k
				}
			}
			nodes = append(nodes, v)
		}
		var pend []Pending
		for i := 0; i < 120; i++ {
			p := req(fmt.Sprintf("p%03d", i), owners[rng.IntN(len(owners))], []int{1, 2, 4, 8, 8, 8}[rng.IntN(6)], time.Duration(rng.IntN(7200))*time.Second)
			if rng.IntN(2) == 0 {
				p.Entry.MaxRuntime = state.Duration(time.Duration(1+rng.IntN(120)) * time.Minute)
			}
			pend = append(pend, p)
		}
		s := snap(nodes, pend...)
		opt := PlanOptions{ReserveAfter: 10 * time.Minute}
		if round%2 == 1 {
			opt.Strategy = Spread
		}
		// Every pair's own ranking from its first search, or only once
		// its searches have walked far, as NewPlan does.
		ownRankWalk = 2
		if round%4 < 2 {
			ownRankWalk = 0
		}
		ownRankReference = true
		want := NewPlan(s, opt)
		ownRankReference = false
		got := NewPlan(s, opt)
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: the plan with owners' rankings differs from the reference's:\n got %+v\nwant %+v", round, got, want)
		}
		for _, id := range want.Reserved {
			for _, it := range pend {
				if it.Entry.Session == id && whole[it.Entry.Owner] {
					exercised++ // a holder whose owner's own nodes rank early for anyone
				}
			}
		}
	}
	if exercised < 40 {
		t.Fatalf("only %d holds of owners with whole nodes of their own: the owner's ranking went untested", exercised)
	}
}

// TestHeldHeadMatchesReference plans clusters where many owners below
// their share claim and hold most nodes, and holders are placed on the
// nodes they held as the order runs, once with the searches starting
// after the held and claimed head of their rankings (ranking.from) and
// once with heldHeadReference on (every search from the first node, as
// before): the plans (bindings, holds, every reason) are equal. Backlogs
// of 40 and 200 nodes with 30 to 300 owners, both strategies, and the
// contended variant where one owner is above its share. It fails when
// the head is not read again after a hold is let go.
func TestHeldHeadMatchesReference(t *testing.T) {
	t.Cleanup(func() { heldHeadReference = false })
	held := 0
	for _, c := range []struct{ nodes, owners int }{{40, 30}, {40, 100}, {200, 60}, {200, 300}} {
		for _, st := range []Strategy{Binpack, Spread} {
			for _, contended := range []bool{false, true} {
				snapshot := func() *Snapshot {
					s := backlogOf(c.nodes, c.nodes*10, c.owners)
					if contended {
						s = contendedBacklog(s)
					}
					return s
				}
				opt := PlanOptions{ReserveAfter: 10 * time.Minute, Strategy: st}
				heldHeadReference = true
				want := NewPlan(snapshot(), opt)
				heldHeadReference = false
				got := NewPlan(snapshot(), opt)
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("%d nodes, %d owners, %s, contended %v: the plan starting after the held head differs from the reference's", c.nodes, c.owners, st, contended)
				}
				held += len(want.Reserved)
			}
		}
	}
	if held < 500 {
		t.Fatalf("only %d nodes held over the plans: the held head went untested", held)
	}
}
