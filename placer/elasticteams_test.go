package placer

import (
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestElasticOrdersOwnersByTeamTree: ada (team vision, guarantee 12)
// holds 8 GPUs and waits for 2 more; bob (team nlp, guarantee 0) runs an
// elastic job of 8 GPUs (range 2-8) on the other node. By owners alone
// ada holds as much as bob and is owed nothing; down the team tree vision
// is below its guarantee and nlp above its own, so bob's job shrinks by
// the two GPUs ada waits for. Without the team tree (teams removed from
// the snapshot, or PlanElastic comparing owners alone) there is no shrink.
// And the other way: a job of a team below its guarantee does not shrink
// for a waiter of a team over its own, though the waiter's owner holds
// less.
func TestElasticOrdersOwnersByTeamTree(t *testing.T) {
	a := teamRunning(view(gpuNode("a", 8, "A100")), "ada-old", "ada", "vision", 0, 8)
	b := teamRunning(view(gpuNode("b", 8, "A100")), "job", "bob", "nlp", 0, 8)
	jobs := map[string]ElasticJob{"job": {Session: "job", Min: 2, Max: 8, Ready: true}}
	s := snap([]NodeView{a, b}, teamReq("ada-2", "ada", "vision", 2, time.Minute))
	s.Teams = state.NewTeamTree(team("vision", "", 12, 0), team("nlp", "", 0, 0))
	r, ok := resizeOf(PlanElastic(s, NewPlan(s, PlanOptions{}), jobs, ElasticOptions{}), "job")
	if !ok || r.From != 8 || r.To != 6 || r.For != "ada-2" {
		t.Fatalf("resize %+v (%v), want job shrunk 8 → 6 for ada-2: vision is below its guarantee", r, ok)
	}
	noTeams := *s
	noTeams.Teams = state.TeamTree{}
	if r, ok := resizeOf(PlanElastic(&noTeams, NewPlan(&noTeams, PlanOptions{}), jobs, ElasticOptions{}), "job"); ok {
		t.Fatalf("without teams: resized %+v, want none (ada holds as much as bob)", r)
	}

	// The other way round: bob's job is in a team below its guarantee,
	// carol (holding nothing) in a team over its own.
	c := teamRunning(view(gpuNode("c", 8, "A100")), "dan-1", "dan", "nlp", 0, 8)
	job := teamRunning(view(gpuNode("b", 8, "A100")), "job", "bob", "vision", 0, 8)
	s = snap([]NodeView{c, job}, teamReq("carol-2", "carol", "nlp", 2, time.Minute))
	s.Teams = state.NewTeamTree(team("vision", "", 12, 0), team("nlp", "", 0, 0))
	if r, ok := resizeOf(PlanElastic(s, NewPlan(s, PlanOptions{}), jobs, ElasticOptions{}), "job"); ok {
		t.Fatalf("resized %+v, want none: the job's team is below its guarantee, the waiter's over", r)
	}
	noTeams = *s
	noTeams.Teams = state.TeamTree{}
	if r, ok := resizeOf(PlanElastic(&noTeams, NewPlan(&noTeams, PlanOptions{}), jobs, ElasticOptions{}), "job"); !ok || r.To != 6 {
		t.Fatalf("without teams: resize %+v (%v), want 8 → 6 (carol holds nothing)", r, ok)
	}
}

// TestElasticGrowWaitsForTeamFirst: a job may not grow into idle GPUs
// while a waiter of a team first in the tree waits (blocked by capacity
// elsewhere), though the waiter's owner holds more; it grows when the
// waiter's team comes after the job's.
func TestElasticGrowWaitsForTeamFirst(t *testing.T) {
	// Node a: ada holds 8 (vision). Node b: bob's job holds 2 of 8.
	// ada waits for a 2-node Ray gang no shrink serves (it blocks).
	a := teamRunning(view(gpuNode("a", 8, "A100")), "ada-old", "ada", "vision", 0, 8)
	b := teamRunning(view(gpuNode("b", 8, "A100")), "job", "bob", "nlp", 0, 2)
	jobs := map[string]ElasticJob{"job": {Session: "job", Min: 2, Max: 8, Ready: true}}
	gang := teamReq("ada-gang", "ada", "vision", 8, time.Minute)
	gang.Entry.Workers = 1
	for _, tc := range []struct {
		name   string
		vision int // vision's guarantee
		grows  bool
	}{
		{"vision below its guarantee: no grow", 16, false},
		{"vision over its guarantee, holding more than bob: grows", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := snap([]NodeView{a, b}, gang)
			s.Teams = state.NewTeamTree(team("vision", "", tc.vision, 0), team("nlp", "", 0, 0))
			_, ok := resizeOf(PlanElastic(s, NewPlan(s, PlanOptions{}), jobs, ElasticOptions{}), "job")
			if ok != tc.grows {
				t.Fatalf("grew %v, want %v", ok, tc.grows)
			}
		})
	}
}
