package placer

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// noTeam stands for the sessions charged to no team (or to a team since
// deleted) in the team tree of a pass: a root of guarantee 0 and weight 1.
const noTeam = ""

// teamPlan is the team tree (state.Team, teams/<name>) during one pass:
// what each team holds together with the teams below it (the ledgers,
// then this pass's plan), and the key that orders it among its siblings.
//
// Fair share runs down the tree (issue 36). At each level, the team below
// its guarantee goes first, the one furthest below it (held over
// guarantee) before others; teams at or above their guarantee then go by
// what they hold beyond it, as a dominant share of the cluster (DRF over
// GPUs, CPU and memory), plus their decayed past usage when a half-life
// is set, over their weight. Within a team its users are ordered as
// without teams (weightedShare). A team may hold more than its guarantee
// while nobody owed it waits (borrowing): nothing but the order and its
// maximum limits it. PlanPreemption takes borrowed GPUs back for a team
// below its guarantee or its fair share (reclaim.go; split computes the
// fair shares).
type teamPlan struct {
	tree state.TeamTree
	// paths are each team's names from its root down to it.
	paths map[string][]string
	// held is what each team holds with its sub-teams, in the planner's
	// amounts (milli-GPUs), as the order counts it: the ledgers, a pinned
	// session's allocations from its turn (as owners' shares count them,
	// so that an epoch planned again orders alike), then each decision.
	held map[string]*amounts
	// full is the milli-GPUs each team holds with its sub-teams as
	// maxima, reasons and reclaim count them: a pinned session's from the
	// start, as quotas count it.
	full map[string]int64
	// fullGen counts changes to full; notes is teamNote's memo
	// (teamnotes.go).
	fullGen int
	notes   map[teamNoteKey]string
	total   amounts
	// decayed is each team's (with its sub-teams') decayed GPU-hours as
	// a share of every team's (Snapshot.TeamUsage); nil: no decay.
	decayed map[string]float64
	// keys caches key; add clears the keys of the teams it changes.
	keys map[string]float64
	// maxima is whether any team has a maximum.
	maxima bool
	// charged is the idle GPUs held for each team's requests beyond
	// their owners' hold budgets (hold.go), with its sub-teams': they
	// count in its key, as in its owners' shares, until the request is
	// placed, so that the drain is paid by the team's own requests.
	charged map[string]int64
	// ownerHeld is what each owner holds in each team, by the ledgers:
	// the hold budgets' demand (entitle).
	ownerHeld map[ownerInTeam]int64
	// models counts GPUs by guaranteed model (teammodels.go); nil when
	// no team guarantees a model.
	models *modelPlan
	// fair, when not nil, records each team's share that entitle
	// computes (standing.go).
	fair map[string]int64
}

// ownerInTeam is an owner's sessions in one team (noTeam for none, or
// for a team that no longer exists).
type ownerInTeam struct{ team, owner string }

// leaf is owner in team, the team as the tree knows it.
func (tp *teamPlan) leaf(team, owner string) ownerInTeam {
	p := tp.path(team)
	return ownerInTeam{p[len(p)-1], owner}
}

// newTeamPlan is the team tree of s over nodes, whose capacity is total,
// with pinned the sessions the pass places again (PinEpoch); nil when s
// has no teams.
func newTeamPlan(s *Snapshot, nodes []*nodeState, total amounts, pinned map[string][]pinnedPart) *teamPlan {
	if len(s.Teams.Teams) == 0 {
		return nil
	}
	tp := &teamPlan{tree: s.Teams, paths: map[string][]string{}, held: map[string]*amounts{}, full: map[string]int64{}, total: total, keys: map[string]float64{}}
	for _, t := range s.Teams.Teams {
		tp.maxima = tp.maxima || t.MaxGPUs != nil
	}
	tp.ownerHeld = map[ownerInTeam]int64{}
	for _, n := range nodes {
		for id, a := range n.view.Ledger.Allocations {
			if pinned[id] != nil {
				tp.addFull(a.Team, a.MilliGPUs()) // the order counts it at its turn
			} else {
				tp.add(a.Team, amounts{a.MilliGPUs(), a.CPUMilli, a.MemoryMiB})
			}
			tp.ownerHeld[tp.leaf(a.Team, a.Owner)] += a.MilliGPUs()
		}
	}
	tp.models = newTeamModels(tp, nodes, pinned) // teammodels.go
	if len(s.TeamUsage) > 0 {
		sum := 0.0
		sub := map[string]float64{}
		// In a fixed order: a sum of floats depends on it, and placers
		// must agree to the last bit.
		for _, team := range sortedNames(s.TeamUsage) {
			h := s.TeamUsage[team]
			if h <= 0 {
				continue
			}
			sum += h
			for _, t := range tp.path(team) {
				sub[t] += h
			}
		}
		if sum > 0 {
			tp.decayed = make(map[string]float64, len(sub))
			for t, h := range sub {
				tp.decayed[t] = h / sum
			}
		}
	}
	return tp
}

// path is team's path from its root; [noTeam] for no team or one that no
// longer exists.
func (tp *teamPlan) path(team string) []string {
	if p, ok := tp.paths[team]; ok {
		return p
	}
	p := tp.tree.Path(team)
	if len(p) == 0 {
		p = []string{noTeam}
	}
	tp.paths[team] = p
	return p
}

// add counts a in team and each team above it.
func (tp *teamPlan) add(team string, a amounts) {
	tp.addFull(team, a.gpus)
	tp.addOrder(team, a)
}

// addFull counts g milli-GPUs in team and above as maxima see them.
func (tp *teamPlan) addFull(team string, g int64) {
	for _, t := range tp.path(team) {
		tp.full[t] += g
	}
	tp.fullGen++ // teamnotes.go
}

// placedPinned counts a pinned session's allocation in the order at its
// turn (its GPUs count for maxima from the start); nil-safe.
func (tp *teamPlan) placedPinned(a *state.Allocation) {
	if tp != nil {
		tp.addOrder(a.Team, amounts{a.MilliGPUs(), a.CPUMilli, a.MemoryMiB})
		tp.models.add(a, 1)
	}
}

// addOrder counts a in team and above as the order sees it.
func (tp *teamPlan) addOrder(team string, a amounts) {
	for _, t := range tp.path(team) {
		h, ok := tp.held[t]
		if !ok {
			h = &amounts{}
			tp.held[t] = h
		}
		h.plus(a)
		delete(tp.keys, t)
	}
}

// charge counts g milli-GPUs held idle for a request of team in its key
// (and its ancestors'); nil-safe.
func (tp *teamPlan) charge(team string, g int64) {
	if tp == nil {
		return
	}
	if tp.charged == nil {
		tp.charged = map[string]int64{}
	}
	for _, t := range tp.path(team) {
		tp.charged[t] += g
		delete(tp.keys, t)
	}
}

// addRequest counts a decision of e, whose parts are reqs.
func (tp *teamPlan) addRequest(e *state.QueueEntry, reqs []state.Resources, shareRef int64) {
	var sum amounts
	for i := range reqs {
		sum.addReq(&reqs[i], shareRef)
	}
	tp.add(e.Team, sum)
}

// gpus is what team t holds, in milli-GPUs.
func (tp *teamPlan) gpus(t string) int64 { return tp.full[t] }

// sortedNames are m's keys in order.
func sortedNames(m map[string]float64) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// guarantee is team t's guarantee in milli-GPUs.
func (tp *teamPlan) guarantee(t string) int64 {
	return 1000 * int64(tp.tree.Teams[t].Guarantee.GPUs)
}

// key orders team t among its siblings, the smallest first: below its
// guarantee, what it holds over its guarantee (0 to 1); at or above it,
// 1 plus its dominant share beyond the guarantee (and its decayed usage
// share) over its weight.
func (tp *teamPlan) key(t string) float64 {
	if k, ok := tp.keys[t]; ok {
		return k
	}
	g, h := tp.guarantee(t), tp.held[t]
	var k float64
	if h == nil {
		h = &amounts{}
	}
	if c := tp.charged[t]; c != 0 {
		hc := *h
		hc.gpus += c
		h = &hc
	}
	if g > 0 && h.gpus < g {
		k = float64(h.gpus) / float64(g)
	} else {
		s := dominantShare(h, tp.total)
		if tp.total.gpus > 0 {
			s -= float64(g) / float64(tp.total.gpus)
		}
		w := 1.0
		if t != noTeam {
			w = tp.tree.Teams[t].EffectiveWeight()
		}
		k = 1 + (max(s, 0)+tp.decayed[t])/w
	}
	tp.keys[t] = k
	return k
}

// teamKey is what orders an owner's requests in a team before its own
// share: the key of each team on the team's path, the root's first, with
// the path's names.
type teamKey struct {
	keys []float64
	path []string
}

// keyOf is the teamKey of team, reusing into's storage.
func (tp *teamPlan) keyOf(team string, into teamKey) teamKey {
	into.path = tp.path(team)
	into.keys = into.keys[:0]
	for _, t := range into.path {
		into.keys = append(into.keys, tp.key(t))
	}
	return into
}

// compareKeys compares two team keys level by level from the root: by
// the key at the first level where the paths part, equal keys by the
// teams' names; where one path is the other's beginning (an owner in a
// team beside its sub-teams), the shorter first. A total order, so that
// the queue's heap pops one sequence however it was built (placers
// agree); -1, 0 or 1.
func compareKeys(a, b teamKey) int {
	for i := 0; i < len(a.keys) && i < len(b.keys); i++ {
		if a.keys[i] != b.keys[i] {
			if a.keys[i] < b.keys[i] {
				return -1
			}
			return 1
		}
		if c := strings.Compare(a.path[i], b.path[i]); c != 0 {
			return c
		}
	}
	return cmpInt(len(a.keys), len(b.keys))
}

func cmpInt(a, b int) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// allows checks e, needing need in all, against the maximum of its team
// and of each team above it.
func (tp *teamPlan) allows(e *state.QueueEntry, need amounts) (string, string, bool) {
	if tp == nil || !tp.maxima || need.gpus <= 0 {
		return "", "", true
	}
	path := tp.path(e.Team)
	for i := len(path) - 1; i >= 0; i-- {
		t := path[i]
		m := tp.tree.Teams[t].MaxGPUs
		if m == nil {
			continue
		}
		held := tp.gpus(t)
		if held+need.gpus <= 1000*int64(*m) {
			continue
		}
		who := "team " + t
		if t != e.Team {
			who = fmt.Sprintf("team %s (above team %s)", t, e.Team)
		}
		if held >= 1000*int64(*m) {
			return "Quota", fmt.Sprintf("%s is at its maximum of %d GPUs (%s held); this needs %s more: it waits until the team's sessions end or an admin raises maxGPUs",
				who, *m, scaled(held, 1000), scaled(need.gpus, 1000)), false
		}
		return "Quota", fmt.Sprintf("%s holds %s of its maximum of %d GPUs; this needs %s more", who, scaled(held, 1000), *m, scaled(need.gpus, 1000)), false
	}
	return "", "", true
}

// allows checks e, needing need in all, against its owner's and groups'
// quotas and its teams' maxima.
func (p *planner) allows(e *state.QueueEntry, need amounts) (string, string, bool) {
	if reason, msg, ok := p.quota.quotaAllows(e, need, p.snap); !ok {
		return reason, msg, ok
	}
	return p.teams.allows(e, need)
}

// borrower is a team holding more than its guarantee.
type borrower struct {
	team           string
	held, borrowed int64 // milli-GPUs
}

// borrowers are the teams that hold GPUs beyond their guarantee and that
// a team below its guarantee on path may reclaim from: at each level of
// path, the siblings of its team there (roots for the root) over their
// guarantee, most borrowed first.
func (tp *teamPlan) borrowers(path []string) []borrower {
	return tp.over(path, tp.guarantee)
}

// siblingsAt are the teams at level i of path, t = path[i] among them: the
// children of path[i-1], or the roots and noTeam at the root.
func (tp *teamPlan) siblingsAt(path []string, i int) []string {
	if i > 0 {
		return tp.tree.Children(path[i-1])
	}
	var sibs []string
	for _, n := range tp.tree.Names() {
		if tp.tree.Teams[n].Parent == "" {
			sibs = append(sibs, n)
		}
	}
	return append(sibs, noTeam)
}

// over are the teams beside path (at each level of path, the siblings of
// its team there; roots and noTeam for the root) that hold more than
// share gives them, most over first.
func (tp *teamPlan) over(path []string, share func(string) int64) []borrower {
	var out []borrower
	for i, t := range path {
		for _, s := range tp.siblingsAt(path, i) {
			if s == t {
				continue
			}
			if h, g := tp.gpus(s), share(s); h > g {
				out = append(out, borrower{team: s, held: h, borrowed: h - g})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].borrowed != out[j].borrowed {
			return out[i].borrowed > out[j].borrowed
		}
		return out[i].team < out[j].team
	})
	return out
}

// owed is the deepest team on e's path below its guarantee, and what it
// lacks of it, in milli-GPUs; "" when none is.
func (tp *teamPlan) owed(team string) (string, int64) {
	path := tp.path(team)
	for i := len(path) - 1; i >= 0; i-- {
		t := path[i]
		if t == noTeam {
			continue
		}
		if h, g := tp.gpus(t), tp.guarantee(t); h < g {
			return t, g - h
		}
	}
	return "", 0
}

// teamNote adds to a Capacity message what e's team is owed and who
// borrows it: "team vision holds 4 of its 16 guaranteed GPUs; waiting for
// 8 GPUs borrowed by team nlp (20 held, 12 over its guarantee) to be
// reclaimed". Unchanged where the team is not below its guarantee.
func (p *planner) teamNote(e *state.QueueEntry, reason, msg string) string {
	tp := p.teams
	if tp == nil || reason != "Capacity" {
		return msg
	}
	if m, ok := p.modelNote(e, msg); ok { // teammodels.go
		return m
	}
	return msg + p.teamTail(e) // teamnotes.go: memoized per pass
}

// teamTailText is what teamNote adds to a Capacity message when e's
// team guarantees no model e asks for: by guarantee, else by fair share
// (fairNote); "" when neither applies.
func (p *planner) teamTailText(e *state.QueueEntry) string {
	tp := p.teams
	msg := ""
	t, lack := tp.owed(e.Team)
	if t == "" {
		return p.fairNote(e, msg)
	}
	need := min(requestGPUs(e, p.usage.shareRef), lack)
	var b strings.Builder
	b.WriteString(msg)
	fmt.Fprintf(&b, "; team %s holds %s of its %d guaranteed GPUs", t, scaled(tp.gpus(t), 1000), tp.tree.Teams[t].Guarantee.GPUs)
	bs := tp.borrowers(tp.path(t))
	if len(bs) == 0 {
		b.WriteString(", and no other team holds more than its own guarantee: the rest is in use within guarantees")
		return b.String()
	}
	names := make([]string, 0, 2)
	for i, x := range bs {
		if i == 2 {
			names = append(names, fmt.Sprintf("%d more", len(bs)-2))
			break
		}
		label := "team " + x.team
		if x.team == noTeam {
			label = "sessions of no team"
		}
		names = append(names, fmt.Sprintf("%s (%s held, %s over its guarantee)", label, scaled(x.held, 1000), scaled(x.borrowed, 1000)))
	}
	fmt.Fprintf(&b, "; waiting for %s GPUs borrowed by %s to be reclaimed (preemptible sessions are stopped after their grace, the rest come back as they end)",
		scaled(need, 1000), strings.Join(names, ", "))
	return b.String()
}

// fairNote adds to a Capacity message what e's team is owed of its fair
// share beyond its guarantee, and who holds it: "team vision holds 64
// GPUs, below its fair share of 80 (guarantee 64); waiting for 8 GPUs
// held beyond their fair share by team nlp (64 held, fair share 48) to be
// reclaimed …"; for a team at or beyond its fair share, that nothing is
// reclaimed for it. Unchanged for a session of no team.
func (p *planner) fairNote(e *state.QueueEntry, msg string) string {
	tp := p.teams
	fair := tp.fairShares(p.usage.total.gpus, p.snap.Pending, p.usage.shareRef, p.ownerWeight)
	req := requestGPUs(e, p.usage.shareRef)
	path := tp.path(e.Team)
	for i := len(path) - 1; i >= 0; i-- {
		t := path[i]
		if t == noTeam || tp.gpus(t)+req > fair[t] {
			continue
		}
		var b strings.Builder
		b.WriteString(msg)
		fmt.Fprintf(&b, "; team %s holds %s GPUs, below its fair share of %s (guarantee %d)", t, gpusText(tp.gpus(t)), gpusText(fair[t]), tp.tree.Teams[t].Guarantee.GPUs)
		bs := tp.over(path[:i+1], func(x string) int64 { return fair[x] })
		if len(bs) == 0 {
			b.WriteString(", and no other team holds more than its own fair share")
			return b.String()
		}
		names := make([]string, 0, 2)
		for j, x := range bs {
			if j == 2 {
				names = append(names, fmt.Sprintf("%d more", len(bs)-2))
				break
			}
			label := "team " + x.team
			if x.team == noTeam {
				label = "sessions of no team"
			}
			names = append(names, fmt.Sprintf("%s (%s held, fair share %s)", label, gpusText(x.held), gpusText(x.held-x.borrowed)))
		}
		fmt.Fprintf(&b, "; waiting for %s GPUs held beyond their fair share by %s to be reclaimed (preemptible sessions are stopped after their grace, the rest come back as they end)",
			gpusText(req), strings.Join(names, ", "))
		return b.String()
	}
	if t := path[len(path)-1]; t != noTeam && tp.gpus(t) >= fair[t] {
		return fmt.Sprintf("%s; team %s holds %s GPUs, at or beyond its fair share of %s (guarantee %d): nothing is reclaimed for it, it waits for room",
			msg, t, gpusText(tp.gpus(t)), gpusText(fair[t]), tp.tree.Teams[t].Guarantee.GPUs)
	}
	return msg
}

// gpusText writes m milli-GPUs as GPUs with at most one decimal.
func gpusText(m int64) string {
	if m%1000 == 0 {
		return fmt.Sprint(m / 1000)
	}
	return strconv.FormatFloat(float64(m)/1000, 'f', 1, 64)
}

// dominantShare is a's largest fraction of total's GPUs, CPU or memory.
func dominantShare(a *amounts, total amounts) float64 {
	s := 0.0
	if total.gpus > 0 {
		s = max(s, float64(a.gpus)/float64(total.gpus))
	}
	if total.cpu > 0 {
		s = max(s, float64(a.cpu)/float64(total.cpu))
	}
	if total.mem > 0 {
		s = max(s, float64(a.mem)/float64(total.mem))
	}
	return s
}

// appendTeamScopes adds to out the maxima of team and the teams above it
// that a placement for team is checked against: the bind guards each
// (state.QuotaTeams), so placers that plan on different snapshots cannot
// together take a team past its maximum.
func appendTeamScopes(out []quotaRef, team string, s *Snapshot) []quotaRef {
	for _, t := range s.Teams.Path(team) {
		if s.Teams.Teams[t].MaxGPUs != nil {
			out = append(out, quotaRef{state.QuotaTeams, t})
		}
	}
	return out
}

// rekey updates the team keys of tr's owner queues after team's holding
// grew: every queue of a team that shares team's root, whose key vector
// can have changed, then the heap once.
func (tp *teamPlan) rekey(tr *tier, team string) {
	root := tp.path(team)[0]
	changed := false
	for _, oq := range tr.owners {
		if tp.path(oq.team)[0] != root {
			continue
		}
		oq.tkey = tp.keyOfModel(oq.team, oq.model, oq.tkey)
		changed = true
	}
	if changed {
		tr.owners.init()
	}
}

// teamTreeOf is the team tree that c holds, its teams' revisions also
// recorded in revs by team key (QuotaOf(QuotaTeams, name)), which the
// bind of a session checked against a team's maximum compares.
func teamTreeOf(k state.Keys, c *watcher.Snapshot[state.Team], revs map[string]int64) state.TeamTree {
	tr := state.TeamTree{Teams: map[string]state.Team{}, Revs: map[string]int64{}, Rev: c.Revision()}
	c.Range(func(it watcher.Item[state.Team]) bool {
		if name, ok := k.TeamName(it.Key); ok {
			t := it.Value
			t.Name = name
			tr.Teams[name] = t
			tr.Revs[name] = it.ModRevision
			revs[it.Key] = it.ModRevision
		}
		return true
	})
	return tr
}

// entitle is each owner's fair share of capacity (milli-GPUs) down the
// team tree, given every owner's demand in each team (what it holds by
// the ledgers plus what its requests in pending ask for): the hold
// budgets with teams (hold.go). At each level, from the root down, each
// team first gets what it asks for up to its guarantee (if the level has
// less than their guarantees, in proportion to them), then the rest is
// water-filled by weight over what the teams still ask for, each capped
// at its maximum; a team's owners split its share by their own weights
// beside its sub-teams.
func (tp *teamPlan) entitle(capacity int64, pending []Pending, shareRef int64, ownerWeight func(string) float64) map[string]int64 {
	owners, teams := tp.split(capacity, tp.demand(pending, shareRef), ownerWeight)
	tp.fair = teams
	return owners
}

// fairShares is each team's fair share of capacity in milli-GPUs (split,
// over what the ledgers hold and pending asks for: the demand entitle
// divides), computed once a pass, for the queue's reasons (teamNote).
func (tp *teamPlan) fairShares(capacity int64, pending []Pending, shareRef int64, ownerWeight func(string) float64) map[string]int64 {
	if tp.fair == nil {
		tp.entitle(capacity, pending, shareRef, ownerWeight)
	}
	return tp.fair
}

// split divides capacity (milli-GPUs) down the team tree given every
// owner's demand in each team, as entitle describes: each owner's share,
// and each team's (with its sub-teams'; noTeam's for the sessions of no
// team). A team without demand gets nothing: only teams with work waiting
// or running count. Deterministic: waterFill breaks ties by name, and no
// result depends on a map's order.
func (tp *teamPlan) split(capacity int64, demand map[ownerInTeam]int64, ownerWeight func(string) float64) (map[string]int64, map[string]int64) {
	// Each team's members: its sub-teams and its owners; the roots are
	// the members of the tree's top, noTeam among them.
	owners := map[string][]string{}
	teamDemand := map[string]int64{}
	for k, g := range demand {
		if g <= 0 {
			continue
		}
		owners[k.team] = append(owners[k.team], k.owner)
		for _, t := range tp.path(k.team) {
			teamDemand[t] += g
		}
	}
	out, teams := map[string]int64{}, map[string]int64{}
	var fill func(team string, kids []string, cap int64)
	fill = func(team string, kids []string, cap int64) {
		// Members: "t:" sub-teams, "o:" owners.
		d := map[string]int64{}
		guar := map[string]int64{}
		for _, k := range kids {
			if g := teamDemand[k]; g > 0 {
				d["t:"+k] = g
				if m := tp.tree.Teams[k].MaxGPUs; m != nil {
					d["t:"+k] = min(g, 1000*int64(*m))
				}
				if g := min(d["t:"+k], tp.guarantee(k)); g > 0 {
					guar["t:"+k] = g // weights of the guarantees' split: never 0
				}
			}
		}
		if team != "\x00root" {
			for _, o := range owners[team] {
				d["o:"+o] = demand[ownerInTeam{team, o}]
			}
		}
		weight := func(m string) float64 {
			if strings.HasPrefix(m, "o:") {
				return ownerWeight(m[2:])
			}
			if n := m[2:]; n != noTeam {
				return tp.tree.Teams[n].EffectiveWeight()
			}
			return 1
		}
		give := map[string]int64{}
		var gsum int64
		for _, g := range guar {
			gsum += g
		}
		if gsum > cap {
			give = waterFill(cap, guar, func(m string) float64 { return float64(guar[m]) })
		} else {
			for m, g := range guar {
				give[m] = g
			}
		}
		left := cap
		rest := map[string]int64{}
		for m, g := range d {
			left -= give[m]
			if r := g - give[m]; r > 0 {
				rest[m] = r
			}
		}
		if left > 0 {
			for m, g := range waterFill(left, rest, weight) {
				give[m] += g
			}
		}
		for m, g := range give {
			if strings.HasPrefix(m, "o:") {
				out[m[2:]] += g
				continue
			}
			n := m[2:]
			teams[n] = g
			var kids []string
			if n != noTeam { // Children(noTeam) would be the roots again
				kids = tp.tree.Children(n)
			}
			fill(n, kids, g)
		}
	}
	var roots []string
	for _, n := range tp.tree.Names() {
		if tp.tree.Teams[n].Parent == "" {
			roots = append(roots, n)
		}
	}
	fill("\x00root", append(roots, noTeam), capacity)
	return out, teams
}

// decayCache keeps the decayed usage of each team between passes: it
// changes only as days are written and, slowly, with time, so it is
// computed again when the records change or a minute has passed.
type decayCache struct {
	rev   int64
	at    time.Time
	usage map[string]float64
}

// of is each team's GPU-hours in days, decayed with halfLife as seen from
// now (state.DecayedUsage over the records' days; a session of no team
// counts for noTeam).
func (c *decayCache) of(days *watcher.Snapshot[state.UsageDay], now time.Time, halfLife time.Duration) map[string]float64 {
	if c.usage != nil && c.rev == days.Revision() && now.Sub(c.at) < time.Minute && !now.Before(c.at) {
		return c.usage
	}
	var list []state.UsageDay
	days.Range(func(it watcher.Item[state.UsageDay]) bool {
		list = append(list, it.Value)
		return true
	})
	ivs := state.DayIntervals(list, now, func(team, _ string) string {
		if team == "" {
			return "\x00none" // not a team name: kept apart from every team
		}
		return team
	})
	u := state.DecayedUsage(ivs, now, halfLife)
	if h, ok := u["\x00none"]; ok {
		delete(u, "\x00none")
		u[noTeam] = h
	}
	c.rev, c.at, c.usage = days.Revision(), now, u
	return u
}
