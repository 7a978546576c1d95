package placer

import (
	"cmp"
	"container/heap"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// ShortFirstNone is what PlanOptions.ShortFirst counts a request without
// a declared max runtime as: the longest rung people pick (72 h), so that
// it goes after its owner's shorter requests but is overtaken for at most
// that long.
const ShortFirstNone = 72 * time.Hour

// shortFirstLimit is e's declared max runtime as ShortFirst orders by it.
func shortFirstLimit(e *state.QueueEntry) time.Duration {
	if l := e.MaxRuntime.Std(); l > 0 {
		return min(l, ShortFirstNone)
	}
	return ShortFirstNone
}

// queueOrder yields pending sessions in placement order: priority first;
// within a priority, the owner with the smallest weighted dominant
// resource share (DRF) first, recomputed as the pass places sessions,
// then the owner's oldest request (with PlanOptions.ShortFirst, the one
// whose arrival plus declared max runtime is earliest). Age orders only an owner's own
// requests (issue 34): an aged tier before the young one (issue 17) let a
// flooder's backlog, all of it aged, go before another owner's fresh
// requests whatever their shares; aging now decides only who may hold
// nodes (hold.go).
type queueOrder struct {
	levels []*level
	cur    int
}

// level is one priority: one tier, a set of owner queues ordered by
// weighted dominant share.
type level struct {
	tiers [1]*tier
}

type tier struct {
	owners ownerHeap
	byName map[string]*ownerQueue
}

type ownerQueue struct {
	owner string
	// team is the team of the owner's requests in this queue: an owner
	// with requests in two teams has a queue in each (teams.go).
	team string
	// tkey is the key vector of team (teamPlan.keyOf): owners compare by
	// it first. Empty without teams.
	tkey teamKey
	// model is the guaranteed model key of the queue's requests
	// (teammodels.go): an owner's requests of a model its team is owed
	// queue apart from its others. Empty without model guarantees.
	model string
	items []*Pending
	// aging holds the items with their ages while order builds the
	// queue: sorted, they become items.
	aging []ageKey
	share float64 // weighted share: orders owners
	own   float64 // the owner's own share: breaks ties
	index int
}

func (p *planner) order() *queueOrder {
	byPrio := map[int]*level{}
	var prios []int
	// groupsOf's map is built here, in the one walk of the queue the
	// order needs anyway, unless something asked for it before
	// (holdLarge does, when requests age into reservations).
	groups := p.ownerGroups == nil
	if groups {
		p.ownerGroups = map[string][]string{}
	}
	for i := range p.snap.Pending {
		it := &p.snap.Pending[i]
		lv, ok := byPrio[it.Entry.Priority]
		if !ok {
			lv = &level{tiers: [1]*tier{{byName: map[string]*ownerQueue{}}}}
			byPrio[it.Entry.Priority] = lv
			prios = append(prios, it.Entry.Priority)
		}
		tr := lv.tiers[0]
		model := p.modelKeyOf(it.Entry)
		oq, ok := tr.byName[queueName(it.Entry, model)]
		if !ok {
			oq = &ownerQueue{owner: it.Entry.Owner, team: it.Entry.Team, model: model}
			tr.byName[queueName(it.Entry, model)] = oq
			if groups {
				if _, seen := p.ownerGroups[it.Entry.Owner]; !seen {
					p.ownerGroups[it.Entry.Owner] = it.Entry.Groups
				}
			}
		}
		k := ageKey{sec: it.Entry.Created.Unix(), nsec: int32(it.Entry.Created.Nanosecond()), it: it}
		if p.opt.ShortFirst {
			k.sec += int64(shortFirstLimit(it.Entry) / time.Second)
		}
		oq.aging = append(oq.aging, k)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(prios)))
	q := &queueOrder{}
	for _, pr := range prios {
		lv := byPrio[pr]
		for _, tr := range lv.tiers {
			for _, oq := range tr.byName {
				// Sorted by the ages copied out, not through each
				// item's entry: 20,000 entries spread over the heap
				// cost a cache miss each, every comparison.
				slices.SortFunc(oq.aging, olderFirstKey)
				oq.items = make([]*Pending, len(oq.aging))
				for i := range oq.aging {
					oq.items[i] = oq.aging[i].it
				}
				oq.aging = nil
				oq.share, oq.own = p.weightedShare(oq.owner)
				if p.teams != nil {
					oq.tkey = p.teams.keyOfModel(oq.team, oq.model, oq.tkey)
				}
				oq.index = len(tr.owners)
				tr.owners = append(tr.owners, oq)
			}
			heap.Init(&tr.owners)
		}
		q.levels = append(q.levels, lv)
	}
	return q
}

// ageKey is a queue item with its request's creation time, as olderFirst
// compares it (Unix seconds, then nanoseconds: time.Time.Compare's order
// for times without a monotonic reading, as decoded ones are).
type ageKey struct {
	sec  int64
	nsec int32
	it   *Pending
}

// olderFirstKey orders as olderFirst does: a total order (session ids are
// unique), so an unstable sort gives the same order every time.
func olderFirstKey(a, b ageKey) int {
	if c := cmp.Compare(a.sec, b.sec); c != 0 {
		return c
	}
	if c := cmp.Compare(a.nsec, b.nsec); c != 0 {
		return c
	}
	return strings.Compare(a.it.Entry.Session, b.it.Entry.Session)
}

func olderFirst(a, b *Pending) bool {
	if !a.Entry.Created.Equal(b.Entry.Created) {
		return a.Entry.Created.Before(b.Entry.Created)
	}
	return a.Entry.Session < b.Entry.Session
}

// next returns the next session to try, or nil when the queue is done.
func (q *queueOrder) next() *Pending {
	for q.cur < len(q.levels) {
		for _, tr := range q.levels[q.cur].tiers {
			if len(tr.owners) == 0 {
				continue
			}
			oq := tr.owners[0]
			it := oq.items[0]
			oq.items = oq.items[1:]
			if len(oq.items) == 0 {
				heap.Pop(&tr.owners)
			} else {
				heap.Fix(&tr.owners, 0) // its first request changed
			}
			return it
		}
		q.cur++
	}
	return nil
}

// placed tells the order that the share of e's owner (and team) grew.
func (q *queueOrder) placed(e *state.QueueEntry, p *planner) {
	if q.cur >= len(q.levels) {
		return
	}
	for _, tr := range q.levels[q.cur].tiers {
		if oq, ok := tr.byName[queueName(e, p.modelKeyOf(e))]; ok && oq.index >= 0 {
			oq.share, oq.own = p.weightedShare(e.Owner)
			heap.Fix(&tr.owners, oq.index)
		}
		if p.teams != nil {
			p.teams.rekey(tr, e.Team)
		}
	}
}

// queueName is the owner queue of e, whose request is of model key
// model: its owner's, in its team, of that model.
func queueName(e *state.QueueEntry, model string) string {
	if e.Team == "" {
		return e.Owner
	}
	if model != "" {
		return e.Team + "\x00" + e.Owner + "\x00" + model
	}
	return e.Team + "\x00" + e.Owner
}

// weightedShare is the share that orders owner, and the share that
// breaks ties between owners of one equal first share. An owner in no
// weighted group is ordered by its dominant share over its weight. An
// owner in groups with a weight is ordered by the largest of each such
// group's dominant share over the group's weight (and its own weighted
// share, if it has a weight of its own), then by its own share: a group of
// weight 3 is served as if its members together held a third of what they
// hold, and its members share that evenly. Weights come from quotas
// (state.Quota.Weight); absent, a weight is 1.
func (p *planner) weightedShare(owner string) (float64, float64) {
	mine := p.usage.users[owner]
	if c := p.charged[owner]; c > 0 {
		// Nodes held beyond the owner's budget count as its own.
		var a amounts
		if mine != nil {
			a = *mine
		}
		a.gpus += c
		mine = &a
	}
	own := p.usage.share(mine)
	first, grouped := own, false
	for _, g := range p.groupsOf(owner) {
		if q, ok := p.snap.GroupQuotas[g]; ok && q.Weight != nil && *q.Weight > 0 {
			gs := p.usage.share(p.usage.groups[g]) / *q.Weight
			if !grouped || gs > first {
				first = gs
			}
			grouped = true
		}
	}
	if q, ok := p.snap.UserQuotas[owner]; ok && q.Weight != nil && *q.Weight > 0 {
		if !grouped {
			first = own / *q.Weight
		} else {
			first = max(first, own / *q.Weight)
		}
	}
	return first, own
}

// groupsOf is the groups of owner's requests, as the queue entries carry
// them (the API copies them from the owner's identity).
func (p *planner) groupsOf(owner string) []string {
	if p.ownerGroups == nil {
		p.ownerGroups = map[string][]string{}
		for i := range p.snap.Pending {
			e := p.snap.Pending[i].Entry
			if _, ok := p.ownerGroups[e.Owner]; !ok {
				p.ownerGroups[e.Owner] = e.Groups
			}
		}
	}
	return p.ownerGroups[owner]
}

// ownerHeap orders owners by weighted share, then own share, then by their
// oldest request, then by name, team and model.
type ownerHeap []*ownerQueue

func (h ownerHeap) Len() int { return len(h) }
func (h ownerHeap) Less(i, j int) bool {
	if c := compareKeys(h[i].tkey, h[j].tkey); c != 0 {
		return c < 0
	}
	if h[i].share != h[j].share {
		return h[i].share < h[j].share
	}
	if h[i].own != h[j].own {
		return h[i].own < h[j].own
	}
	if !h[i].items[0].Entry.Created.Equal(h[j].items[0].Entry.Created) {
		return h[i].items[0].Entry.Created.Before(h[j].items[0].Entry.Created)
	}
	// A total order: an owner has a queue per team and model (queueName),
	// and the queues come from a map (TestModelScanMatchesReference,
	// round 50, planned one snapshot two ways while they tied here).
	if h[i].owner != h[j].owner {
		return h[i].owner < h[j].owner
	}
	if h[i].team != h[j].team {
		return h[i].team < h[j].team
	}
	return h[i].model < h[j].model
}
func (h ownerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}
func (h *ownerHeap) Push(x any) {
	oq := x.(*ownerQueue)
	oq.index = len(*h)
	*h = append(*h, oq)
}
func (h *ownerHeap) Pop() any {
	old := *h
	oq := old[len(old)-1]
	oq.index = -1
	*h = old[:len(old)-1]
	return oq
}
