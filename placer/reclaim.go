package placer

import (
	"fmt"
	"slices"

	"github.com/voyager-gpu/voyager/state"
)

// reclaim is what PlanPreemption needs of the team tree to give a team
// below its guarantee back the GPUs other teams borrowed (issue 36): what
// every team holds, in the snapshot's ledgers and the plan's binds, less
// what the pass's earlier preemptions take and plus what they promise.
//
// A waiting session whose team (or a team above it) holds less than its
// guarantee, and whose request fits in what the team lacks, may preempt
// preemptible sessions of other teams whatever their priority, where:
//   - the victim's team is neither that team, a team below it nor one
//     above it (those are the team's own work, preempted by priority
//     only);
//   - every team above the victim's, up to where the two paths part,
//     still holds its guarantee once the victims are gone: borrowed work
//     goes, guaranteed work never;
//   - the victims that only the reclaim allows free no more GPUs than the
//     team lacks: never more than needed.
//
// Each reclaimed victim's warning says which team reclaims and by how
// much the victim's team was over its guarantee (Victim.Reason).
type reclaim struct {
	tp *teamPlan
	// models counts GPUs by guaranteed model (reclaimmodels.go); nil
	// when no team guarantees a model.
	models *modelPlan
}

// newReclaim is the reclaim state of s over views (the ledgers with the
// plan's binds), nil when no team has a guarantee.
func newReclaim(s *Snapshot, views map[string]*NodeView, names []string) *reclaim {
	guaranteed := false
	for _, t := range s.Teams.Teams {
		guaranteed = guaranteed || t.Guarantee.GPUs > 0
	}
	if !guaranteed {
		return nil
	}
	tp := newTeamPlan(&Snapshot{Teams: s.Teams}, nil, amounts{}, nil)
	for _, n := range names {
		for _, a := range views[n].Ledger.Allocations {
			tp.add(a.Team, amounts{a.MilliGPUs(), a.CPUMilli, a.MemoryMiB})
		}
	}
	return &reclaim{tp: tp, models: newReclaimModels(tp, views, names)}
}

// owedFor is the team on e's path that may reclaim for e, and what it
// lacks of its guarantee (milli-GPUs): "" when none may (no team below
// its guarantee, or e asks for more than the team lacks).
func (rc *reclaim) owedFor(e *state.QueueEntry) (string, int64) {
	if rc == nil || e.Request.Fraction() || e.Team == "" {
		return "", 0
	}
	t, lack := rc.owed(e) // by model where teams guarantee models
	if t == "" || requestGPUs(e, 0) > lack {
		return "", 0
	}
	return t, lack
}

// allow returns which allocations e may preempt beyond those of lower
// priority: preemptible work of teams that borrow from e's owed team.
func (rc *reclaim) allow(e *state.QueueEntry) func(*state.Allocation) bool {
	t, _ := rc.owedFor(e)
	if t == "" {
		return func(*state.Allocation) bool { return false }
	}
	return func(a *state.Allocation) bool {
		return rc.surplus(t, a.Team, a.MilliGPUs()) && rc.modelAllows(e, t, a)
	}
}

// surplus reports whether team victim (of an allocation of gpus) is apart
// from team owed, and every team above it up to where their paths part
// holds its guarantee with gpus fewer.
func (rc *reclaim) surplus(owed, victim string, gpus int64) bool {
	op, vp := rc.tp.path(owed), rc.tp.path(victim)
	if slices.Contains(vp, owed) || slices.Contains(op, victim) {
		return false
	}
	for _, x := range vp {
		if slices.Contains(op, x) {
			continue
		}
		if x == noTeam {
			continue // no team: nothing is guaranteed to it
		}
		if rc.tp.gpus(x)-gpus < rc.tp.guarantee(x) {
			return false
		}
	}
	return true
}

// reclaimed reports whether v is taken for e by the reclaim alone (its
// priority is not below e's).
func reclaimed(e *state.QueueEntry, v *Victim) bool { return v.Allocation.Priority >= e.Priority }

// within checks victims, chosen for e on one node, together: the ones
// the reclaim alone allows free at most what e's team lacks, and leave
// every team they come from at its guarantee.
func (rc *reclaim) within(e *state.QueueEntry, victims []Victim) bool {
	if rc == nil {
		return true
	}
	t, lack := rc.owedFor(e)
	var sum int64
	byTeam := map[string]int64{}
	for i := range victims {
		if !reclaimed(e, &victims[i]) {
			continue
		}
		if t == "" {
			return false
		}
		g := victims[i].Allocation.MilliGPUs()
		sum += g
		byTeam[victims[i].Allocation.Team] += g
	}
	if sum > lack {
		return false
	}
	for team, g := range byTeam {
		if !rc.surplus(t, team, g) {
			return false
		}
	}
	return rc.modelWithin(e, t, victims)
}

// took records a decision: e's request counts for its team, the victims'
// GPUs no longer for theirs; each victim the reclaim alone allowed gets
// its Reason.
func (rc *reclaim) took(e *state.QueueEntry, victims []Victim) {
	if rc == nil {
		return
	}
	t, _ := rc.owedFor(e)
	for i := range victims {
		v := &victims[i]
		if reclaimed(e, v) && t != "" {
			v.Reason = rc.reasonFor(e, t, v.Allocation.Team) // reclaimmodels.go
		}
	}
	for i := range victims {
		a := &victims[i].Allocation
		rc.tp.add(a.Team, amounts{-a.MilliGPUs(), -a.CPUMilli, -a.MemoryMiB})
	}
	if !e.Request.Fraction() {
		rc.tp.add(e.Team, amounts{1000 * int64(e.Request.GPUs), e.Request.CPUMilli, e.Request.MemoryMiB})
	}
	rc.modelsTook(e, victims)
}

// reason says why a session of team victim is preempted for team owed:
// "team vision reclaims its guarantee (it holds 4 of its 16 guaranteed
// GPUs); your team nlp holds 20 GPUs, 12 over its guarantee of 8".
func (rc *reclaim) reason(owed, victim string) string {
	op := rc.tp.path(owed)
	over := victim
	for _, x := range rc.tp.path(victim) {
		if !slices.Contains(op, x) {
			over = x // the team where the paths part: the borrower
			break
		}
	}
	held, g := rc.tp.gpus(over), rc.tp.guarantee(over)
	whose := "your team " + over
	switch {
	case over == noTeam:
		whose = "sessions of no team"
	case over != victim:
		whose = fmt.Sprintf("team %s (above your team %s)", over, victim)
	}
	return fmt.Sprintf("team %s reclaims its guarantee (it holds %s of its %d guaranteed GPUs); %s holds %s GPUs, %s over its guarantee of %s",
		owed, scaled(rc.tp.gpus(owed), 1000), rc.tp.tree.Teams[owed].Guarantee.GPUs, whose, scaled(held, 1000), scaled(held-g, 1000), scaled(g, 1000))
}
