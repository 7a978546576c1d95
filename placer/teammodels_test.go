package placer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

const (
	h100 = "NVIDIA H100 80GB HBM3"
	a100 = "NVIDIA A100-SXM4-80GB"
)

// withModels sets t's guarantee by model.
func withModels(t state.Team, models map[string]int) state.Team {
	t.Guarantee.Models = models
	return t
}

// modelReq is a request of g GPUs of model pattern pat by owner in team.
func modelReq(id, owner, tm, pat string, g int, age time.Duration) Pending {
	p := teamReq(id, owner, tm, g, age)
	p.Entry.Request.GPUModel = pat
	return p
}

// TestModelGuaranteeOrdersForItsModel: team vision is guaranteed 12 GPUs,
// 8 of them H100s, and holds 14 A100s: by count it is over its guarantee
// and team nlp (guaranteed 4, holding 4 H100s) goes first. For H100
// requests vision is below its H100 guarantee, so ada's four 1-GPU H100
// requests take the four free H100s before bob's. Without the per-model
// guarantee (the count alone) bob gets them. And vision's A100 requests
// are not owed for its H100 guarantee: with vision guaranteed 16 (8 of
// them H100s) and holding 12 A100s, its count is below 16, but by the part
// not named by model (8) it is 4 over, so nlp's A100 requests go first.
func TestModelGuaranteeOrdersForItsModel(t *testing.T) {
	a1 := teamRunning(view(gpuNode("a1", 8, a100)), "v1", "carol", "vision", 0, 8)
	a2 := teamRunning(view(gpuNode("a2", 8, a100)), "v2", "carol", "vision", 0, 6)
	h1 := teamRunning(view(gpuNode("h1", 8, h100)), "n1", "dan", "nlp", 0, 4)
	var pend []Pending
	for i := 0; i < 4; i++ {
		pend = append(pend, modelReq(fmt.Sprintf("ada-%d", i), "ada", "vision", "*H100*", 1, time.Minute),
			modelReq(fmt.Sprintf("bob-%d", i), "bob", "nlp", "*H100*", 1, 2*time.Minute))
	}
	s := snap([]NodeView{a1, a2, h1}, pend...)
	s.Teams = state.NewTeamTree(team("vision", "", 12, 0), team("nlp", "", 6, 0))
	if got := boundBy(NewPlan(s, PlanOptions{})); got["bob"] != 4 || got["ada"] != 0 {
		t.Fatalf("by count: bound %v, want bob 4 (vision is over its guarantee of 12)", got)
	}
	s.Teams = state.NewTeamTree(withModels(team("vision", "", 12, 0), map[string]int{"H100": 8}), team("nlp", "", 6, 0))
	if got := boundBy(NewPlan(s, PlanOptions{})); got["ada"] != 4 || got["bob"] != 0 {
		t.Fatalf("with vision's H100 guarantee: bound %v, want ada 4 (vision holds 0 of its 8 H100s)", got)
	}

	// A100 requests: vision holds 12 A100s of a guarantee of 16, 8 of
	// them H100s; nlp (guaranteed nothing) holds nothing; 4 A100s are
	// free.
	a2 = teamRunning(view(gpuNode("a2", 8, a100)), "v2", "carol", "vision", 0, 4)
	a3 := teamRunning(view(gpuNode("a3", 8, a100)), "x1", "erin", "", 0, 8)
	pend = pend[:0]
	for i := 0; i < 4; i++ {
		pend = append(pend, modelReq(fmt.Sprintf("ada-%d", i), "ada", "vision", "*A100*", 1, 2*time.Minute),
			modelReq(fmt.Sprintf("bob-%d", i), "bob", "nlp", "*A100*", 1, time.Minute))
	}
	s = snap([]NodeView{a1, a2, a3, view(gpuNode("h1", 8, h100))}, pend...)
	s.Teams = state.NewTeamTree(team("vision", "", 16, 0), team("nlp", "", 0, 0))
	if got := boundBy(NewPlan(s, PlanOptions{})); got["ada"] != 4 {
		t.Fatalf("by count: bound %v, want ada 4 (vision holds 12 of its 16)", got)
	}
	s.Teams = state.NewTeamTree(withModels(team("vision", "", 16, 0), map[string]int{"H100": 8}), team("nlp", "", 0, 0))
	if got := boundBy(NewPlan(s, PlanOptions{})); got["bob"] != 4 || got["ada"] != 0 {
		t.Fatalf("with 8 of vision's 16 named H100: bound %v, want bob 4 (vision's A100s are 4 over the 8 not named by model)", got)
	}
}

// TestModelGuaranteeHoldsForItsModel: aged 8-GPU H100 requests of two
// teams wait for the one H100 node, which runs a session that ends soon:
// the node is held for the team below its H100 guarantee (vision), not
// for nlp (at its guarantee of 8 with 8 A100s), which goes first by count
// (vision holds 14 of its 12).
func TestModelGuaranteeHoldsForItsModel(t *testing.T) {
	a1 := teamRunning(view(gpuNode("a1", 8, a100)), "v1", "carol", "vision", 0, 8)
	a2 := teamRunning(view(gpuNode("a2", 8, a100)), "v2", "carol", "vision", 0, 6)
	h1 := teamRunning(view(gpuNode("h1", 8, h100)), "x1", "erin", "", 0, 2)
	a3 := teamRunning(view(gpuNode("a3", 8, a100)), "n1", "dan", "nlp", 0, 8)
	s := snap([]NodeView{a1, a2, a3, h1}, modelReq("ada", "ada", "vision", "*H100*", 8, time.Hour), modelReq("bob", "bob", "nlp", "*H100*", 8, 2*time.Hour))
	opt := PlanOptions{ReserveAfter: time.Minute}
	s.Teams = state.NewTeamTree(team("vision", "", 12, 0), team("nlp", "", 8, 0))
	if got := NewPlan(s, opt).Reserved["h1"]; got != "bob" {
		t.Fatalf("by count: h1 held for %q, want bob", got)
	}
	s.Teams = state.NewTeamTree(withModels(team("vision", "", 12, 0), map[string]int{"H100": 8}), team("nlp", "", 8, 0))
	if got := NewPlan(s, opt).Reserved["h1"]; got != "ada" {
		t.Fatalf("with vision's H100 guarantee: h1 held for %q, want ada", got)
	}
}

// TestReclaimByModel: vision is guaranteed 8 GPUs, all H100s, and holds 8
// A100s: by count it is at its guarantee and reclaims nothing. By model it
// lacks 8 H100s: its 4-GPU H100 request reclaims one of nlp's borrowed
// H100 jobs, and only H100s (nlp's A100 job, on a node where the request
// cannot run anyway, and its other A100 work are never chosen); its A100
// request reclaims nothing (its guarantee names no A100s). With nlp
// guaranteed 4 H100s of its own, vision's 8-GPU H100 request would take
// nlp below them: refused; its 4-GPU request takes one job of 4.
func TestReclaimByModel(t *testing.T) {
	h1 := teamRunning(teamRunning(view(gpuNode("h1", 8, h100)), "n-h1", "bob", "nlp", 0, 4), "n-h2", "bob", "nlp", 4, 4)
	a1 := teamRunning(view(gpuNode("a1", 8, a100)), "v-a", "ada", "vision", 0, 8)
	a2 := teamRunning(view(gpuNode("a2", 8, a100)), "n-a", "bob", "nlp", 0, 8)
	nodes := []NodeView{h1, a1, a2}
	// nlp's weight keeps vision's fair share at its guarantee (8 and a
	// 101st of the 16 beyond), so no reclaim to fair share blurs the
	// guarantee's by count and by model.
	count := state.NewTeamTree(team("vision", "", 8, 0), team("nlp", "", 0, 100))
	byModel := state.NewTeamTree(withModels(team("vision", "", 8, 0), map[string]int{"H100": 8}), team("nlp", "", 0, 100))

	s := snap(nodes, modelReq("v-h", "ada", "vision", "*H100*", 4, time.Minute))
	s.Teams = count
	if ps := preempt(s, PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("by count: %d preemptions, want none (vision holds its 8)", len(ps))
	}
	s.Teams = byModel
	ps := preempt(s, PreemptOptions{})
	if len(ps) != 1 || ps[0].Node != "h1" || len(ps[0].Victims) != 1 || !strings.HasPrefix(ps[0].Victims[0].Session, "n-h") {
		t.Fatalf("by model: %+v, want one of nlp's H100 jobs on h1", ps)
	}
	want := "team vision reclaims its guarantee of H100 GPUs (it holds 0 of its 8 guaranteed H100 GPUs); your team nlp holds 8 H100 GPUs, none of them guaranteed"
	if r := ps[0].Victims[0].Reason; r != want {
		t.Fatalf("reason %q, want %q", r, want)
	}

	s = snap(nodes, modelReq("v-a", "ada", "vision", "*A100*", 8, time.Minute))
	s.Teams = byModel
	if ps := preempt(s, PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("an A100 request: %+v, want no reclaim (vision's guarantee names H100s only)", ps)
	}
	s.Teams = count
	if ps := preempt(s, PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("an A100 request by count: %+v, want none (vision holds its 8)", ps)
	}

	// nlp guaranteed 4 GPUs, all H100s: it holds 8 H100 + 8 A100, so by
	// count 12 are borrowed, but only 4 of its H100s.
	guarded := state.NewTeamTree(withModels(team("vision", "", 8, 0), map[string]int{"H100": 8}), withModels(team("nlp", "", 4, 100), map[string]int{"H100": 4}))
	s = snap(nodes, modelReq("v-h8", "ada", "vision", "*H100*", 8, time.Minute))
	s.Teams = guarded
	if ps := preempt(s, PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("8 H100s: %+v, want none (nlp would fall below its 4 guaranteed H100s)", ps)
	}
	s = snap(nodes, modelReq("v-h4", "ada", "vision", "*H100*", 4, time.Minute))
	s.Teams = guarded
	if ps := preempt(s, PreemptOptions{}); len(ps) != 1 || len(ps[0].Victims) != 1 {
		t.Fatalf("4 H100s: %+v, want one of nlp's H100 jobs", ps)
	}
}

// TestModelGuaranteeWaitingReason: a waiting H100 request of a team below
// its H100 guarantee says so and names who borrows the H100s, though by
// count the team holds its guarantee (which says nothing of teams).
func TestModelGuaranteeWaitingReason(t *testing.T) {
	h1 := teamRunning(teamRunning(view(gpuNode("h1", 8, h100)), "n-h1", "bob", "nlp", 0, 4), "n-h2", "bob", "nlp", 4, 4)
	a1 := teamRunning(view(gpuNode("a1", 8, a100)), "v-a", "ada", "vision", 0, 8)
	s := snap([]NodeView{h1, a1}, modelReq("v-h", "ada", "vision", "*H100*", 4, time.Minute))
	s.Teams = state.NewTeamTree(team("vision", "", 8, 0), team("nlp", "", 0, 100)) // nlp's weight: vision's fair share is its guarantee
	p := NewPlan(s, PlanOptions{})
	if len(p.Waiting) != 1 || strings.Contains(p.Waiting[0].Message, "team vision") {
		t.Fatalf("by count: %+v, want no team note (vision holds its 8)", p.Waiting)
	}
	s.Teams = state.NewTeamTree(withModels(team("vision", "", 8, 0), map[string]int{"H100": 8}), team("nlp", "", 0, 100))
	p = NewPlan(s, PlanOptions{})
	want := "team vision holds 0 of its 8 guaranteed H100 GPUs; waiting for 4 H100 GPUs borrowed by team nlp (8 H100 held, 8 beyond its own guarantee of them) to be reclaimed"
	if len(p.Waiting) != 1 || !strings.Contains(p.Waiting[0].Message, want) {
		t.Fatalf("waiting %+v, want the message to say %q", p.Waiting, want)
	}
}
