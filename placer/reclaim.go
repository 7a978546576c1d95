package placer

import (
	"fmt"

	"github.com/voyager-gpu/voyager/state"
)

// reclaim is what PlanPreemption needs of the team tree to give a team
// below its guarantee, and beyond that below its fair share, the GPUs
// other teams hold beyond theirs (issue 36, "beyond KAI": not only the
// guarantee back).
//
// Fair share is computed down the tree (teamPlan.split): at each level
// each team first gets what it asks for up to its guarantee, then the
// rest by weight over what teams still ask for, capped at their maxima;
// only teams with work waiting or running ask. Demand is what a team's
// sessions hold plus what its waiting sessions ask for, so a preemption
// moves demand from held to waiting and changes no fair share: the shares
// the reclaim steers towards stand still while it acts.
//
// A waiting session e of a team may preempt preemptible sessions of
// another team whatever their priority under one of two rules, each with
// its own share: byGuarantee (a team's guarantee, as before issue 36's
// "beyond KAI") and byFairShare (its fair share). With op e's team path
// and vp the victim's, a rule allows a victim where:
//   - neither team is the other or above it (a team's own work is
//     preempted by priority only);
//   - every team on op below the level where the paths part is below its
//     share by at least e's request, and the victims the reclaim alone
//     allows free no more than the least of those gaps (a reclaimer takes
//     only what it is owed);
//   - every team on vp below that level keeps at least its share once
//     the victims are gone: it is over its share by at least the victims'
//     size.
//
// These last two are the hysteresis that keeps reclaim from oscillating.
// After a reclaim the reclaimer holds at most its share under the rule
// used, so at most its fair share (a team asking for its guarantee has a
// fair share of at least that), and the victim's team at least its own:
// the victim's team, below its share now perhaps, can reclaim from the
// reclaimer only once that holds more than its fair share by a victim's
// size, which no reclaim gives it. With equal weights and work waiting on
// both sides two teams settle within a session's size of their shares and
// stay there (TestReclaimToFairShareSettles; it fails with the hysteresis
// off). Fair share spreads the whole cluster, idle GPUs included (a node
// drained for a large request), so a team over its share by less than a
// session because GPUs sit idle loses nothing to it: the guarantee's rule,
// which ignores idle GPUs, is tried first. Under that rule a victim's team
// keeps its guarantee, not always its fair share: with three teams or more
// (or idle GPUs) it can fall below its fair share while a third team is
// over its own, and then reclaims from that one by fair share. Keeping the
// fair share under both rules made a returning team wait up to 7 minutes
// for its guarantee instead of 4 (the idle GPUs); keeping the fair share of
// the GPUs in use (less the idle ones) let transients through, and
// team-returns preempted 134–143 sessions instead of 23–31.
//
// Preemptions under way count as done: a session warned of a preemption
// (Snapshot.Preempting) no longer counts for its team, and a waiting
// session for which a node is held (Snapshot.Held: its victims stop, or
// stopped) counts for its own, so a team is never reclaimed for twice.
// Each reclaimed victim's warning says which team reclaims, under which
// rule, and by how much the victim's team was over its share
// (Victim.Reason).
type reclaim struct {
	tp *teamPlan
	// fair is each team's fair share, milli-GPUs.
	fair map[string]int64
	// models counts GPUs by guaranteed model (reclaimmodels.go); nil
	// when no team guarantees a model.
	models *modelPlan
}

// newReclaim is the reclaim state of s over views (the ledgers with the
// plan's binds), with waiting the sessions the plan left waiting; nil when
// s has no teams.
func newReclaim(s *Snapshot, waiting []*Pending, views map[string]*NodeView, names []string) *reclaim {
	if len(s.Teams.Teams) == 0 {
		return nil
	}
	tp := newTeamPlan(&Snapshot{Teams: s.Teams}, nil, amounts{}, nil)
	tp.ownerHeld = map[ownerInTeam]int64{}
	states := make([]*nodeState, 0, len(names))
	var capacity int64
	for _, n := range names {
		v := views[n]
		ns := newNodeState(v)
		states = append(states, ns)
		capacity += 1000 * int64(ns.totalGPU)
		for id, a := range v.Ledger.Allocations {
			tp.ownerHeld[tp.leaf(a.Team, a.Owner)] += a.MilliGPUs()
			if _, going := s.Preempting[id]; going {
				continue // its preemptor's now
			}
			tp.add(a.Team, amounts{a.MilliGPUs(), a.CPUMilli, a.MemoryMiB})
		}
	}
	ref := sharedRefMiB(states)
	asks := make([]Pending, 0, len(waiting))
	holders := holdersOf(s)
	for _, w := range waiting {
		asks = append(asks, *w)
		if e := w.Entry; holders[e.Session] {
			tp.add(e.Team, amounts{requestGPUs(e, ref), e.Request.CPUMilli, e.Request.MemoryMiB})
		}
	}
	owners := func(string) float64 { return 1 }
	if len(s.UserQuotas) > 0 {
		owners = (&planner{snap: s}).ownerWeight
	}
	_, fair := tp.split(capacity, tp.demand(asks, ref), owners)
	return &reclaim{tp: tp, fair: fair, models: newReclaimModels(tp, views, names)}
}

// demand is what each owner holds in each team (ownerHeld) plus what its
// requests in pending ask for.
func (tp *teamPlan) demand(pending []Pending, shareRef int64) map[ownerInTeam]int64 {
	demand := make(map[ownerInTeam]int64, len(tp.ownerHeld))
	for k, g := range tp.ownerHeld {
		demand[k] = g
	}
	for i := range pending {
		if it := &pending[i]; !it.Pinned {
			demand[tp.leaf(it.Entry.Team, it.Entry.Owner)] += requestGPUs(it.Entry, shareRef)
		}
	}
	return demand
}

// parted is where paths a and b part: the index of the first team they do
// not share; ok false when one path is the other's beginning (one team is
// the other or above it).
func parted(a, b []string) (int, bool) {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return i, i < len(a) && i < len(b)
}

// reclaimRule is one rule of reclaim: the share it gives each team, which a
// reclaimer's side must be below and a victim's side keep.
type reclaimRule int

const (
	// byGuarantee: a team below its guarantee takes from teams over
	// theirs (the rule KAI has). What it is owed is its guarantee, not
	// capped by what it asks for: a victim larger than its request may
	// go, whose room its later requests take.
	byGuarantee reclaimRule = iota
	// byFairShare: a team below its fair share takes from teams over
	// theirs ("beyond KAI"). Fair share is capped by what a team asks
	// for, so it takes no more than its waiting work needs.
	byFairShare
	// byModelGuarantee: a team below its guarantee of the GPU model a
	// request names takes GPUs of that model from teams that hold them
	// beyond their own guarantee of it (reclaimmodels.go), though by count
	// it may hold its whole guarantee.
	byModelGuarantee
)

// share is team t's share under rule r, milli-GPUs.
func (rc *reclaim) share(r reclaimRule, t string) int64 {
	if r == byGuarantee {
		return rc.tp.guarantee(t)
	}
	return rc.fair[t]
}

// gap is what the teams on op from index i down lack of their shares
// under r, the least of them (negative where one is over its share).
func (rc *reclaim) gap(r reclaimRule, op []string, i int) int64 {
	least := int64(1) << 62
	for _, x := range op[i:] {
		least = min(least, rc.share(r, x)-rc.tp.gpus(x))
	}
	return least
}

// reclaimer reports whether e may reclaim at all: it asks for whole GPUs
// on one node and is charged to a team.
func (rc *reclaim) reclaimer(e *state.QueueEntry) bool {
	return rc != nil && e.Team != "" && !e.Request.Fraction() && e.Workers == 0
}

// allow returns which allocations e may preempt beyond those of lower
// priority: preemptible work of teams that hold what e's team is owed,
// under either rule.
func (rc *reclaim) allow(e *state.QueueEntry) func(*state.Allocation) bool {
	if !rc.reclaimer(e) {
		return func(*state.Allocation) bool { return false }
	}
	op, req := rc.tp.path(e.Team), requestGPUs(e, 0)
	mt, mlack, byModel := rc.modelOwed(e)
	return func(a *state.Allocation) bool {
		vp := rc.tp.path(a.Team)
		i, ok := parted(op, vp)
		if !ok {
			return false
		}
		if byModel && max(req, a.MilliGPUs()) <= mlack && rc.modelAllows(e, mt, a) && rc.surplus(byGuarantee, vp, i, map[string]int64{}, a.MilliGPUs()) {
			return true
		}
		for _, r := range []reclaimRule{byGuarantee, byFairShare} {
			if rc.gap(r, op, i) >= max(req, a.MilliGPUs()) && rc.surplus(r, vp, i, map[string]int64{}, a.MilliGPUs()) && rc.modelAllows(e, e.Team, a) {
				return true
			}
		}
		return false
	}
}

// surplus reports whether every team on vp from index i down holds its
// share under r with gpus fewer, beyond the taken it has already lost (by
// team); it adds gpus to taken.
func (rc *reclaim) surplus(r reclaimRule, vp []string, i int, taken map[string]int64, gpus int64) bool {
	ok := true
	for _, x := range vp[i:] {
		taken[x] += gpus
		if rc.tp.gpus(x)-taken[x] < rc.share(r, x) {
			ok = false
		}
	}
	return ok
}

// reclaimed reports whether v is taken for e by the reclaim alone (its
// priority is not below e's).
func reclaimed(e *state.QueueEntry, v *Victim) bool { return v.Allocation.Priority >= e.Priority }

// rule is the rule under which victims, chosen for e on one node, may go
// together: the ones the reclaim alone allows free at most what e's side
// is owed against each of their teams (and e's request fits in it), and
// leave every team they come from at its share. The guarantee's rule is
// tried first. ok false when neither allows them; true with no rule to
// name when the reclaim takes none of them.
func (rc *reclaim) rule(e *state.QueueEntry, victims []Victim) (reclaimRule, bool) {
	if rc == nil {
		return 0, true
	}
	op := rc.tp.path(e.Team)
	any := false
	for i := range victims {
		any = any || reclaimed(e, &victims[i])
	}
	if !any {
		return 0, true
	}
	if !rc.reclaimer(e) {
		return 0, false
	}
	if mt, mlack, ok := rc.modelOwed(e); ok {
		var sum int64
		kept := true // every victim's team keeps its guarantee by count
		taken := map[string]int64{}
		for i := range victims {
			if v := &victims[i]; reclaimed(e, v) {
				vp := rc.tp.path(v.Allocation.Team)
				at, apart := parted(op, vp)
				if !apart {
					return 0, false
				}
				sum += v.Allocation.MilliGPUs()
				kept = rc.surplus(byGuarantee, vp, at, taken, v.Allocation.MilliGPUs()) && kept
			}
		}
		if kept && sum <= mlack && rc.modelWithin(e, mt, victims) {
			return byModelGuarantee, true
		}
	}
next:
	for _, r := range []reclaimRule{byGuarantee, byFairShare} {
		var sum int64
		owed := int64(1) << 62
		taken := map[string]int64{}
		for i := range victims {
			v := &victims[i]
			if !reclaimed(e, v) {
				continue
			}
			vp := rc.tp.path(v.Allocation.Team)
			at, ok := parted(op, vp)
			if !ok {
				return 0, false
			}
			g := v.Allocation.MilliGPUs()
			sum += g
			owed = min(owed, rc.gap(r, op, at))
			if !rc.surplus(r, vp, at, taken, g) {
				continue next
			}
		}
		if sum <= owed && requestGPUs(e, 0) <= owed && rc.modelWithin(e, e.Team, victims) {
			return r, true
		}
	}
	return 0, false
}

// within checks victims, chosen for e on one node, together (rule).
func (rc *reclaim) within(e *state.QueueEntry, victims []Victim) bool {
	_, ok := rc.rule(e, victims)
	return ok
}

// took records a decision: e's request counts for its team, the victims'
// GPUs no longer for theirs; each victim the reclaim alone allowed gets
// its Reason (said before the counts change).
func (rc *reclaim) took(e *state.QueueEntry, victims []Victim) {
	if rc == nil {
		return
	}
	if r, ok := rc.rule(e, victims); ok && rc.reclaimer(e) {
		for i := range victims {
			if v := &victims[i]; reclaimed(e, v) {
				if r == byModelGuarantee {
					mt, _, _ := rc.modelOwed(e)
					v.Reason = rc.modelReason(e, mt, v.Allocation.Team) // reclaimmodels.go
				} else {
					v.Reason = rc.reason(r, e.Team, v.Allocation.Team)
				}
			}
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

// reason says why a session of team victim is preempted for a session of
// team owed under rule r, naming the two teams where their paths part.
// By guarantee: "team vision reclaims its guarantee (it holds 4 of its 16
// guaranteed GPUs); your team nlp holds 20 GPUs, 12 over its guarantee of
// 8". By fair share: "team vision reclaims its fair share (it holds 64
// GPUs of a fair share of 80, guarantee 64); your team nlp holds 64 GPUs,
// 16 over its fair share of 48 (guarantee 32)".
func (rc *reclaim) reason(r reclaimRule, owed, victim string) string {
	op, vp := rc.tp.path(owed), rc.tp.path(victim)
	i, _ := parted(op, vp)
	mine, over := op[min(i, len(op)-1)], vp[min(i, len(vp)-1)]
	whose := "your team " + over
	switch {
	case over == noTeam:
		whose = "sessions of no team"
	case over != victim:
		whose = fmt.Sprintf("team %s (above your team %s)", over, victim)
	}
	held, vh := rc.tp.gpus(mine), rc.tp.gpus(over)
	if r == byGuarantee {
		return fmt.Sprintf("team %s reclaims its guarantee (it holds %s of its %s guaranteed GPUs); %s holds %s GPUs, %s over its guarantee of %s",
			mine, gpusText(held), gpusText(rc.tp.guarantee(mine)), whose, gpusText(vh), gpusText(vh-rc.tp.guarantee(over)), gpusText(rc.tp.guarantee(over)))
	}
	return fmt.Sprintf("team %s reclaims its fair share (it holds %s GPUs of a fair share of %s, guarantee %s); %s holds %s GPUs, %s over its fair share of %s (guarantee %s)",
		mine, gpusText(held), gpusText(rc.fair[mine]), gpusText(rc.tp.guarantee(mine)),
		whose, gpusText(vh), gpusText(vh-rc.fair[over]), gpusText(rc.fair[over]), gpusText(rc.tp.guarantee(over)))
}

// TeamFairShares is each team's fair share of s's GPUs (with its
// sub-teams'; "" for the sessions of no team) in GPUs, as reclaim
// computes it: over what the ledgers hold and the queue asks for. Nil when
// s has no teams.
func TeamFairShares(s *Snapshot) map[string]float64 {
	views, names := workingViews(s, &Plan{})
	waiting := make([]*Pending, len(s.Pending))
	for i := range s.Pending {
		waiting[i] = &s.Pending[i]
	}
	rc := newReclaim(s, waiting, views, names)
	if rc == nil {
		return nil
	}
	out := make(map[string]float64, len(rc.fair))
	for t, m := range rc.fair {
		out[t] = float64(m) / 1000
	}
	return out
}
