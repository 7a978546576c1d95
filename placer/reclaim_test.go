package placer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestReclaimToFairShareBeyondGuarantee: 16 nodes of 2 GPUs, all held by
// team nlp (guarantee 8) in 2-GPU preemptible jobs; team vision
// (guarantee 16) waits with twelve 2-GPU requests. Both ask for more than
// the cluster, so vision's fair share is its 16 and half of the 8 beyond
// both guarantees: 20, nlp's 12. Reclaim stops ten of nlp's jobs, not
// eight: eight by guarantee, then two by fair share, each victim's reason
// saying which, and none that would take nlp below 12 or vision past 20.
// Reclaiming only up to the guarantee (the rule before issue 36's "beyond
// KAI") stops eight.
func TestReclaimToFairShareBeyondGuarantee(t *testing.T) {
	var nodes []NodeView
	for i := 0; i < 16; i++ {
		nodes = append(nodes, teamRunning(view(gpuNode(fmt.Sprintf("n%02d", i), 2, "A100")), fmt.Sprintf("nlp-%02d", i), "bob", "nlp", 0, 2))
	}
	var waiting []Pending
	for i := 0; i < 12; i++ {
		waiting = append(waiting, teamReq(fmt.Sprintf("v%02d", i), "ada", "vision", 2, time.Duration(20-i)*time.Minute))
	}
	s := snap(nodes, waiting...)
	s.Teams = state.NewTeamTree(team("vision", "", 16, 0), team("nlp", "", 8, 0))
	fair := TeamFairShares(s)
	if fair["vision"] != 20 || fair["nlp"] != 12 {
		t.Fatalf("fair shares %v, want vision 20, nlp 12", fair)
	}
	ps := preempt(s, PreemptOptions{Max: 16})
	if len(ps) != 10 {
		t.Fatalf("%d preemptions, want 10: vision from 0 to its fair share of 20 GPUs", len(ps))
	}
	byRule := map[string]int{}
	for _, p := range ps {
		if len(p.Victims) != 1 || p.Victims[0].Allocation.Team != "nlp" {
			t.Fatalf("victims %+v, want one nlp job", p.Victims)
		}
		switch r := p.Victims[0].Reason; {
		case strings.HasPrefix(r, "team vision reclaims its guarantee"):
			byRule["guarantee"]++
		case strings.HasPrefix(r, "team vision reclaims its fair share"):
			byRule["fair"]++
		default:
			t.Fatalf("reason %q, want the reclaim named", r)
		}
	}
	if byRule["guarantee"] != 8 || byRule["fair"] != 2 {
		t.Fatalf("by rule %v, want 8 by guarantee then 2 by fair share", byRule)
	}
	want := []string{
		"team vision reclaims its fair share (it holds 16 GPUs of a fair share of 20, guarantee 16); your team nlp holds 16 GPUs, 4 over its fair share of 12 (guarantee 8)",
		"team vision reclaims its fair share (it holds 18 GPUs of a fair share of 20, guarantee 16); your team nlp holds 14 GPUs, 2 over its fair share of 12 (guarantee 8)",
	}
	for i, w := range want {
		if got := ps[8+i].Victims[0].Reason; got != w {
			t.Errorf("reason %d: %q, want %q", 8+i, got, w)
		}
	}
}

// TestReclaimNeverTakesATeamBelowItsShare: the hysteresis. Two teams of
// equal weight on 24 GPUs, both asking for more than half: fair shares 12
// each. nlp holds 14 (4-GPU jobs and one of 2), vision 10 with 2-GPU
// requests waiting: vision is owed 2, and nlp's 2-GPU job goes (nlp keeps
// its 12), never a 4-GPU one (nlp would fall to 10, below its share, and
// be owed back what vision then held beyond its own: a ping-pong). With
// nlp at its share nothing is reclaimed, and a 4-GPU request of vision,
// owed only 2, takes nothing.
func TestReclaimNeverTakesATeamBelowItsShare(t *testing.T) {
	build := func(withTwo bool, waiting ...Pending) *Snapshot {
		b := teamRunning(view(gpuNode("b", 8, "A100")), "nlp-4c", "bob", "nlp", 0, 4)
		if withTwo {
			b = teamRunning(b, "nlp-2", "bob", "nlp", 4, 2)
		}
		nodes := []NodeView{
			teamRunning(teamRunning(view(gpuNode("a", 8, "A100")), "nlp-4a", "bob", "nlp", 0, 4), "nlp-4b", "bob", "nlp", 4, 4),
			teamRunning(b, "vis-0", "ada", "vision", 6, 2),
			teamRunning(view(gpuNode("c", 8, "A100")), "vis-1", "ada", "vision", 0, 8),
		}
		s := snap(nodes, append(waiting, teamReq("n1", "bob", "nlp", 4, time.Minute))...)
		s.Teams = state.NewTeamTree(team("vision", "", 0, 0), team("nlp", "", 0, 0))
		return s
	}
	two := []Pending{teamReq("v1", "ada", "vision", 2, 2*time.Minute), teamReq("v2", "ada", "vision", 2, time.Minute)}
	s := build(true, two...)
	if f := TeamFairShares(s); f["vision"] != 12 || f["nlp"] != 12 {
		t.Fatalf("fair shares %v, want 12 each", f)
	}
	ps := preempt(s, PreemptOptions{})
	if len(ps) != 1 || len(ps[0].Victims) != 1 || ps[0].Victims[0].Session != "nlp-2" {
		t.Fatalf("preemptions %+v, want nlp-2 alone", ps)
	}
	if want := "your team nlp holds 14 GPUs, 2 over its fair share of 12"; !strings.Contains(ps[0].Victims[0].Reason, want) {
		t.Fatalf("reason %q, want it to say %q", ps[0].Victims[0].Reason, want)
	}
	// nlp at its share (12), 2 GPUs free: v1 binds there, nothing goes.
	if ps := preempt(build(false, two...), PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("preemptions %+v, want none: nlp holds its share", ps)
	}
	// vision asks for 4 and is owed 2.
	if ps := preempt(build(true, teamReq("v4", "ada", "vision", 4, time.Minute)), PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("preemptions %+v, want none: vision asks for 4 and is owed 2", ps)
	}
}

// TestReclaimToFairShareSettles proves reclaim does not oscillate. Two
// teams of equal weight and no guarantee on 6 nodes of 8 GPUs: team nlp
// holds the whole cluster in preemptible jobs of 1, 2 and 4 GPUs (random
// per seed) and has as much again waiting; team vision arrives with as
// much waiting. Passes repeat as the placer and the lifecycle controller
// run them, with victims stopping at once (the worst case: no grace to
// let a pass see the state settle), their nodes held for their
// preemptors by their queue entries' holds (preempthold.go), until a pass
// neither binds nor preempts. Nothing ends or arrives meanwhile, so any
// preemption beyond what brings vision to its share is churn. For each
// seed: the passes settle; every reclaim went one way, from nlp to vision
// (a ping-pong would need nlp to reclaim back); no session was preempted
// twice; and each team ends within a job's size (4 GPUs) of its fair
// share of 24.
func TestReclaimToFairShareSettles(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 36))
			sizes := []int{1, 2, 4}
			var nodes []NodeView
			n := 0
			for i := 0; i < 6; i++ {
				v := view(gpuNode(fmt.Sprintf("n%d", i), 8, "A100"))
				for used := 0; used < 8; {
					g := min(sizes[rng.IntN(3)], 8-used)
					if g == 3 {
						g = 2
					}
					v = teamRunning(v, fmt.Sprintf("nlp-run-%02d", n), "bob", "nlp", used, g)
					used += g
					n++
				}
				nodes = append(nodes, v)
			}
			var pending []Pending
			for i := 0; i < 24; i++ {
				pending = append(pending, teamReq(fmt.Sprintf("nlp-wait-%02d", i), "bob", "nlp", sizes[rng.IntN(3)], time.Hour+time.Duration(i)*time.Second))
				p := teamReq(fmt.Sprintf("vis-%02d", i), "ada", "vision", sizes[rng.IntN(3)], time.Minute-time.Duration(i)*time.Second)
				p.Entry.Preemptible = true
				pending = append(pending, p)
			}
			teams := state.NewTeamTree(team("vision", "", 0, 0), team("nlp", "", 0, 0))
			preempted := map[string]int{}
			dirs := map[string]int{}
			now := t0
			settled := false
			for pass := 0; pass < 60 && !settled; pass++ {
				s := snap(nodes, pending...)
				s.Now, s.Teams = now, teams
				s.Held = AddEntryHolds(nil, pending, now)
				plan := NewPlan(s, PlanOptions{})
				bound := map[string]bool{}
				for _, d := range plan.Bound {
					e := d.Pending.Entry
					for _, pp := range d.Parts {
						v := nodeByName(nodes, pp.Node)
						a := allocation(e, pp)
						a.Preemptible = true
						v.Ledger.Allocations[e.Session] = a
					}
					bound[e.Session] = true
				}
				ps := PlanPreemption(s, plan, PreemptOptions{Max: 8})
				kept := make([]Pending, 0, len(pending))
				for _, p := range pending {
					if !bound[p.Entry.Session] {
						kept = append(kept, p)
					}
				}
				pending = kept
				for _, p := range ps {
					for _, v := range p.Victims {
						if v.Reason == "" {
							t.Fatalf("victim %s taken without a reclaim's reason", v.Session)
						}
						dirs[v.Allocation.Team+"→"+p.Preemptor.Entry.Team]++
						preempted[v.Session]++
						delete(nodeByName(nodes, p.Node).Ledger.Allocations, v.Session)
						re := teamReq(v.Session, v.Allocation.Owner, v.Allocation.Team, len(v.Allocation.GPUs), time.Hour)
						re.Entry.Preemptible = true
						pending = append(pending, re)
					}
					for i := range pending {
						if pending[i].Entry.Session == p.Preemptor.Entry.Session {
							e := *pending[i].Entry
							e.Hold = &state.QueueHold{Node: p.Node, Until: now.Add(4 * time.Minute)}
							pending[i].Entry = &e
						}
					}
				}
				settled = len(plan.Bound) == 0 && len(ps) == 0
				now = now.Add(2 * time.Minute)
			}
			if !settled {
				t.Fatalf("no fixed point after 60 passes; reclaims %v", dirs)
			}
			for d, k := range dirs {
				if d != "nlp→vision" {
					t.Errorf("%d reclaims %s, want every reclaim from nlp to vision", k, d)
				}
			}
			if dirs["nlp→vision"] == 0 {
				t.Error("nothing reclaimed: the test shows nothing")
			}
			for id, k := range preempted {
				if k > 1 {
					t.Errorf("%s preempted %d times", id, k)
				}
			}
			held := map[string]int{}
			for _, v := range nodes {
				for _, a := range v.Ledger.Allocations {
					held[a.Team] += len(a.GPUs)
				}
			}
			for _, tm := range []string{"vision", "nlp"} {
				if math.Abs(float64(held[tm]-24)) > 4 {
					t.Errorf("team %s holds %d GPUs at the fixed point, want within 4 of its share of 24", tm, held[tm])
				}
			}
			t.Logf("held %v after %d reclaims", held, dirs["nlp→vision"])
		})
	}
}

// nodeByName is the view of nodes named name.
func nodeByName(nodes []NodeView, name string) *NodeView {
	for i := range nodes {
		if nodes[i].Node.Name == name {
			return &nodes[i]
		}
	}
	return nil
}

// TestHeldNodeStaysWithItsPreemptor: a preemption freed node a for
// vision-p, whose victims' warnings are gone; vision-old, of the same
// team and older, asks for the same 8 GPUs and comes first in the order.
// The node's hold in vision-p's queue entry (state.QueueEntry.Hold) keeps
// it for vision-p, which binds there in this pass: one round of grace,
// not two. A hold that lapsed (past Until) keeps nothing: vision-old
// takes the node. A preemptor holding a node plans no other preemption.
func TestHeldNodeStaysWithItsPreemptor(t *testing.T) {
	a := view(gpuNode("a", 8, "A100"))
	b := teamRunning(view(gpuNode("b", 8, "A100")), "nlp-1", "bob", "nlp", 0, 8)
	old := teamReq("vision-old", "ada", "vision", 8, time.Hour)
	p := teamReq("vision-p", "ada", "vision", 8, time.Minute)
	p.Entry.Hold = &state.QueueHold{Node: "a", Until: t0.Add(time.Minute)}
	build := func(now time.Time) *Snapshot {
		s := snap([]NodeView{a, b}, old, p)
		s.Now = now
		s.Teams = state.NewTeamTree(team("vision", "", 16, 0), team("nlp", "", 0, 0))
		s.Held = AddEntryHolds(nil, s.Pending, now)
		return s
	}
	s := build(t0)
	plan := NewPlan(s, PlanOptions{})
	if len(plan.Bound) != 1 || plan.Bound[0].Pending.Entry.Session != "vision-p" || plan.Bound[0].Parts[0].Node != "a" {
		t.Fatalf("bound %+v, want vision-p on its held node a", plan.Bound)
	}
	// vision-old reclaims node b for itself; vision-p's own hold is spent.
	if ps := PlanPreemption(s, plan, PreemptOptions{}); len(ps) != 1 || ps[0].Preemptor.Entry.Session != "vision-old" || ps[0].Node != "b" {
		t.Fatalf("preemptions %+v, want vision-old reclaiming b", ps)
	}
	s = build(t0.Add(time.Minute))
	plan = NewPlan(s, PlanOptions{})
	if len(plan.Bound) != 1 || plan.Bound[0].Pending.Entry.Session != "vision-old" {
		t.Fatalf("bound %+v, want vision-old first once vision-p's hold lapsed", plan.Bound)
	}
	// While it holds a node whose victims still stop, vision-p plans no
	// other preemption.
	a2 := teamRunning(view(gpuNode("a", 8, "A100")), "nlp-0", "bob", "nlp", 0, 8)
	s = snap([]NodeView{a2, b}, p)
	s.Teams = state.NewTeamTree(team("vision", "", 16, 0), team("nlp", "", 0, 0))
	s.Held = AddEntryHolds(nil, s.Pending, t0)
	if ps := preempt(s, PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("preemptions %+v, want none: vision-p's preemption on a is under way", ps)
	}
}

// TestFairSharesDownTheTree: org a (guarantee 8) with teams a1 (guarantee
// 4, weight 1) and a2 (no guarantee, weight 3), org b (no guarantee),
// sessions of no team, and org c with no work, on 32 GPUs, everyone
// asking for more than all of it. The roots with work first get their
// guarantees (a 8), then the 24 left by weight (a, b and no team 8 each):
// a 16, b 8, no team 8; c nothing. Inside a, a1 gets its 4, then the 12
// left go 1:3 (a1 3, a2 9): a1 7, a2 9. Each share counts once: the roots
// are not given a second share through the sessions of no team.
func TestFairSharesDownTheTree(t *testing.T) {
	var nodes []NodeView
	for i := 0; i < 4; i++ {
		nodes = append(nodes, view(gpuNode(fmt.Sprintf("n%d", i), 8, "A100")))
	}
	var pending []Pending
	for i, who := range []struct{ owner, team string }{{"u1", "a1"}, {"u2", "a2"}, {"u3", "b"}, {"u4", ""}} {
		for j := 0; j < 8; j++ {
			pending = append(pending, teamReq(fmt.Sprintf("s%d-%d", i, j), who.owner, who.team, 8, time.Minute))
		}
	}
	s := snap(nodes, pending...)
	s.Teams = state.NewTeamTree(team("a", "", 8, 0), team("a1", "a", 4, 1), team("a2", "a", 0, 3), team("b", "", 0, 0), team("c", "", 0, 0))
	got := TeamFairShares(s)
	want := map[string]float64{"a": 16, "a1": 7, "a2": 9, "b": 8, "": 8}
	var names []string
	for n := range got {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		if got[n] != want[n] {
			t.Errorf("team %q: fair share %v, want %v", n, got[n], want[n])
		}
	}
	if len(got) != len(want) {
		t.Errorf("fair shares %v, want %v (c has no work: no share)", got, want)
	}
	// The owners' shares (the hold budgets, entitle) add up to the
	// cluster, each owner's its team's.
	tp := newTeamPlan(s, nil, amounts{}, nil)
	tp.ownerHeld = map[ownerInTeam]int64{}
	owners, _ := tp.split(32000, tp.demand(s.Pending, 0), func(string) float64 { return 1 })
	wantOwners := map[string]int64{"u1": 7000, "u2": 9000, "u3": 8000, "u4": 8000}
	for o, w := range wantOwners {
		if owners[o] != w {
			t.Errorf("owner %s: share %d milli-GPUs, want %d (all %v)", o, owners[o], w, owners)
		}
	}
}

// TestTeamWaitingReasonNamesTheFairShare: a session of a team at or above
// its guarantee but below its fair share says so and names the team over
// its own share; one of a team at its fair share says nothing is
// reclaimed for it. 24 GPUs, vision and nlp with guarantees of 4 and
// equal weights: vision holding 8 and asking for 2 more is owed 10 (4,
// and 6 of the 16 beyond the guarantees), nlp 14; holding 12 and asking
// for 2, vision's share is 12.
func TestTeamWaitingReasonNamesTheFairShare(t *testing.T) {
	build := func(visionOnB int) *Snapshot {
		b := teamRunning(view(gpuNode("b", 8, "A100")), "n2", "bob", "nlp", 0, 8-visionOnB)
		if visionOnB > 0 {
			b = teamRunning(b, "v0", "ada", "vision", 8-visionOnB, visionOnB)
		}
		nodes := []NodeView{
			teamRunning(view(gpuNode("a", 8, "A100")), "n1", "bob", "nlp", 0, 8), b,
			teamRunning(view(gpuNode("c", 8, "A100")), "v1", "ada", "vision", 0, 8),
		}
		var waiting []Pending
		for i := 0; i < 3; i++ {
			waiting = append(waiting, teamReq(fmt.Sprintf("nw%d", i), "bob", "nlp", 8, time.Hour))
		}
		s := snap(nodes, append(waiting, teamReq("v", "ada", "vision", 2, time.Minute))...)
		s.Teams = state.NewTeamTree(team("vision", "", 4, 0), team("nlp", "", 4, 0))
		return s
	}
	message := func(s *Snapshot) string {
		for _, w := range NewPlan(s, PlanOptions{}).Waiting {
			if w.Pending.Entry.Session == "v" {
				return w.Message
			}
		}
		t.Fatal("v is not waiting")
		return ""
	}
	want := "team vision holds 8 GPUs, below its fair share of 10 (guarantee 4); waiting for 2 GPUs held beyond their fair share by team nlp (16 held, fair share 14) to be reclaimed"
	if got := message(build(0)); !strings.Contains(got, want) {
		t.Errorf("message %q, want it to say %q", got, want)
	}
	want = "team vision holds 12 GPUs, at or beyond its fair share of 12 (guarantee 4): nothing is reclaimed for it, it waits for room"
	if got := message(build(4)); !strings.Contains(got, want) {
		t.Errorf("message %q, want it to say %q", got, want)
	}
}

// TestReclaimDeterministic: the same cluster, its nodes and queue read in
// any order, gives the same preemptions, victims and reasons (fair shares
// are sums of floats and maps are unordered: every placer and controller
// must still agree). Three teams in a tree with guarantees and weights,
// one holding everything, the others waiting.
func TestReclaimDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(36, 3))
	var nodes []NodeView
	n := 0
	for i := 0; i < 12; i++ {
		v := view(gpuNode(fmt.Sprintf("n%02d", i), 8, "A100"))
		for used := 0; used < 8; {
			g := min([]int{1, 2, 4}[rng.IntN(3)], 8-used)
			if g == 3 {
				g = 2
			}
			v = teamRunning(v, fmt.Sprintf("b-%03d", n), fmt.Sprintf("u%d", n%3), "b", used, g)
			used += g
			n++
		}
		nodes = append(nodes, v)
	}
	var pending []Pending
	for i := 0; i < 40; i++ {
		tm := []string{"a1", "a2", "b"}[i%3]
		pending = append(pending, teamReq(fmt.Sprintf("w-%03d", i), fmt.Sprintf("v%d", i%4), tm, []int{1, 2, 4}[rng.IntN(3)], time.Duration(i)*time.Minute))
	}
	teams := state.NewTeamTree(team("a", "", 32, 2), team("a1", "a", 8, 1), team("a2", "a", 0, 3), team("b", "", 16, 1))
	describe := func(ps []Preemption) string {
		var b strings.Builder
		for _, p := range ps {
			fmt.Fprintf(&b, "%s@%s:", p.Preemptor.Entry.Session, p.Node)
			for _, v := range p.Victims {
				fmt.Fprintf(&b, " %s (%s)", v.Session, v.Reason)
			}
			b.WriteString("\n")
		}
		return b.String()
	}
	var first string
	for round := 0; round < 20; round++ {
		ns := append([]NodeView(nil), nodes...)
		ps := append([]Pending(nil), pending...)
		rng.Shuffle(len(ns), func(i, j int) { ns[i], ns[j] = ns[j], ns[i] })
		rng.Shuffle(len(ps), func(i, j int) { ps[i], ps[j] = ps[j], ps[i] })
		s := snap(ns, ps...)
		s.Teams = teams
		got := describe(preempt(s, PreemptOptions{Max: 16}))
		if round == 0 {
			first = got
			t.Logf("preemptions:\n%s", got)
			if !strings.Contains(got, "reclaims its fair share") || !strings.Contains(got, "reclaims its guarantee") {
				t.Fatalf("preemptions:\n%s\nwant reclaims by guarantee and by fair share (else the test shows little)", got)
			}
			continue
		}
		if got != first {
			t.Fatalf("round %d:\n%s\nround 0:\n%s", round, got, first)
		}
	}
}
