package placer

import (
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"
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
