package placer

import (
	"cmp"
	"math"
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
	// keys are the queue's requests in order, each with its creation
	// time (Unix seconds and nanoseconds), which ownerHeap compares at
	// the head: copied out, not read through the entries (20,000 entries
	// spread over the heap cost a cache miss each), and with its index
	// in the snapshot's queue (the pass's tail facts, tail.go).
	keys []ageKey
	// groups are the age groups of the queue while order builds it:
	// sorted together, they become keys.
	groups []*ageGroup
	share  float64 // weighted share: orders owners
	own    float64 // the owner's own share: breaks ties
	// head is keys[0]'s time, copied beside the shares that ownerHeap
	// compares first: the heap reads one struct per owner, not its keys
	// too (at 2,000 owners a cache miss more in each of the order's
	// comparisons). setHead keeps it.
	headSec  int64
	headNsec int32
	index    int
}

// setHead copies the time of oq's first request into head.
func (oq *ownerQueue) setHead() {
	if len(oq.keys) > 0 {
		oq.headSec, oq.headNsec = oq.keys[0].sec, oq.keys[0].nsec
	}
}

// order is the pass's queue order (queueOrder), over the age groups of
// byAge, with each owner's share as it stands after the holds.
func (p *planner) order() *queueOrder {
	byPrio := map[int]*level{}
	var prios []int
	ages := p.byAge()
	// At most one a group, in one array kept between passes.
	p.buf.ownerQueues = resized(p.buf.ownerQueues, len(ages))
	queues := p.buf.ownerQueues[:0]
	for _, ag := range ages {
		lv, ok := byPrio[ag.key.prio]
		if !ok {
			var byName map[string]*ownerQueue
			if len(byPrio) == 0 { // most queues have one priority
				byName = pooledMap(&p.buf.maps.queues, p.owners)
			} else {
				byName = map[string]*ownerQueue{}
			}
			lv = &level{tiers: [1]*tier{{byName: byName}}}
			byPrio[ag.key.prio] = lv
			prios = append(prios, ag.key.prio)
		}
		tr := lv.tiers[0]
		first := ag.keys[0].it.Entry
		name := queueName(first, ag.key.model)
		oq, ok := tr.byName[name]
		if !ok {
			queues = append(queues, ownerQueue{owner: ag.key.owner, team: ag.key.team, model: ag.key.model})
			oq = &queues[len(queues)-1]
			tr.byName[name] = oq
		}
		oq.groups = append(oq.groups, ag)
	}
	sort.Sort(sort.Reverse(sort.IntSlice(prios)))
	q := &queueOrder{}
	for _, pr := range prios {
		lv := byPrio[pr]
		for _, tr := range lv.tiers {
			for _, oq := range tr.byName {
				oq.keys = oq.sorted(p.opt.ShortFirst)
				oq.setHead()
				oq.groups = nil
				oq.share, oq.own = p.weightedShare(oq.owner)
				if p.teams != nil {
					oq.tkey = p.teams.keyOfModel(oq.team, oq.model, oq.tkey)
				}
				oq.index = len(tr.owners)
				tr.owners = append(tr.owners, oq)
			}
			tr.owners.init()
		}
		q.levels = append(q.levels, lv)
	}
	return q
}

// sorted is the queue's requests in the order its owner's requests go:
// oldest first, or with shortFirst by arrival plus declared max runtime;
// each key holds the request's own creation time either way. Its age
// groups are sorted by age already: one group (an owner's requests of
// one team and model key, as a rule) is used as it is.
func (oq *ownerQueue) sorted(shortFirst bool) []ageKey {
	if len(oq.groups) == 1 && !shortFirst {
		return oq.groups[0].keys
	}
	// Sorted by the ages copied out, not through each item's entry:
	// 20,000 entries spread over the heap cost a cache miss each, every
	// comparison.
	var aging []ageKey
	for _, ag := range oq.groups {
		aging = append(aging, ag.keys...)
	}
	if !shortFirst {
		slices.SortFunc(aging, olderFirstKey)
		return aging
	}
	for i := range aging {
		aging[i].sec += int64(shortFirstLimit(aging[i].it.Entry) / time.Second)
	}
	slices.SortFunc(aging, olderFirstKey)
	for i := range aging {
		aging[i].sec -= int64(shortFirstLimit(aging[i].it.Entry) / time.Second)
	}
	return aging
}

// ageGroup is the requests of one priority, team, owner and model key
// (holdKey), oldest first (olderFirstKey): both the hold queue (hold.go)
// and the queue order read them.
type ageGroup struct {
	key  holdKey
	keys []ageKey
}

// byAge is the snapshot's queue in age groups, pinned sessions included,
// made at the first call of the pass: the one walk of the queue that
// holds and the order both need, and the one sort by age.
func (p *planner) byAge() []*ageGroup {
	if p.ages != nil {
		return p.ages
	}
	// groupsOf's map is built here too, unless something asked for it
	// before.
	hint := min(p.buf.owners, len(p.snap.Pending))
	groups := p.ownerGroups == nil
	if groups {
		p.ownerGroups = pooledMap(&p.buf.maps.ownerGroups, hint)
	}
	// Each request's key in the queue's order first, then each group's
	// keys laid out together in one array of the size they take: no
	// slice grows while the queue is read (appending 20,000 keys group
	// by group allocated three times what they take).
	//
	// A request's group is found by its owner first, then by priority,
	// team and model among that owner's few groups (next chains them):
	// one string hashed per request, where a map keyed by holdKey hashed
	// three (about 5% of BenchmarkNewPlanBacklog's pass).
	byOwner := pooledMap(&p.buf.maps.ageOwners, hint) // owner → its latest group
	next := p.buf.next[:0]                            // group → its owner's group before it, -1 at the first
	p.ages = p.buf.ages[:0]
	if p.ages == nil {
		p.ages = []*ageGroup{} // made: byAge runs once a pass, an empty queue too
	}
	// The groups, in the array of the passes before (released cleared),
	// and where that is full in blocks allocated as needed: the largest
	// is kept for the next pass.
	slab := p.buf.ageGroups[:0]
	counts := p.buf.counts[:0]
	n := len(p.snap.Pending)
	// Every element of these is written below: they need no clearing.
	p.buf.gids, p.buf.flat, p.buf.laid = resized(p.buf.gids, n), resized(p.buf.flat, n), resized(p.buf.laid, n)
	p.buf.facts, p.buf.tailIns = resized(p.buf.facts, n), resized(p.buf.tailIns, n)
	gids, flat, laid, facts := p.buf.gids, p.buf.flat, p.buf.laid, p.buf.facts
	p.facts = facts
	for i := range p.snap.Pending {
		it := &p.snap.Pending[i]
		e := it.Entry
		facts[i] = reqFacts{gpus: requestGPUs(e, p.usage.shareRef), largest: e.Request.GPUs, pinned: it.Pinned}
		p.buf.tailIns[i] = tailInOf(it) // tail.go
		if e.Workers > 0 && e.WorkerRequest != nil {
			facts[i].largest = max(facts[i].largest, e.WorkerRequest.GPUs)
		}
		k := holdKey{e.Priority, e.Team, e.Owner, p.modelKeyOf(e)}
		latest, seen := byOwner[e.Owner]
		g := int32(-1)
		for h := latest; seen && h >= 0; h = next[h] {
			if p.ages[h].key == k {
				g = h
				break
			}
		}
		if g < 0 {
			g = int32(len(p.ages))
			if !seen {
				latest = -1
			}
			next = append(next, latest)
			byOwner[e.Owner] = g
			if len(slab) == cap(slab) {
				slab = make([]ageGroup, 0, max(16, 2*cap(slab)))
			}
			slab = append(slab, ageGroup{key: k})
			p.ages = append(p.ages, &slab[len(slab)-1])
			counts = append(counts, 0)
			if groups {
				if _, seen := p.ownerGroups[e.Owner]; !seen {
					p.ownerGroups[e.Owner] = e.Groups
				}
			}
		}
		gids[i] = g
		counts[g]++
		flat[i] = ageKey{sec: e.Created.Unix(), nsec: int32(e.Created.Nanosecond()), pinned: it.Pinned, id: e.Session, it: it, idx: i}
	}
	p.owners, p.buf.owners = len(byOwner), len(byOwner)
	p.buf.ages, p.buf.next, p.buf.counts = p.ages, next, counts
	if cap(slab) > cap(p.buf.ageGroups) {
		p.buf.ageGroups = slab
	}
	off := 0
	for g, ag := range p.ages {
		ag.keys = laid[off : off : off+counts[g]]
		off += counts[g]
	}
	// Laid out oldest first (ageOrder), each group's keys come out sorted
	// by age, ties in the queue's order: a run of one age is then sorted
	// by id, as olderFirstKey orders. Where ageOrder cannot sort the ages
	// (too far apart), they are laid out in the queue's order and each
	// group is sorted by olderFirstKey.
	order := p.ageOrder(flat)
	for k := range flat {
		j := k
		if order != nil {
			j = int(order[k])
		}
		ag := p.ages[gids[j]]
		ag.keys = append(ag.keys, flat[j])
	}
	for _, ag := range p.ages {
		if order == nil {
			slices.SortFunc(ag.keys, olderFirstKey)
			continue
		}
		for i := 0; i < len(ag.keys); {
			k := i + 1
			for k < len(ag.keys) && ag.keys[k].sec == ag.keys[i].sec && ag.keys[k].nsec == ag.keys[i].nsec {
				k++
			}
			if k-i > 1 {
				slices.SortFunc(ag.keys[i:k], func(a, b ageKey) int { return strings.Compare(a.id, b.id) })
			}
			i = k
		}
	}
	// Every group's keys lie in laid, one group after another: each
	// key's place there, and each request's place by its index.
	p.buf.posOf = resized(p.buf.posOf, n)
	for j := range laid {
		laid[j].pos = int32(j)
		p.buf.posOf[laid[j].idx] = int32(j)
	}
	return p.ages
}

// ageOrder is the indexes of keys from the oldest (by seconds, then
// nanoseconds) to the youngest, equal ages in the order of their indexes:
// a radix sort on each key's nanoseconds since the oldest, a few passes
// over an array instead of a comparison sort's n log n calls through a
// function value (sorting 20,000 keys so was a tenth of a pass at 20,000
// queued, BenchmarkNewPlanBacklog). nil where the ages span too long for
// nanoseconds to fit 64 bits (about 584 years: a zero time among real
// ones); the caller then sorts by comparison.
func (p *planner) ageOrder(keys []ageKey) []int32 {
	if len(keys) == 0 {
		return nil
	}
	lo, hi := keys[0].sec, keys[0].sec
	for i := range keys {
		lo, hi = min(lo, keys[i].sec), max(hi, keys[i].sec)
	}
	// The span in seconds, exact in uint64 (it is below 2⁶⁴), must leave
	// room for its nanoseconds and a second's more.
	const maxSpan = math.MaxUint64/1_000_000_000 - 1
	if uint64(hi)-uint64(lo) > maxSpan {
		return nil
	}
	p.buf.radix, p.buf.radixTmp = resized(p.buf.radix, len(keys)), resized(p.buf.radixTmp, len(keys)) // each written in full
	cur, tmp := p.buf.radix, p.buf.radixTmp
	var most uint64
	for i := range keys {
		t := uint64(keys[i].sec-lo)*1e9 + uint64(keys[i].nsec)
		cur[i] = radixKey{t: t, i: int32(i)}
		most = max(most, t)
	}
	cur = radixSort(cur, tmp, most)
	p.buf.order = resized(p.buf.order, len(keys))
	for i := range cur {
		p.buf.order[i] = cur[i].i
	}
	return p.buf.order
}

// radixKey is a number to sort by (radixSort) with the index of what it
// is of.
type radixKey struct {
	t uint64
	i int32
}

// radixSort sorts keys by t, stably (equal numbers keep their order), in
// passes of 11 bits up to the highest bit of most (at least every t), and
// returns them sorted: in keys or in tmp (as long as keys), which it uses
// as scratch.
func radixSort(keys, tmp []radixKey, most uint64) []radixKey {
	const bits = 11
	for shift := 0; shift < 64 && most>>shift != 0; shift += bits {
		var count [1<<bits + 1]int32
		for i := range keys {
			count[(keys[i].t>>shift)&(1<<bits-1)+1]++
		}
		for d := 1; d < len(count); d++ {
			count[d] += count[d-1]
		}
		for i := range keys {
			d := (keys[i].t >> shift) & (1<<bits - 1)
			tmp[count[d]] = keys[i]
			count[d]++
		}
		keys, tmp = tmp, keys
	}
	return keys
}

// reqFacts is what the holds read of every queued request, read in
// byAge's walk of the queue (the one that reads each entry in the
// snapshot's order) so that later walks in age order find it in one
// array by the request's index instead of in its entry: the GPUs it asks
// for in all (requestGPUs), the most one part asks for (largeReq), and
// whether it is pinned.
type reqFacts struct {
	gpus    int64
	largest int
	pinned  bool
}

// agedKey is aged for the request of k, from its key and facts alone.
func (p *planner) agedKey(k *ageKey) bool {
	return p.agedAt(time.Unix(k.sec, int64(k.nsec)), p.facts[k.idx].gpus)
}

// ageKey is a queue item with its request's creation time, as olderFirst
// compares it (Unix seconds, then nanoseconds: time.Time.Compare's order
// for times without a monotonic reading, as decoded ones are).
type ageKey struct {
	sec  int64
	nsec int32
	// pos is the key's place in the pass's array of every group's keys
	// laid out together (byAge), where the tail keeps its facts of the
	// request (tail.go): the order reads a group's keys, and so those
	// facts, in that array's order.
	pos int32
	// pinned is it.Pinned, kept here so that the order's loop need not
	// read it (a cache miss a request at 20,000 queued).
	pinned bool
	id     string // the session's id, which breaks ties
	it     *Pending
	idx    int // it's index in the snapshot's queue
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
	return strings.Compare(a.id, b.id)
}

func olderFirst(a, b *Pending) bool {
	if !a.Entry.Created.Equal(b.Entry.Created) {
		return a.Entry.Created.Before(b.Entry.Created)
	}
	return a.Entry.Session < b.Entry.Session
}

// next returns the next session to try, with its key's place among the
// pass's keys (ageKey.pos, where the tail keeps its facts) and whether it
// is pinned (Pending.Pinned), or nil when the queue is done.
func (q *queueOrder) next() (*Pending, int, bool) {
	for q.cur < len(q.levels) {
		for _, tr := range q.levels[q.cur].tiers {
			if len(tr.owners) == 0 {
				continue
			}
			oq := tr.owners[0]
			k := oq.keys[0]
			oq.keys = oq.keys[1:]
			if len(oq.keys) == 0 {
				tr.owners.pop()
			} else {
				oq.setHead()
				tr.owners.fix(0) // its first request changed
			}
			return k.it, int(k.pos), k.pinned
		}
		q.cur++
	}
	return nil, -1, false
}

// placed tells the order that the share of e's owner (and team) grew.
func (q *queueOrder) placed(e *state.QueueEntry, p *planner) {
	if q.cur >= len(q.levels) {
		return
	}
	for _, tr := range q.levels[q.cur].tiers {
		if oq, ok := tr.byName[queueName(e, p.modelKeyOf(e))]; ok && oq.index >= 0 {
			oq.share, oq.own = p.weightedShare(e.Owner)
			tr.owners.fix(oq.index)
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
	var groups []string
	if len(p.snap.GroupQuotas) > 0 { // else no group has a weight
		groups = p.groupsOf(owner)
	}
	for _, g := range groups {
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

func (h ownerHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if len(a.tkey.keys) > 0 || len(b.tkey.keys) > 0 { // without teams both are empty: equal
		if c := compareKeys(a.tkey, b.tkey); c != 0 {
			return c < 0
		}
	}
	if a.share != b.share {
		return a.share < b.share
	}
	if a.own != b.own {
		return a.own < b.own
	}
	if a.headSec != b.headSec || a.headNsec != b.headNsec { // the older first request first
		return a.headSec < b.headSec || a.headSec == b.headSec && a.headNsec < b.headNsec
	}
	// A total order: an owner has a queue per team and model (queueName),
	// and the queues come from a map (TestModelScanMatchesReference,
	// round 50, planned one snapshot two ways while they tied here).
	if a.owner != b.owner {
		return a.owner < b.owner
	}
	if a.team != b.team {
		return a.team < b.team
	}
	return a.model < b.model
}
func (h ownerHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index = i
	h[j].index = j
}

// The order's loop takes an owner's head request and fixes the heap
// twenty thousand times a pass; these are container/heap's Init, Fix and
// Pop with Less and Swap called directly rather than through
// heap.Interface (at 2,000 owners the calls through it were about 5% of
// the pass).

// init establishes the heap order.
func (h ownerHeap) init() {
	for i := len(h)/2 - 1; i >= 0; i-- {
		h.down(i, len(h))
	}
}

// fix re-establishes the heap order after element i's key changed.
func (h ownerHeap) fix(i int) {
	if !h.down(i, len(h)) {
		h.up(i)
	}
}

// pop removes the least element.
func (h *ownerHeap) pop() {
	n := len(*h) - 1
	h.Swap(0, n)
	h.down(0, n)
	(*h)[n].index = -1
	*h = (*h)[:n]
}

func (h ownerHeap) up(j int) {
	for {
		i := (j - 1) / 2 // parent
		if i == j || !h.Less(j, i) {
			break
		}
		h.Swap(i, j)
		j = i
	}
}

func (h ownerHeap) down(i0, n int) bool {
	i := i0
	for {
		j1 := 2*i + 1
		if j1 >= n || j1 < 0 { // j1 < 0 after int overflow
			break
		}
		j := j1 // left child
		if j2 := j1 + 1; j2 < n && h.Less(j2, j1) {
			j = j2 // = 2*i + 2  // right child
		}
		if !h.Less(j, i) {
			break
		}
		h.Swap(i, j)
		i = j
	}
	return i > i0
}
