package placer

import (
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestEveryAgedRequestOfAShapeMayHold: once a request shape has found no
// node in a pass, every later request of that shape still may hold nodes
// within its owner's budget, not only the first. ada (below her share)
// asks for three 4-GPU sessions: the first takes the one node with 4 GPUs
// free, and the other two each hold a node. Before, the shape memo
// answered the third at once ("the best node has 2 free") and it held
// nothing, so of an owner's many requests of one size only one a pass
// could hold: at 2,000 nodes a 7-GPU user far below its share held 1–3
// nodes for 3,000 waiting requests (placer/sim's adv-7-of-8).
func TestEveryAgedRequestOfAShapeMayHold(t *testing.T) {
	n1 := holding(view(gpuNode("n1", 8, "A100")), "b1", "bob", 4)
	n2 := holding(view(gpuNode("n2", 8, "A100")), "b2", "bob", 6)
	n3 := holding(view(gpuNode("n3", 8, "A100")), "b3", "bob", 6)
	n4 := holding(view(gpuNode("n4", 8, "A100")), "b4", "bob", 6)
	s := snap([]NodeView{n1, n2, n3, n4}, req("r1", "ada", 4, time.Hour), req("r2", "ada", 4, time.Hour-time.Second), req("r3", "ada", 4, time.Hour-2*time.Second))
	plan := NewPlan(s, PlanOptions{ReserveAfter: 10 * time.Minute})
	if len(plan.Bound) != 1 || plan.Bound[0].Pending.Entry.Session != "r1" || plan.Bound[0].Parts[0].Node != "n1" {
		t.Fatalf("bound %v, want r1 on n1", plan.Bound)
	}
	var holders []string
	for _, id := range plan.Reserved {
		holders = append(holders, id)
	}
	sort.Strings(holders)
	if len(holders) != 2 || holders[0] != "r2" || holders[1] != "r3" {
		t.Fatalf("nodes held for %v (%v), want one each for r2 and r3", holders, plan.Reserved)
	}
	// Each holder's reason names its node once, with what is free there.
	said := regexp.MustCompile(`^waiting for 4×GPU: node n[234] \(2 of 8 GPUs free, the rest draining as its sessions end\) held for it, nothing else placed there`)
	for _, w := range plan.Waiting {
		if id := w.Pending.Entry.Session; (id == "r2" || id == "r3") && (!said.MatchString(w.Message) || strings.Contains(w.Message, "node node")) {
			t.Errorf("%s's reason %q, want it to name its held node once: %s", id, w.Message, said)
		}
	}
}

// TestPlainFitKeyMatchesShape: the key the holds' merge makes of a small
// request from the facts byAge copied out (plainFitKey), so as to find
// it among the shapes seen to fit without reading its entry, is the one
// fitsMemo makes from the entry (shapeOf(partWith(…))), for every
// request it makes one for: on backlogs of 7, 300 and 2,000 owners with
// run-time records, max runtimes, some notebooks and requests without a
// max runtime, and an owner above its share, on 40 and 200 nodes. A key
// that differed could take a request for one that fits that does not.
func TestPlainFitKeyMatchesShape(t *testing.T) {
	t.Cleanup(func() { plainFitKeyCheck = nil })
	made, mismatched := 0, 0
	plainFitKeyCheck = func(fast, slow shape) {
		made++
		if fast != slow && mismatched < 5 {
			mismatched++
			t.Errorf("plainFitKey %+v, fitsMemo's shape %+v", fast, slow)
		}
	}
	for _, nodes := range []int{40, 200} {
		for _, owners := range []int{7, 300, 2000} {
			s := backlogOf(nodes, nodes*10, owners)
			for i := range s.Pending {
				e := *s.Pending[i].Entry
				switch i % 7 {
				case 3:
					e.Kind = state.KindNotebook // a port more
				case 5:
					e.MaxRuntime = 0 // backfills nothing
				}
				s.Pending[i].Entry = &e
			}
			for _, snap := range []*Snapshot{s, contendedBacklog(s)} {
				before := made
				for _, st := range []Strategy{Binpack, Spread} {
					NewPlan(snap, PlanOptions{ReserveAfter: 10 * time.Minute, Strategy: st})
				}
				if made == before {
					t.Errorf("%d nodes, %d owners: no key made; the test reads nothing", nodes, owners)
				}
			}
		}
	}
	t.Logf("%d keys compared", made)
}
