package placer

import "github.com/voyager-gpu/voyager/state"

// Team notes (issue 36). Every request that waits for capacity in a pass
// with teams gets its team's standing in its reason (teamNote): what its
// team is owed by guarantee or fair share and which teams borrow it.
// Writing that for each of 20,000 waiting requests was a fifth of a pass
// (BenchmarkNewPlanTeamModels/count), and once the cluster is full it is
// the same text for every request of a team and size. The text depends
// only on the request's team and GPUs, on what each team holds (full,
// which fullGen counts the changes of), and on the guarantees and fair
// shares, which a pass does not change: so it is written once per
// (team, GPUs) while nothing is placed.

// teamNoteKey is what the tail of a team note depends on.
type teamNoteKey struct {
	team string
	gpus int64
	gen  int
}

// teamTail is teamTailText(e), memoized while no team's holdings change.
func (p *planner) teamTail(e *state.QueueEntry) string {
	if modelScanReference {
		return p.teamTailText(e)
	}
	tp := p.teams
	k := teamNoteKey{e.Team, requestGPUs(e, p.usage.shareRef), tp.fullGen}
	if s, ok := tp.notes[k]; ok {
		return s
	}
	if tp.notes == nil || len(tp.notes) > 4096 {
		tp.notes = map[teamNoteKey]string{}
	}
	s := p.teamTailText(e)
	tp.notes[k] = s
	return s
}
