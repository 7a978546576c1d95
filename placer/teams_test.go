package placer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// team builds a team with a guarantee of g GPUs and weight w (0: 1).
func team(name, parent string, g int, w float64) state.Team {
	return state.Team{Name: name, Parent: parent, Guarantee: state.TeamGuarantee{GPUs: g}, Weight: w}
}

// withMax sets t's maximum.
func withMax(t state.Team, m int) state.Team {
	t.MaxGPUs = &m
	return t
}

// teamRunning adds session id of team and owner to v, holding GPUs
// first..first+n-1, preemptible batch work of priority 0.
func teamRunning(v NodeView, id, owner, tm string, first, n int) NodeView {
	a := state.Allocation{Kind: state.KindBatch, Owner: owner, Team: tm, Preemptible: true, Role: state.RoleSingle, CPUMilli: 1000, MemoryMiB: 1024}
	for i := first; i < first+n; i++ {
		a.GPUs = append(a.GPUs, v.Node.GPUs[i].UUID)
	}
	v.Ledger.Allocations[id] = a
	return v
}

// teamReq is a request of g GPUs by owner in team tm.
func teamReq(id, owner, tm string, g int, age time.Duration) Pending {
	p := req(id, owner, g, age)
	p.Entry.Team = tm
	return p
}

// boundBy counts the GPUs p bound per owner.
func boundBy(p *Plan) map[string]int {
	out := map[string]int{}
	for _, d := range p.Bound {
		for _, pp := range d.Parts {
			out[d.Pending.Entry.Owner] += len(pp.Devices)
		}
	}
	return out
}

// TestTeamBelowGuaranteeGoesFirst: team vision (guarantee 24) holds 8
// through ada; team nlp (guarantee 8) holds 16 through carol, and its
// user bob holds nothing. With 8 GPUs free and ada and bob each asking
// for eight 1-GPU sessions, the order by owner alone serves bob (share 0)
// first and gives him all 8; down the tree, vision is below its
// guarantee and nlp above, so ada gets all 8. Without teams in the
// snapshot the test fails (bob gets them).
func TestTeamBelowGuaranteeGoesFirst(t *testing.T) {
	a := teamRunning(view(gpuNode("a", 8, "A100")), "ada-old", "ada", "vision", 0, 8)
	b := teamRunning(view(gpuNode("b", 8, "A100")), "carol-1", "carol", "nlp", 0, 8)
	c := teamRunning(view(gpuNode("c", 8, "A100")), "carol-2", "carol", "nlp", 0, 8)
	d := view(gpuNode("d", 8, "A100"))
	var pend []Pending
	for i := 0; i < 8; i++ {
		pend = append(pend, teamReq(fmt.Sprintf("ada-%d", i), "ada", "vision", 1, time.Minute),
			teamReq(fmt.Sprintf("bob-%d", i), "bob", "nlp", 1, 2*time.Minute))
	}
	s := snap([]NodeView{a, b, c, d}, pend...)
	s.Teams = state.NewTeamTree(team("vision", "", 24, 0), team("nlp", "", 8, 0))
	got := boundBy(NewPlan(s, PlanOptions{}))
	if got["ada"] != 8 || got["bob"] != 0 {
		t.Fatalf("bound %v, want ada 8 (vision below its guarantee), bob 0", got)
	}
	// Both teams at or over their guarantees: weights decide what is
	// over. vision (weight 3) holds 8 over its guarantee of 0 against
	// nlp's 16 over 0: vision goes first until it is at 3× nlp's excess.
	s.Teams = state.NewTeamTree(team("vision", "", 0, 3), team("nlp", "", 0, 1))
	got = boundBy(NewPlan(s, PlanOptions{}))
	if got["ada"] != 8 {
		t.Fatalf("bound %v, want ada 8 (vision weight 3: 8/3 over against nlp's 16)", got)
	}
}

// TestTeamTreeSharesDownTheTree: two organisations of equal weight, one
// with two teams, split 32 GPUs 16/16 at the top, and the 16 of the
// organisation with teams 8/8 between them, whatever the number of users
// in each team: three users of team a1 get 8 together, team a2's one user
// 8, and org b's one user 16.
func TestTeamTreeSharesDownTheTree(t *testing.T) {
	var nodes []NodeView
	for i := 0; i < 4; i++ {
		nodes = append(nodes, view(gpuNode(fmt.Sprintf("n%d", i), 8, "A100")))
	}
	var pend []Pending
	for i := 0; i < 32; i++ {
		for _, u := range []struct{ owner, team string }{{"u1", "a1"}, {"u2", "a1"}, {"u3", "a1"}, {"v", "a2"}, {"w", "b"}} {
			pend = append(pend, teamReq(fmt.Sprintf("%s-%02d", u.owner, i), u.owner, u.team, 1, time.Duration(i)*time.Second))
		}
	}
	s := snap(nodes, pend...)
	s.Teams = state.NewTeamTree(team("a", "", 0, 0), team("a1", "a", 0, 0), team("a2", "a", 0, 0), team("b", "", 0, 0))
	got := boundBy(NewPlan(s, PlanOptions{}))
	if a1 := got["u1"] + got["u2"] + got["u3"]; a1 != 8 || got["v"] != 8 || got["w"] != 16 {
		t.Fatalf("bound %v, want team a1 8 (its users together), a2 8, b 16", got)
	}
	for _, u := range []string{"u1", "u2", "u3"} {
		if got[u] < 2 || got[u] > 3 {
			t.Fatalf("bound %v, want a1's 8 split evenly among its three users", got)
		}
	}
}

// TestTeamMaximumCapsItsSessions: a team at its maximum waits with the
// reason naming it, though GPUs are free; so does a team whose parent is
// at the parent's maximum; and the bind is guarded on the team keys.
func TestTeamMaximumCapsItsSessions(t *testing.T) {
	a := teamRunning(view(gpuNode("a", 8, "A100")), "old", "ada", "vision", 0, 6)
	b := view(gpuNode("b", 8, "A100"))
	s := snap([]NodeView{a, b}, teamReq("more", "ada", "vision", 4, 2*time.Minute), teamReq("fits", "ada", "vision", 2, time.Minute), teamReq("one", "ada", "vision", 1, 0))
	s.Teams = state.NewTeamTree(withMax(team("vision", "", 0, 0), 8))
	p := NewPlan(s, PlanOptions{})
	if len(p.Bound) != 1 || p.Bound[0].Pending.Entry.Session != "fits" {
		t.Fatalf("bound %v, want only the 2-GPU session that fits the maximum", boundBy(p))
	}
	if len(p.Waiting) != 2 || p.Waiting[0].Reason != "Quota" || !strings.Contains(p.Waiting[0].Message, "team vision holds 6 of its maximum of 8 GPUs; this needs 4 more") ||
		!strings.Contains(p.Waiting[1].Message, "team vision is at its maximum of 8 GPUs (8 held); this needs 1 more") {
		t.Fatalf("waiting %+v, want both on team vision's maximum of 8 GPUs", p.Waiting)
	}
	// The maximum of the organisation above the team.
	s = snap([]NodeView{a, b}, teamReq("more", "ada", "vision", 4, time.Minute))
	s.Teams = state.NewTeamTree(withMax(team("org", "", 0, 0), 8), team("vision", "org", 0, 0))
	p = NewPlan(s, PlanOptions{})
	if len(p.Bound) != 0 || len(p.Waiting) != 1 || !strings.Contains(p.Waiting[0].Message, "team org (above team vision) holds 6 of its maximum of 8 GPUs; this needs 4 more") {
		t.Fatalf("plan %+v, want the session waiting on org's maximum", p.Waiting)
	}
	e := teamReq("x", "ada", "vision", 1, 0).Entry
	if sc := quotaScopes(e, s); len(sc) != 1 || sc[0].scope != state.QuotaTeams || sc[0].name != "org" {
		t.Fatalf("quota scopes %v, want the team org's maximum guarded", sc)
	}
}

// TestTeamWaitingReasonNamesTheBorrower: a session of a team below its
// guarantee that waits for capacity says what its team holds and which
// team borrows what it is owed.
func TestTeamWaitingReasonNamesTheBorrower(t *testing.T) {
	a := teamRunning(view(gpuNode("a", 8, "A100")), "n1", "bob", "nlp", 0, 8)
	b := teamRunning(view(gpuNode("b", 8, "A100")), "n2", "bob", "nlp", 0, 8)
	s := snap([]NodeView{a, b}, teamReq("v", "ada", "vision", 8, 0))
	s.Teams = state.NewTeamTree(team("vision", "", 8, 0), team("nlp", "", 8, 0))
	p := NewPlan(s, PlanOptions{})
	want := "team vision holds 0 of its 8 guaranteed GPUs; waiting for 8 GPUs borrowed by team nlp (16 held, 8 over its guarantee) to be reclaimed"
	if len(p.Waiting) != 1 || !strings.Contains(p.Waiting[0].Message, want) {
		t.Fatalf("waiting %+v, want the message to say %q", p.Waiting, want)
	}
}

// TestReclaimTakesBorrowedNeverGuaranteed: team nlp (guarantee 8) holds
// all 32 GPUs in preemptible 8-GPU jobs of the same priority as team
// vision's (guarantee 16) three waiting 8-GPU requests. Reclaim stops
// exactly two of nlp's jobs (vision's fair share is 20: 16 guaranteed and
// half of the 8 beyond both guarantees; a third job would take it to 24),
// and says why in each victim's reason. With nlp holding 24 (one node
// free) only one job is reclaimed: vision's first request takes the free
// node, and the third would pass vision's fair share.
// Without teams nothing is preempted (same priority).
func TestReclaimTakesBorrowedNeverGuaranteed(t *testing.T) {
	var nodes []NodeView
	for i := 0; i < 4; i++ {
		nodes = append(nodes, teamRunning(view(gpuNode(fmt.Sprintf("n%d", i), 8, "A100")), fmt.Sprintf("nlp-%d", i), "bob", "nlp", 0, 8))
	}
	waiting := []Pending{teamReq("v1", "ada", "vision", 8, 3*time.Minute), teamReq("v2", "ada", "vision", 8, 2*time.Minute), teamReq("v3", "ada", "vision", 8, time.Minute)}
	s := snap(nodes, waiting...)
	if ps := preempt(s, PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("without teams: %d preemptions, want none (same priority)", len(ps))
	}
	s.Teams = state.NewTeamTree(team("vision", "", 16, 0), team("nlp", "", 8, 0))
	ps := preempt(s, PreemptOptions{})
	if len(ps) != 2 {
		t.Fatalf("got %d preemptions, want 2 (vision lacks 16 GPUs)", len(ps))
	}
	for _, p := range ps {
		if len(p.Victims) != 1 || p.Victims[0].Allocation.Team != "nlp" {
			t.Fatalf("victims %+v, want one nlp job", p.Victims)
		}
		want := "team vision reclaims its guarantee"
		if !strings.Contains(p.Victims[0].Reason, want) || !strings.Contains(p.Victims[0].Reason, "your team nlp holds") {
			t.Fatalf("victim reason %q, want it to say %q and by how much nlp was over", p.Victims[0].Reason, want)
		}
	}
	if !strings.Contains(ps[0].Victims[0].Reason, "holds 32 GPUs, 24 over its guarantee of 8") {
		t.Fatalf("first reason %q, want nlp's 32 held, 24 over", ps[0].Victims[0].Reason)
	}
	// nlp holds 24, 16 borrowed: vision's first request binds on the
	// free node, the second reclaims one job, and the third finds vision
	// at its guarantee.
	nodes[3] = view(gpuNode("n3", 8, "A100"))
	s = snap(nodes, waiting...)
	s.Teams = state.NewTeamTree(team("vision", "", 16, 0), team("nlp", "", 8, 0))
	ps = preempt(s, PreemptOptions{})
	if len(ps) != 1 {
		t.Fatalf("got %d preemptions, want 1 (vision holds 8 of 16 once its first request binds)", len(ps))
	}
	// nlp at its guarantee: nothing to reclaim.
	s.Teams = state.NewTeamTree(team("vision", "", 16, 0), team("nlp", "", 24, 0))
	if ps := preempt(s, PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("got %d preemptions, want none: nlp holds only its guarantee", len(ps))
	}
}

// TestTeamDecayedUsageOrders: two teams holding the same now split free
// GPUs evenly; with decayed past usage (Snapshot.TeamUsage, from
// VOYAGER_PLACER_USAGE_HALF_LIFE) the team that used less lately goes
// first and takes them all.
func TestTeamDecayedUsageOrders(t *testing.T) {
	a := teamRunning(view(gpuNode("a", 8, "A100")), "v-old", "ada", "vision", 0, 4)
	a = teamRunning(a, "n-old", "bob", "nlp", 4, 4)
	b := view(gpuNode("b", 8, "A100"))
	var pend []Pending
	for i := 0; i < 8; i++ {
		pend = append(pend, teamReq(fmt.Sprintf("ada-%d", i), "ada", "vision", 1, time.Duration(i)*time.Second),
			teamReq(fmt.Sprintf("bob-%d", i), "bob", "nlp", 1, time.Duration(i)*time.Second))
	}
	s := snap([]NodeView{a, b}, pend...)
	s.Teams = state.NewTeamTree(team("vision", "", 0, 0), team("nlp", "", 0, 0))
	if got := boundBy(NewPlan(s, PlanOptions{})); got["ada"] != 4 || got["bob"] != 4 {
		t.Fatalf("without usage: bound %v, want 4 and 4", got)
	}
	s.TeamUsage = map[string]float64{"nlp": 300, "vision": 20}
	if got := boundBy(NewPlan(s, PlanOptions{})); got["ada"] != 8 || got["bob"] != 0 {
		t.Fatalf("with nlp's heavier past usage: bound %v, want ada 8, bob 0", got)
	}
}
