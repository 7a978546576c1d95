package placer

import (
	"fmt"
	"path"
	"slices"
	"strings"

	"github.com/voyager-gpu/voyager/state"
)

// Per-model guarantees (issue 36). A team's guarantee may name part of
// its GPUs by model (state.TeamGuarantee.Models: {"gpus": 12, "models":
// {"H100": 8}} is 8 H100s and 4 GPUs of any model). The count alone
// would let the team's 12 A100s stand for its guarantee while its H100
// request waits behind teams that borrow the H100s, and let its A100
// request reclaim for a guarantee that is not of A100s. So, wherever a
// team of the tree guarantees models:
//
//   - A request is of a model key when every GPU model in the snapshot
//     its gpuModel pattern matches (any model, for none) counts for that
//     key (state.GuaranteeModelOf): "*H100*" on a cluster of A100s and
//     H100s is an H100 request; no pattern on a cluster of H100s alone is
//     one too.
//   - Each team's GPUs are counted by key, with its sub-teams', as the
//     order counts GPUs (ledgers, a pinned session at its turn, each
//     decision).
//   - For a request of key k, a team on its path holding fewer GPUs of k
//     than it guarantees of k is below its guarantee in the order (its
//     key is held over guaranteed of k, in 0..1), whatever it holds in
//     all: the H100 request goes first for H100 nodes. A team that
//     guarantees models and is below its count is below it for a request
//     only by the part of its guarantee not named by model (held GPUs not
//     counted for a model key it guarantees, over that part); for other
//     requests it stands as a team at its guarantee.
//   - Holds take requests in the same order (hold.go's holdQueue).
//   - Reclaim (reclaim.go, reclaimmodels.go) frees, for a request of key
//     k owed by model, only GPUs of k, no more than the team lacks of k,
//     and never takes a victim's team below its own guarantee of the
//     model it loses.
//
// Without model guarantees in the tree nothing here runs (modelPlan is
// nil) and teams compare by count alone.

// modelPlan counts each team's GPUs by guaranteed model key during a
// pass.
type modelPlan struct {
	tp *teamPlan
	// keys are the tree's guaranteed model keys, sorted.
	keys []string
	// byUUID is the key each device (GPU or MIG device) of the
	// snapshot's nodes counts for; devices of no key are absent.
	byUUID map[string]string
	// models are the GPU models of the snapshot's nodes.
	models []string
	// held is each team's (with its sub-teams') milli-GPUs by key.
	held map[string]map[string]int64
	// reqKeys caches requestKey by pattern.
	reqKeys map[string]string
}

// newModelPlan is the model counts of tp's tree over views, nil when no
// team guarantees a model.
func newModelPlan(tp *teamPlan, views []*NodeView) *modelPlan {
	keys := tp.tree.GuaranteeModelKeys()
	if len(keys) == 0 {
		return nil
	}
	mp := &modelPlan{tp: tp, keys: keys, byUUID: map[string]string{}, held: map[string]map[string]int64{}, reqKeys: map[string]string{}}
	seen := map[string]bool{}
	for _, v := range views {
		for _, g := range v.Node.GPUs {
			if !seen[g.Model] {
				seen[g.Model] = true
				mp.models = append(mp.models, g.Model)
			}
			k := state.GuaranteeModelOf(keys, g.Model)
			if k == "" {
				continue
			}
			mp.byUUID[g.UUID] = k
			for _, m := range g.MIGDevices {
				mp.byUUID[m.UUID] = k
			}
		}
	}
	slices.Sort(mp.models)
	return mp
}

// add counts allocation a's GPUs by key for its team (sign -1: takes
// them away); nil-safe.
func (mp *modelPlan) add(a *state.Allocation, sign int64) {
	if mp == nil || len(a.GPUs) == 0 {
		return
	}
	each := a.MilliGPUs() / int64(len(a.GPUs))
	for _, u := range a.GPUs {
		k := mp.byUUID[u]
		if k == "" {
			continue
		}
		for _, t := range mp.tp.path(a.Team) {
			h := mp.held[t]
			if h == nil {
				h = map[string]int64{}
				mp.held[t] = h
			}
			h[k] += sign * each
		}
	}
}

// addParts counts a decision's parts for e's team.
func (mp *modelPlan) addParts(e *state.QueueEntry, parts []PartPlan) {
	if mp == nil {
		return
	}
	for _, pp := range parts {
		a := allocation(e, pp)
		mp.add(&a, 1)
	}
}

// requestKey is the model key e's GPUs are all of, "" when they may be
// of models of different keys, or of none, or e asks for no GPUs.
func (mp *modelPlan) requestKey(e *state.QueueEntry) string {
	if mp == nil || e.Request.GPUs == 0 {
		return ""
	}
	pat := e.Request.GPUModel
	if e.Workers > 0 && e.WorkerRequest != nil && e.WorkerRequest.GPUModel != pat {
		return ""
	}
	return mp.patternKey(pat)
}

// pinnedKey is requestKey of a session planned again from what it holds
// (epoch.go), whose queue entry lacks its request: from its allocations'
// GPUs and model patterns (state.Allocation.GPUModel), the same as its
// request's.
func (mp *modelPlan) pinnedKey(parts []pinnedPart) string {
	pat, head := "", false
	for i, pp := range parts {
		a := pp.alloc
		if a.Role != state.RoleWorker {
			if len(a.GPUs) == 0 {
				return ""
			}
			head = true
		}
		if i == 0 {
			pat = a.GPUModel
		} else if a.GPUModel != pat && len(a.GPUs) > 0 {
			return ""
		}
	}
	if !head {
		return ""
	}
	return mp.patternKey(pat)
}

// partModel is the model pattern of e's part of role.
func partModel(e *state.QueueEntry, role state.Role) string {
	if role == state.RoleWorker && e.WorkerRequest != nil {
		return e.WorkerRequest.GPUModel
	}
	return e.Request.GPUModel
}

// patternKey is the model key every model of the snapshot pat matches
// (any model, for none) counts for; "" when they count for different keys
// or none matches.
func (mp *modelPlan) patternKey(pat string) string {
	if k, ok := mp.reqKeys[pat]; ok {
		return k
	}
	k, first := "", true
	for _, m := range mp.models {
		if pat != "" {
			if ok, err := path.Match(pat, m); err != nil || !ok {
				continue
			}
		}
		mk := state.GuaranteeModelOf(mp.keys, m)
		if first {
			k, first = mk, false
		} else if mk != k {
			k = ""
			break
		}
	}
	mp.reqKeys[pat] = k
	return k
}

// guaranteed is team t's guarantee of key k, in milli-GPUs.
func (mp *modelPlan) guaranteed(t, k string) int64 {
	return 1000 * int64(mp.tp.tree.Teams[t].Guarantee.Models[k])
}

// named is the milli-GPUs of t's guarantee named by model, and what t
// holds that counts for them (at most each model's guarantee).
func (mp *modelPlan) named(t string) (g, held int64) {
	for k, n := range mp.tp.tree.Teams[t].Guarantee.Models {
		if n <= 0 {
			continue
		}
		g += 1000 * int64(n)
		held += min(mp.held[t][k], 1000*int64(n))
	}
	return g, held
}

// owed is, for a request of key k in team t, whether t is below its
// guarantee for it and what it lacks (milli-GPUs): by model when t
// guarantees k and holds less of it; else, when t guarantees models, by
// the part of its guarantee not named by model, held GPUs not counted
// for its models against it. ok is false when t guarantees no model: its
// count decides (teamPlan.owed).
func (mp *modelPlan) owed(t, k string) (lack int64, ok bool) {
	if t == noTeam {
		return 0, false
	}
	if g := mp.guaranteed(t, k); k != "" && g > 0 {
		if h := mp.held[t][k]; h < g {
			return g - h, true
		}
	}
	gn, hn := mp.named(t)
	if gn == 0 {
		return 0, false
	}
	all, held := mp.tp.guarantee(t), mp.tp.gpus(t)
	if held >= all {
		return 0, true
	}
	if rest, other := all-gn, held-hn; other < rest {
		return min(rest-other, all-held), true
	}
	return 0, true
}

// key orders team t for a request of key k: below its guarantee for it
// (owed), held over guaranteed of what it lacks (0 to 1); a team that
// guarantees models, below its count but owed nothing for this request,
// as a team over its guarantee by the GPUs it holds beyond the part not
// named by model (1 plus that share of the cluster's GPUs and its decayed
// usage share, over its weight); else teamPlan.key.
func (mp *modelPlan) key(t, k string) float64 {
	if t == noTeam {
		return mp.tp.key(t)
	}
	if g := mp.guaranteed(t, k); k != "" && g > 0 {
		if h := mp.held[t][k]; h < g {
			return float64(h) / float64(g)
		}
	}
	gn, hn := mp.named(t)
	base := mp.tp.key(t)
	if gn == 0 || base >= 1 {
		return base
	}
	var held int64
	if h := mp.tp.held[t]; h != nil {
		held = h.gpus
	}
	rest, other := mp.tp.guarantee(t)-gn, held-hn
	if rest > 0 && other < rest {
		return float64(other) / float64(rest)
	}
	over := 0.0
	if mp.tp.total.gpus > 0 {
		over = float64(other-rest) / float64(mp.tp.total.gpus)
	}
	return 1 + (max(over, 0)+mp.tp.decayed[t])/mp.tp.tree.Teams[t].EffectiveWeight()
}

// keyOfModel is keyOf for a request of model key k (modelPlan.key at
// each level); keyOf when the tree guarantees no model.
func (tp *teamPlan) keyOfModel(team, k string, into teamKey) teamKey {
	if tp.models == nil {
		return tp.keyOf(team, into)
	}
	into.path = tp.path(team)
	into.keys = into.keys[:0]
	for _, t := range into.path {
		into.keys = append(into.keys, tp.models.key(t, k))
	}
	return into
}

// modelKeyOf is the model key of e's request for the order: "" without
// teams or model guarantees.
func (p *planner) modelKeyOf(e *state.QueueEntry) string {
	if p.teams == nil || p.teams.models == nil {
		return ""
	}
	if parts := p.pinned[e.Session]; parts != nil {
		return p.teams.models.pinnedKey(parts)
	}
	return p.teams.models.requestKey(e)
}

// newTeamModels is the model counts of tp's tree over nodes as the order
// counts them: the ledgers' allocations, a pinned session's at its turn
// (teamPlan.placedPinned); nil when no team guarantees a model.
func newTeamModels(tp *teamPlan, nodes []*nodeState, pinned map[string][]pinnedPart) *modelPlan {
	if len(tp.tree.Teams) == 0 {
		return nil
	}
	views := make([]*NodeView, len(nodes))
	for i, n := range nodes {
		views[i] = n.view
	}
	mp := newModelPlan(tp, views)
	if mp == nil {
		return nil
	}
	for _, n := range nodes {
		for id, a := range n.view.Ledger.Allocations {
			if pinned[id] == nil {
				mp.add(&a, 1)
			}
		}
	}
	return mp
}

// modelNote is teamNote for a request of a model its team is owed by
// model: "; team vision holds 0 of its 8 guaranteed H100 GPUs; waiting
// for 4 H100 GPUs borrowed by team nlp (8 H100 held, 8 beyond its own
// guarantee of them) to be reclaimed (…)". ok is false where it does not
// apply (teamNote then says what it says by count).
func (p *planner) modelNote(e *state.QueueEntry, msg string) (string, bool) {
	tp := p.teams
	if tp == nil || tp.models == nil {
		return "", false
	}
	mp := tp.models
	k := mp.requestKey(e)
	if k == "" {
		return "", false
	}
	path := tp.path(e.Team)
	owed := ""
	for i := len(path) - 1; i >= 0 && owed == ""; i-- {
		if t := path[i]; t != noTeam && mp.guaranteed(t, k) > mp.held[t][k] {
			owed = t
		}
	}
	if owed == "" {
		return "", false
	}
	held, g := mp.held[owed][k], mp.guaranteed(owed, k)
	need := min(requestGPUs(e, p.usage.shareRef), g-held)
	out := fmt.Sprintf("%s; team %s holds %s of its %s guaranteed %s GPUs", msg, owed, scaled(held, 1000), scaled(g, 1000), k)
	// Borrowers of k: at each level of owed's path, the siblings there
	// holding more of k than they are guaranteed of it.
	var names []string
	op := tp.path(owed)
	for i, t := range op {
		for _, s := range tp.siblingsAt(op, i) {
			if s == t {
				continue
			}
			h := mp.held[s][k]
			sg := int64(0)
			if s != noTeam {
				sg = mp.guaranteed(s, k)
			}
			if h <= sg {
				continue
			}
			label := "team " + s
			if s == noTeam {
				label = "sessions of no team"
			}
			names = append(names, fmt.Sprintf("%s (%s %s held, %s beyond its own guarantee of them)", label, scaled(h, 1000), k, scaled(h-sg, 1000)))
		}
	}
	if len(names) == 0 {
		return out + fmt.Sprintf(", and no other team holds more %s GPUs than it is guaranteed: the rest is in use within guarantees", k), true
	}
	if len(names) > 2 {
		names = append(names[:2], fmt.Sprintf("%d more", len(names)-2))
	}
	return out + fmt.Sprintf("; waiting for %s %s GPUs borrowed by %s to be reclaimed (preemptible sessions are stopped after their grace, the rest come back as they end)",
		scaled(need, 1000), k, strings.Join(names, ", ")), true
}
