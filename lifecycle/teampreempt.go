package lifecycle

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/voyager-gpu/voyager/state"
)

// Preemptions by team (issue 36): reclaim is visible as a counter per
// team of the sessions stopped for preemption, by the preempting
// session's team and by why — reclaim (a team below its guarantee or its
// fair share took back GPUs the victim's team held beyond its own: the warning names that team,
// state.Warning.Reclaim) or priority.

// Reasons of voyager_lifecycle_team_preemptions_total.
const (
	preemptReclaim  = "reclaim"
	preemptPriority = "priority"
)

// teamPreemptions counts sessions stopped for preemption by team.
type teamPreemptions struct {
	vec *prometheus.CounterVec
}

func newTeamPreemptions() teamPreemptions {
	return teamPreemptions{vec: prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "voyager", Subsystem: "lifecycle", Name: "team_preemptions_total",
		Help: "Sessions stopped for preemption, by the victim's team (\"-\": none), the team that reclaims (by_team; \"-\" for a preemption by priority) and reason: reclaim (a team below its guarantee or fair share takes back GPUs the victim's team holds beyond its own) or priority.",
	}, []string{"team", "by_team", "reason"})}
}

// count records the stop of a session of team for warning w.
func (t teamPreemptions) count(team string, w state.Warning) {
	reason, by := preemptPriority, "-"
	if w.Reclaim != "" {
		reason, by = preemptReclaim, w.Reclaim
	}
	if team == "" {
		team = "-"
	}
	t.vec.WithLabelValues(team, by, reason).Inc()
}

// preemptedMessage is the eviction's message for a session stopped for
// warning w.
func preemptedMessage(w state.Warning) string {
	if w.Why != "" {
		return "preempted by " + w.By + ": " + w.Why
	}
	if w.Reclaim != "" {
		return "preempted by " + w.By + ": team " + w.Reclaim + " reclaims GPUs"
	}
	return "preempted by " + w.By + ", which has a higher priority"
}
