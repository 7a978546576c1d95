package placer

import "github.com/voyager-gpu/voyager/state"

// elasticOrder compares, for PlanElastic, the owner of a waiting session
// with the owner of a running elastic job at the same priority, as the
// queue orders owners (order.go): down the team tree first (teams.go),
// then by what each owner holds over its weight. Without teams it is the
// per-owner comparison alone.
//
// At the first level where the two teams' paths part, the team with the
// smaller key (below its guarantee, or less beyond it for its weight)
// comes first; equal keys there (or one team) leave it to the owners. A
// tie is no preference: a waiter is owed a job's GPUs only when it comes
// strictly first, and a job grows past a blocking waiter only when the
// waiter comes strictly after it, so a shrink is never undone by the next
// pass's grow.
type elasticOrder struct {
	// tp is the team tree with what each team holds (nil: no teams).
	tp     *teamPlan
	held   map[string]int64 // milli-GPUs by owner
	weight func(string) float64
}

// newElasticOrder counts what views (the ledgers with the plan's binds)
// hold by owner and, with teams in s, by team.
func newElasticOrder(s *Snapshot, views map[string]*NodeView, names []string, weight func(string) float64) *elasticOrder {
	o := &elasticOrder{held: map[string]int64{}, weight: weight}
	if len(s.Teams.Teams) > 0 {
		var total amounts
		for _, n := range names {
			v := views[n]
			total.gpus += 1000 * int64(newNodeState(v).totalGPU)
			total.cpu += v.Node.CPUMilli
			total.mem += v.Node.MemoryMiB
		}
		o.tp = newTeamPlan(&Snapshot{Teams: s.Teams, TeamUsage: s.TeamUsage}, nil, total, nil)
	}
	for _, n := range names {
		for _, a := range views[n].Ledger.Allocations {
			o.add(a.Team, a.Owner, amounts{a.MilliGPUs(), a.CPUMilli, a.MemoryMiB})
		}
	}
	return o
}

// add counts a for owner in team.
func (o *elasticOrder) add(team, owner string, a amounts) {
	o.held[owner] += a.gpus
	if o.tp != nil {
		o.tp.add(team, a)
	}
}

// addGPUs counts g more milli-GPUs for owner in team (a shrink's waiter
// or a grow).
func (o *elasticOrder) addGPUs(team, owner string, g int64) {
	o.add(team, owner, amounts{gpus: g})
}

// compare is -1 when e's owner comes strictly before a's, 1 strictly
// after, 0 for no preference (the same owner, or equal standing).
func (o *elasticOrder) compare(e *state.QueueEntry, a *state.Allocation) int {
	if e.Owner == a.Owner {
		return 0 // an owner's own work is ordered by priority alone
	}
	if o.tp != nil {
		ep, ap := o.tp.path(e.Team), o.tp.path(a.Team)
		for i := 0; i < len(ep) && i < len(ap); i++ {
			if ep[i] == ap[i] {
				continue
			}
			ek, ak := o.tp.key(ep[i]), o.tp.key(ap[i])
			if ek < ak {
				return -1
			}
			if ek > ak {
				return 1
			}
			break
		}
	}
	eh, ah := float64(o.held[e.Owner])/o.weight(e.Owner), float64(o.held[a.Owner])/o.weight(a.Owner)
	switch {
	case eh < ah:
		return -1
	case eh > ah:
		return 1
	}
	return 0
}
