package placer

import (
	"fmt"
	"slices"

	"github.com/voyager-gpu/voyager/state"
)

// Reclaim by model (teammodels.go): a request of a model key its team is
// owed by model reclaims GPUs of that key alone, no more than the team
// lacks of it, and never takes a victim's team (up to where the two
// teams' paths part) below its own guarantee of the key it loses; a team
// that guarantees models reclaims for a request of another model only the
// part of its guarantee not named by model.

// newReclaimModels is the model counts of rc's tree over views, nil when
// no team guarantees a model.
func newReclaimModels(tp *teamPlan, views map[string]*NodeView, names []string) *modelPlan {
	vs := make([]*NodeView, 0, len(names))
	for _, n := range names {
		vs = append(vs, views[n])
	}
	mp := newModelPlan(tp, vs)
	if mp == nil {
		return nil
	}
	for _, v := range vs {
		for _, a := range v.Ledger.Allocations {
			mp.add(&a, 1)
		}
	}
	return mp
}

// owed is the deepest team on e's path owed GPUs for e's request, and
// what it lacks: by model where the tree guarantees models
// (modelPlan.owed), else by count (teamPlan.owed).
func (rc *reclaim) owed(e *state.QueueEntry) (string, int64) {
	if rc.models == nil {
		return rc.tp.owed(e.Team)
	}
	k := rc.models.requestKey(e)
	path := rc.tp.path(e.Team)
	for i := len(path) - 1; i >= 0; i-- {
		t := path[i]
		if t == noTeam {
			continue
		}
		if lack, ok := rc.models.owed(t, k); ok {
			if lack > 0 {
				return t, lack
			}
			continue
		}
		if h, g := rc.tp.gpus(t), rc.tp.guarantee(t); h < g {
			return t, g - h
		}
	}
	return "", 0
}

// byModel reports whether e's team t is owed by model: e's request is
// of a key t guarantees and holds less of; and that key.
func (rc *reclaim) byModel(e *state.QueueEntry, t string) (string, bool) {
	if rc.models == nil || t == "" {
		return "", false
	}
	k := rc.models.requestKey(e)
	if k == "" {
		return "", false
	}
	g := rc.models.guaranteed(t, k)
	return k, g > 0 && rc.models.held[t][k] < g
}

// allocKey is the model key a's GPUs count for ("" for none).
func (rc *reclaim) allocKey(a *state.Allocation) string {
	if rc.models == nil || len(a.GPUs) == 0 {
		return ""
	}
	return rc.models.byUUID[a.GPUs[0]]
}

// modelSurplus reports whether allocation a (of gpus milli-GPUs) may be
// reclaimed for e, whose owed team is owed, as far as models go: of e's
// key when owed is owed by model, and leaving every team on a's path
// apart from owed's at its guarantee of a's key.
func (rc *reclaim) modelSurplus(e *state.QueueEntry, owed string, victimTeam, key string, gpus int64) bool {
	if rc.models == nil {
		return true
	}
	if k, ok := rc.byModel(e, owed); ok && key != k {
		return false
	}
	if key == "" {
		return true
	}
	op := rc.tp.path(owed)
	for _, x := range rc.tp.path(victimTeam) {
		if x == noTeam || slices.Contains(op, x) {
			continue
		}
		if g := rc.models.guaranteed(x, key); g > 0 && rc.models.held[x][key]-gpus < g {
			return false
		}
	}
	return true
}

// modelAllows is modelSurplus for one allocation.
func (rc *reclaim) modelAllows(e *state.QueueEntry, owed string, a *state.Allocation) bool {
	return rc.modelSurplus(e, owed, a.Team, rc.allocKey(a), a.MilliGPUs())
}

// modelWithin checks the victims the reclaim alone allows, together, by
// model (reclaim.within checks them by count).
func (rc *reclaim) modelWithin(e *state.QueueEntry, owed string, victims []Victim) bool {
	if rc.models == nil {
		return true
	}
	type tk struct{ team, key string }
	sum := map[tk]int64{}
	for i := range victims {
		if reclaimed(e, &victims[i]) {
			a := &victims[i].Allocation
			sum[tk{a.Team, rc.allocKey(a)}] += a.MilliGPUs()
		}
	}
	for x, g := range sum {
		if !rc.modelSurplus(e, owed, x.team, x.key, g) {
			return false
		}
	}
	return true
}

// modelsTook counts a decision by model: the victims' GPUs no longer for
// their teams, e's for its own (of e's key, else of the victims' node).
func (rc *reclaim) modelsTook(e *state.QueueEntry, victims []Victim) {
	if rc.models == nil {
		return
	}
	k := rc.models.requestKey(e)
	for i := range victims {
		a := &victims[i].Allocation
		if k == "" {
			k = rc.allocKey(a)
		}
		rc.models.add(a, -1)
	}
	if k == "" || e.Request.Fraction() {
		return
	}
	for _, t := range rc.tp.path(e.Team) {
		h := rc.models.held[t]
		if h == nil {
			h = map[string]int64{}
			rc.models.held[t] = h
		}
		h[k] += 1000 * int64(e.Request.GPUs)
	}
}

// modelOwed is the team on e's path owed GPUs of the model e asks for
// (owed, by model), what it lacks of them, and whether e's request fits
// in that: the rule byModelGuarantee. ok false where no team guarantees a
// model, or e's team is owed by count only (the other rules).
func (rc *reclaim) modelOwed(e *state.QueueEntry) (string, int64, bool) {
	if rc == nil || rc.models == nil {
		return "", 0, false
	}
	t, lack := rc.owed(e)
	if t == "" {
		return "", 0, false
	}
	if _, ok := rc.byModel(e, t); !ok {
		return "", 0, false
	}
	return t, lack, requestGPUs(e, 0) <= lack
}

// modelReason is the victim's reason when e's team owed reclaims its
// guarantee of a model (byModelGuarantee): "team vision reclaims its
// guarantee of H100 GPUs (it holds 0 of its 8 guaranteed H100 GPUs);
// your team nlp holds 8 H100 GPUs, none of them guaranteed".
func (rc *reclaim) modelReason(e *state.QueueEntry, owed, victim string) string {
	k, _ := rc.byModel(e, owed)
	op := rc.tp.path(owed)
	over := victim
	for _, x := range rc.tp.path(victim) {
		if !slices.Contains(op, x) {
			over = x
			break
		}
	}
	whose := "your team " + over
	switch {
	case over == noTeam:
		whose = "sessions of no team"
	case over != victim:
		whose = fmt.Sprintf("team %s (above your team %s)", over, victim)
	}
	held, g := rc.models.held[over][k], rc.models.guaranteed(over, k)
	theirs := "none of them guaranteed"
	if g > 0 {
		theirs = fmt.Sprintf("%s over its guarantee of %s", scaled(held-g, 1000), scaled(g, 1000))
	}
	return fmt.Sprintf("team %s reclaims its guarantee of %s GPUs (it holds %s of its %s guaranteed %s GPUs); %s holds %s %s GPUs, %s",
		owed, k, scaled(rc.models.held[owed][k], 1000), scaled(rc.models.guaranteed(owed, k), 1000), k, whose, scaled(held, 1000), k, theirs)
}
