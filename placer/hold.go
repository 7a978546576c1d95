package placer

import (
	"cmp"
	"container/heap"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// Holds (issue 34). A request that needs a whole node (or more free GPUs
// than any node in use has) starves behind a stream of small ones unless
// freed GPUs are kept for it: a freed GPU goes to a small request within
// a pass, while a node frees whole only when its last session ends. So an
// aged request that fits no node in use holds the nodes closest to fitting
// it (those whose sessions' max runtimes free them soonest, drain.go):
// nothing else is placed there, and the node drains.
//
// How much an owner may hold scales with the cluster and with its fair
// share: each owner is entitled to its weighted max-min share of the
// cluster's GPUs given every owner's demand (GPUs held plus GPUs waiting;
// water-filling), and its requests may hold nodes while the GPUs they ask
// for stay below what its entitlement exceeds its holding by. An owner at
// or above its share holds nothing; one far below it (an owner asking only
// for 8-GPU sessions against one flooding 1-GPU sessions) drains as many
// nodes as it is owed, at once, instead of one at a time. Holders are
// taken by priority, then weighted share, then age, as the order is.
//
// A held node's free GPUs are idle until the request fits: that is what
// draining costs, and the budget bounds it by what the owners below their
// share are owed. Backfill recovers part of it: when every session on a
// held node has a max runtime, the node has drained by the latest of
// their ends (state.Allocation.Ends), and a request whose own max runtime
// ends by then may run there: it is gone before the holder could start.
// Sessions without a max runtime (most notebooks) leave nothing to
// backfill: their node's drain time is unknown.

// keepsAheadNodes is the fewest nodes at which the planner keeps GPUs
// for requests it has not placed yet, beyond the holds of aged ones: the
// standing reserve (reserve.go), spread's bands (spreadwhole.go), claims
// (claim.go), no hold on an empty node for a small request (holdLarge)
// and lending only short work (lend.go). On a smaller cluster one node is
// over 5% of the GPUs, and keeping one for requests not yet made costs
// more than busy ≥ 95% allows (placer/README.md, "Fair share under a
// backlog").
const keepsAheadNodes = 20

// keepsAhead reports whether this pass applies those rules: holds are on
// (ReserveAfter above zero) and the cluster has keepsAheadNodes nodes.
func (p *planner) keepsAhead() bool {
	return p.opt.ReserveAfter > 0 && len(p.nodes) >= keepsAheadNodes
}

// entitle computes each owner's hold budget: its weighted max-min share of
// the cluster's GPUs, given every owner's demand, less what it holds. For
// an owner at or above its share (no budget), the charge budget: the part
// of what it holds that its own large requests may keep idle while nodes
// drain for them, charged to its share: what it holds times the fraction
// of its waiting GPUs that large requests (a part above maxPartial GPUs)
// ask for. Such an owner thus spends its share on its requests of every
// size, in proportion to what it waits for, instead of its small requests
// taking all of it while its large ones wait. The charge is paid in the
// fair order: what the hold keeps idle counts as the owner's until its
// request starts (holdFor), so its own later requests wait behind other
// owners'. This holds for an owner whose queue is all large requests as
// well. Such an owner used to hold for one request at a time while an
// owner below its share was starved. That rule was dropped once claims
// and lending made it buy nothing (placer/README.md, "What each rule
// buys").
func (p *planner) entitle(maxPartial int) {
	ages := p.byAge() // first: it counts the owners (p.owners) that size the maps below
	m := &p.buf.maps
	held := pooledMap(&m.held, len(p.quota.users))
	for o, a := range p.quota.users { // ledgers, pinned sessions included
		held[o] = a.gpus
	}
	demand := pooledMap(&m.demand, len(held)+p.owners)
	for o, g := range held {
		demand[o] = g
	}
	// The queue by age group (byAge), each group summed before its
	// owner's sums are found: a map lookup by owner a group, not three a
	// request.
	waiting, large := pooledMap(&m.waiting, p.owners), pooledMap(&m.large, p.owners)
	for _, ag := range ages {
		var w, l int64
		for i := range ag.keys {
			f := &p.facts[ag.keys[i].idx]
			if f.pinned {
				continue
			}
			w += f.gpus
			if f.largest > maxPartial { // largeReq
				l += f.gpus
			}
		}
		if w == 0 {
			continue
		}
		o := ag.key.owner
		demand[o] += w
		waiting[o] += w
		if l > 0 {
			large[o] += l
		}
	}
	var ent map[string]int64
	if p.teams != nil {
		ent = p.teams.entitle(p.usage.total.gpus, p.snap.Pending, p.usage.shareRef, p.ownerWeight) // down the team tree
	} else {
		ent = waterFill(p.usage.total.gpus, demand, p.ownerWeight)
	}
	p.holdOwners = pooledMap(&m.holdOwners, len(ent))
	p.buf.ownerHolds = resized(p.buf.ownerHolds, len(ent)) // one array, kept between passes
	all := p.buf.ownerHolds
	for o, e := range ent {
		oh := &all[len(p.holdOwners)]
		*oh = ownerHolds{entitled: true, budget: e - held[o]}
		if w := waiting[o]; w > 0 {
			oh.chargeBudget = held[o] * large[o] / w
		}
		oh.claims = p.claimOwner(oh, held[o])
		p.holdOwners[o] = oh
	}
}

// ownerHolds is what a pass keeps of one owner's holds and claims: its
// budgets, set by entitle, and what its requests holding nodes or
// claiming took since. The holds read these for each request they
// consider, and one lookup by the owner's name finds them all (at 2,000
// owners the five maps by name they were cost about 9% of the pass).
type ownerHolds struct {
	// entitled marks an owner entitle gave a share (every owner with
	// demand), apart from one found later.
	entitled bool
	// budget is the GPUs by which the owner's fair entitlement exceeds
	// what it holds (entitle).
	budget int64
	// chargeBudget is the GPUs its requests may hold beyond its budget,
	// charged to its share (entitle).
	chargeBudget int64
	// gpus is the GPUs its requests holding nodes ask for; holders is
	// how many of them there are (holdFor).
	gpus    int64
	holders int
	// claimed is the GPUs its fitting requests claimed (claim.go), and
	// claims whether its requests claim at all (claimOwner, fixed for the
	// pass at entitle).
	claimed int64
	claims  bool
}

// noHolds is the ownerHolds of an owner the pass has none for: read
// only.
var noHolds ownerHolds

// ownerHoldsOf returns owner's holds and budgets, the zero ones (read
// only) where the pass has none.
func (p *planner) ownerHoldsOf(owner string) *ownerHolds {
	if oh := p.holdOwners[owner]; oh != nil {
		return oh
	}
	return &noHolds
}

// ownerHoldsFor returns owner's holds and budgets to write, adding them
// where the pass has none.
func (p *planner) ownerHoldsFor(owner string) *ownerHolds {
	oh := p.holdOwners[owner]
	if oh == nil {
		oh = &ownerHolds{}
		p.holdOwners[owner] = oh
	}
	return oh
}

// largeReq reports whether some part of e asks for more GPUs than
// maxPartial, the most free on any node in use: it needs an empty node.
func largeReq(e *state.QueueEntry, maxPartial int) bool {
	if e.Request.GPUs > maxPartial {
		return true
	}
	if e.Workers > 0 && e.WorkerRequest != nil {
		return e.WorkerRequest.GPUs > maxPartial
	}
	return false
}

// smallReq reports whether every part of e asks for at most half of
// whole GPUs (a node's).
func smallReq(e *state.QueueEntry, whole int) bool {
	if 2*e.Request.GPUs > whole {
		return false
	}
	return e.Workers == 0 || 2*e.WorkerResources().GPUs <= whole
}

// requestGPUs is every GPU e asks for, on all its parts, in thousandths
// of a GPU (a fraction as its share of a GPU of refMiB, share.go): the
// unit of the planner's usage amounts, which the hold budget is computed
// against.
func requestGPUs(e *state.QueueEntry, refMiB int64) int64 {
	g := milliGPUs(&e.Request, refMiB)
	if e.Workers > 0 {
		g += int64(e.Workers) * milliGPUs(e.WorkerResources(), refMiB)
	}
	return g
}

// ownerWeight is owner's own fair-share weight (its user quota's weight;
// 1 if none). Group weights order the queue (weightedShare); the hold
// budget divides by owners alone.
func (p *planner) ownerWeight(owner string) float64 {
	if q, ok := p.snap.UserQuotas[owner]; ok && q.Weight != nil && *q.Weight > 0 {
		return *q.Weight
	}
	return 1
}

// waterFill divides capacity among demands by weight, max-min: owners in
// order of demand over weight each take the lesser of their demand and
// their weight's part of what is left. Deterministic: ties by name.
func waterFill(capacity int64, demand map[string]int64, weight func(string) float64) map[string]int64 {
	// Each owner's demand, weight and demand per weight read once, not
	// at each comparison of the sort (at 2,000 owners the lookups by
	// name in the comparisons were 2% of the pass).
	type owed struct {
		name  string
		d     int64
		w, by float64
	}
	owners := make([]owed, 0, len(demand))
	for o, d := range demand {
		if d > 0 {
			w := weight(o)
			owners = append(owners, owed{name: o, d: d, w: w, by: float64(d) / w})
		}
	}
	slices.SortFunc(owners, func(a, b owed) int {
		if a.by != b.by {
			return cmp.Compare(a.by, b.by)
		}
		return strings.Compare(a.name, b.name)
	})
	wsum := 0.0
	for _, o := range owners { // in order: a float sum depends on it, and placers must agree
		wsum += o.w
	}
	left := float64(capacity)
	out := make(map[string]int64, len(owners))
	for _, o := range owners {
		give := min(float64(o.d), left*o.w/wsum)
		left -= give
		wsum -= o.w
		out[o.name] = int64(give + 0.5)
	}
	return out
}

// aged reports whether e has waited long enough to hold nodes: its hold
// delay, ReserveAfter over the GPUs it asks for in all (at least one).
// Size-aware aging: the larger a request, the less its chance of finding
// a node by itself among small ones, so the sooner it may make one drain;
// an 8-GPU request may hold after a pass or two (75 s at the default 10
// minutes), a 1-GPU one after ReserveAfter, and the hold budget, not the
// delay, bounds how much of the cluster drains.
func (p *planner) aged(e *state.QueueEntry) bool {
	return p.agedAt(e.Created, requestGPUs(e, p.usage.shareRef))
}

// agedAt is aged for a request created at created asking for gpus in all
// (requestGPUs).
func (p *planner) agedAt(created time.Time, gpus int64) bool {
	if p.opt.ReserveAfter <= 0 {
		return false
	}
	return p.snap.Now.Sub(created) >= p.opt.ReserveAfter/time.Duration(max(gpus/1000, 1)) // holdAfter
}

// holdAfter is how long e waits before it may hold nodes.
func (p *planner) holdAfter(e *state.QueueEntry) time.Duration {
	return p.opt.ReserveAfter / time.Duration(max(requestGPUs(e, p.usage.shareRef)/1000, 1))
}

// mayHold reports whether e may hold nodes now: it has waited
// ReserveAfter, holds none yet, and its owner's requests holding nodes ask
// for less than the owner's hold budget.
func (p *planner) mayHold(e *state.QueueEntry) bool {
	return p.aged(e) && p.mayHoldAged(e)
}

// mayHoldAged is mayHold for e known to be aged.
func (p *planner) mayHoldAged(e *state.QueueEntry) bool {
	if p.holdOwners == nil {
		return false
	}
	return len(p.holding[e.Session]) == 0 && p.ownerHoldsOf(e.Owner).mayHold()
}

// mayHoldOpen is mayHold for a request on the tail's path whose tail
// facts are t (placeOpen): it holds no nodes, and its age and owner's
// holds are in t (not the tail's memo of mayHold, which may be stale).
func (p *planner) mayHoldOpen(t *tailFacts) bool {
	return t.aged && p.holdOwners != nil && t.owner.holds.mayHold()
}

// mayHold reports whether the owner's requests holding nodes ask for
// less than its hold budget (for an owner with none, its charge budget),
// or it holds for none yet.
func (oh *ownerHolds) mayHold() bool {
	if oh.budget > 0 {
		return oh.gpus < oh.budget
	}
	return oh.gpus < oh.chargeBudget || oh.holders == 0
}

// holdLarge, before the queue order runs, lets aged requests that fit no
// node in use hold the nodes closest to fitting them (closest), by
// priority, then their owner's weighted share, then age, within each
// owner's hold budget: capacity freed on a draining node stays there
// instead of going to whichever small request comes first, and an empty
// node is kept for the large request whose turn it is.
func (p *planner) holdLarge(plan *Plan) {
	if p.opt.ReserveAfter <= 0 {
		return
	}
	// The most GPUs free on a node that runs something: a request asking
	// for more can only go to an empty node.
	maxPartial := 0
	for _, n := range p.nodes {
		if n.usedGPU > 0 && n.reservedFor == "" && n.view.Cordon == nil {
			maxPartial = max(maxPartial, n.freeGPUs)
		}
	}
	p.entitle(maxPartial)
	// Candidates in the order priority, team (teams.go), owner's weighted
	// share, age, id (a total order): each owner's requests of a
	// priority by age, as byAge sorted them once for the holds and the
	// order both, and the owners' groups merged by their heads
	// (holdQueue). An owner whose budget is spent leaves the merge with
	// the rest of its requests unread.
	q := p.holdQueue()
	fitting := map[shape]bool{} // single-part shapes seen to fit a node (fitsMemo)
	for q.Len() > 0 {
		g := q.groups[0]
		e, idx, aged, more := g.pop()
		// The holds and budgets of e's owner.
		oh := g.own
		if !aged { // a young request, read only to claim (claim.go)
			p.claimYoung(q, more, e, oh, g.rec, maxPartial)
			continue
		}
		// e holds nothing yet (the merge reads each request once, and
		// only holdFor below makes holds here): mayHoldAged's look-up of
		// what it holds, by its id, is left out.
		if !oh.mayHold() || oh.claimsSpent() {
			// Its owner's budget is spent (every candidate is aged and
			// holds nothing yet): so it is for the rest of the pass.
			heap.Pop(q)
			continue
		}
		if p.fitsPlain(e, idx, oh, g, maxPartial, fitting) {
			// Most of a deep backlog's requests: small ones that fit
			// now, of shapes seen to fit, which the path below lets go
			// on too (fitsMemo), here without reading the entry (10,200
			// of the 13,300 requests the merge reads at 2,000 owners).
			// So do the group's next requests that are aged and as
			// plain, of shapes seen to fit: read here, at once, rather
			// than each at its turn in the merge. Nothing they do
			// changes, as they do nothing: fitting only grows in the
			// pass, and an owner's budget once spent stays spent (then
			// its group leaves the merge at its next request, as it
			// would have at one of these).
			for more && p.agedKey(&g.keys[0]) && p.fitsPlain(g.keys[0].it.Entry, g.keys[0].idx, oh, g, maxPartial, fitting) {
				_, _, _, more = g.pop()
			}
			fixHead(q, more)
			continue
		}
		fixHead(q, more)
		reqs := partsOf(e)
		large := largeReq(e, maxPartial)
		if large && p.keepsAhead() && smallReq(e, p.whole) && p.fitsMemo(e, reqs, oh, g.rec, fitting) {
			// Half a machine or less that fits only an empty node now: it
			// holds none. A hold there would only place it ahead of its
			// turn in the fair order, each a whole machine, while it
			// starts at its turn on any node that has its GPUs free.
			// Where the cluster is full but for empty nodes, an owner
			// whose 1-GPU requests had aged held one empty node each
			// (short-8-long-1: 25 of a pass's 30, which the owner of
			// 8-GPU requests below its share then waited beside). From
			// 20 nodes, as claims and the standing reserve: below, where
			// neither runs, such holds are what keeps an empty node for
			// a small request of an owner below its share (at 16 nodes
			// without them 92 of the suite's 96 runs missed a goal
			// against 89, weights-3:1's Jain's least 0.69–0.77).
			continue
		}
		if !large {
			if p.claimable(e, oh) && p.claimFit(e, oh, g.rec) { // claim.go
				continue
			}
			if p.fitsMemo(e, reqs, oh, g.rec, fitting) {
				continue
			}
		}
		p.holdFor(e, reqs, plan)
	}
}

// fitsPlain reports whether e, the request at idx in the snapshot's
// queue, of the owner whose holds are oh and whose group in the holds'
// merge is g, is of a plain shape (plainFitKey) seen to fit a node this
// pass (fitting, as fitsMemo fills it). It does not read e but where a
// test checks plainFitKey (plainFitKeyCheck).
func (p *planner) fitsPlain(e *state.QueueEntry, idx int, oh *ownerHolds, g *holdGroup, maxPartial int, fitting map[shape]bool) bool {
	fitKey, ok := p.plainFitKey(idx, oh, g, maxPartial)
	if !ok {
		return false
	}
	if plainFitKeyCheck != nil {
		pt := p.partWith(e, partsOf(e), 0, oh, g.rec)
		plainFitKeyCheck(fitKey, shapeOf(&pt))
	}
	return fitting[fitKey]
}

// fixHead restores the merge's order after its first group's head was
// read: the group leaves where none of its requests is left (more
// false), else it moves to its place by its new head.
func fixHead(q *holdGroups, more bool) {
	if !more {
		heap.Pop(q)
	} else {
		heap.Fix(q, 0)
	}
}

// plainFitKey is, for the request at idx in the snapshot's queue, of the
// owner whose holds are oh and whose group in the holds' merge is g, the
// key fitsMemo would look up, made from the facts byAge copied out
// (tailIn) rather than from its entry; ok is false where those facts do
// not settle the key or fitsMemo would not be asked: a request pinned,
// elastic, with workers or on several machines, of a shape beyond its
// numbers (a model, profile, selector or fraction), needing an empty
// node, or whose owner claims. TestPlainFitKeyMatchesShape holds it to
// shapeOf(partWith(…)).
func (p *planner) plainFitKey(idx int, oh *ownerHolds, g *holdGroup, maxPartial int) (shape, bool) {
	in := &p.buf.tailIns[idx]
	if !in.path || !in.plain || !in.oneNode || oh.claims || p.facts[idx].largest > maxPartial {
		return shape{}, false
	}
	n := in.nums
	n.below = g.below
	if backfill, ends := p.probeEnds(in.maxRuntime, oh.budget > 0, n.gpus, g.rec); backfill {
		n.ends = ends.UnixNano()
	}
	return shape{numbers: n}, true
}

// plainFitKeyCheck, set only by TestPlainFitKeyMatchesShape (never
// while plans are made for real), is called with each key plainFitKey
// makes and the one fitsMemo would make of the same request.
var plainFitKeyCheck func(fast, slow shape)

// fitsMemo is fits, remembered in fitting for single-part shapes seen to
// fit: past the first, a backlog's thousands of requests of one shape
// cost no search. oh and rec are e's owner's holds and run-time record,
// which its shape reads (partWith).
func (p *planner) fitsMemo(e *state.QueueEntry, reqs []state.Resources, oh *ownerHolds, rec *state.RuntimeRecord, fitting map[shape]bool) bool {
	if len(reqs) != 1 {
		return p.fits(e)
	}
	pt := p.partWith(e, reqs, 0, oh, rec)
	k := shapeOf(&pt)
	if fitting[k] {
		return true
	}
	if p.fits(e) {
		fitting[k] = true
		return true
	}
	return false
}

// fits reports whether every part of e finds a node now, each on its own.
func (p *planner) fits(e *state.QueueEntry) bool {
	reqs := partsOf(e)
	var exclude map[string]bool
	for i := range reqs {
		pt := p.partOf(e, reqs, i)
		n, _, _, _ := p.best(pt, exclude)
		if n == nil {
			return false
		}
		if exclude == nil {
			exclude = map[string]bool{}
		}
		exclude[n.name] = true
	}
	return true
}

// holdFor reserves, for e, the nodes closest to fitting each part
// (closest), so that later requests in
// the order cannot take their free capacity, and counts e's GPUs against
// its owner's hold budget.
func (p *planner) holdFor(e *state.QueueEntry, reqs []state.Resources, plan *Plan) {
	used := map[string]bool{}
	// Beyond its budget (an owner at or above its fair share, which holds
	// on its charge budget), what the hold keeps idle counts as the
	// owner's in the order until the request is placed: its own younger
	// requests, not other owners', pay for the drain.
	oh := p.ownerHoldsFor(e.Owner)
	charged := oh.budget <= 0
	for i := range reqs {
		pt := &part{req: &reqs[i], id: e.Session, owner: e.Owner}
		best := p.closest(pt, used)
		if best == nil {
			continue
		}
		best.reservedFor, best.reservedWhat = e.Session, describe(pt.req)
		best.drainBy = drainBy(best, p.snap.Now)
		p.holds[e.Session] = true
		if p.holding == nil {
			p.holding = pooledMap(&p.buf.maps.holding, p.owners)
		}
		if p.charged == nil {
			p.charged, p.charge = pooledMap(&p.buf.maps.charged, p.owners), pooledMap(&p.buf.maps.charge, p.owners)
		}
		if len(p.holding[e.Session]) == 0 {
			p.holdGen++
			oh.holders++
			if wholeParts(e, p.whole) == 0 {
				p.smallHolds++
			}
			oh.gpus += requestGPUs(e, p.usage.shareRef)
		}
		if charged {
			p.charge[e.Session] += 1000 * int64(best.freeGPUs) // thousandths, as usage amounts
			p.charged[e.Owner] += 1000 * int64(best.freeGPUs)
			p.teams.charge(e.Team, 1000*int64(best.freeGPUs)) // and its team's (teams.go)
		}
		p.holding[e.Session] = append(p.holding[e.Session], best)
		used[best.name] = true
		plan.Reserved[best.name] = e.Session
	}
}

// unhold lets go of n's hold (a holder placed, a pinned session bound, or
// a node a holder placed elsewhere left to the reserve), and takes n off
// the plan's reserved nodes; the rankings' searches read their held heads
// again (ranking.held).
func (p *planner) unhold(n *nodeState, plan *Plan) {
	n.reservedFor = ""
	delete(plan.Reserved, n.name)
	p.letGo++
}

// closest is the node not yet reserved, not cordoned and not in used that
// could hold pt when empty and will have room for it soonest: for whole
// GPUs of any model, by its sessions' max runtimes (soonest); otherwise,
// or among equals, the one with the most of its devices free (the first by
// name among equals). nil if none.
func (p *planner) closest(pt *part, used map[string]bool) *nodeState {
	m := &modelMatcher{pattern: pt.req.GPUModel} // one pattern over every node (modelmatch.go)
	ok := func(n *nodeState) bool {
		// The checks that read no map first: a scan passes over most
		// nodes, held ones and those with none of the kind asked for.
		if n.reservedFor != "" || n.view.Cordon != nil || pt.req.GPUs > 0 && n.lacksKind(pt.req) {
			return false
		}
		if used[n.name] || p.claimed(n) || filterLabels(pt, n) != nil {
			return false
		}
		return pt.req.GPUs == 0 || n.capacityDevicesWith(pt.req, m) >= pt.req.GPUs
	}
	r := pt.req
	if r.GPUs > 0 && r.MIGProfile == "" && r.GPUModel == "" && r.GPUMemoryMiB == 0 && !r.Fraction() {
		// Whole GPUs of any model: the node that has them free soonest
		// by its sessions' max runtimes (drain.go).
		return p.soonest(r.GPUs, pt.owner, true, ok)
	}
	var best *nodeState
	bestFree := -1
	whole := r.MIGProfile == "" && !r.Fraction() && !modelScanReference
	for _, n := range p.nodesOf(pt.req) {
		if whole && n.freeGPUs <= bestFree {
			// Whole GPUs free of r's kind are at most the node's free
			// whole GPUs: it cannot beat the best (modelmatch.go).
			continue
		}
		if !ok(n) {
			continue
		}
		if f := n.freeDevicesWith(r, m); f > bestFree {
			best, bestFree = n, f
		}
	}
	return best
}

// heldMessage is the reason of a request that waits holding nodes: which
// nodes, how much of each is free, and why it may hold them, in the words
// of issue 34 ("node gpu-17 is held for your 8-GPU request since 14:02; 5
// of 8 GPUs free").
//
// It is written piece by piece into one buffer, not by fmt: every
// request holding nodes gets one a pass (1,735 at 2,000 owners, where
// fmt's were 5% of the pass).
func (p *planner) heldMessage(e *state.QueueEntry, reqs []state.Resources, held []*nodeState) string {
	count := 0
	for _, n := range held {
		if n.reservedFor == e.Session {
			count++
		}
	}
	what := describe(&reqs[0])
	if count == 0 {
		return "waiting for " + what
	}
	// A constant capacity, enough for a request holding two nodes, keeps
	// the buffer on the stack (one sized by count was allocated, then
	// copied into the string: 11% of the bytes a pass allocated at 2,000
	// owners); a longer message grows it as append does.
	b := make([]byte, 0, 768)
	b = append(b, "waiting for "...)
	b = append(b, what...)
	b = append(b, ": node"...)
	if count > 1 {
		b = append(b, 's')
	}
	b = append(b, ' ')
	first := true
	for _, n := range held {
		if n.reservedFor != e.Session {
			continue
		}
		if !first {
			b = append(b, ", "...)
		}
		first = false
		b = append(b, n.name...)
		b = append(b, " ("...)
		b = strconv.AppendInt(b, int64(n.freeGPUs), 10)
		b = append(b, " of "...)
		b = strconv.AppendInt(b, int64(n.totalGPU), 10)
		b = append(b, " GPUs free, the rest draining as its sessions end"...)
		b = p.appendExpectedRoom(b, n, reqs[0].GPUs)
		b = append(b, ')')
	}
	after := p.holdAfter(e)
	b = append(b, " held for it, nothing else placed there (it may hold nodes since "...)
	b = e.Created.Add(after).UTC().AppendFormat(b, "15:04")
	b = append(b, " UTC, "...)
	b = append(b, after.Round(time.Second).String()...)
	b = append(b, " after it was queued, "...)
	// An owner at or above its share holds on its charge budget, or for
	// one request at a time (entitle): its held GPUs idle count as its
	// own (holdFor), and the message says so rather than that it is owed.
	if p.ownerHoldsOf(e.Owner).budget <= 0 {
		b = append(b, "though its owner holds its fair share of the cluster or more: the GPUs kept idle here count as its owner's in the fair order until it starts"...)
	} else {
		b = append(b, "while its owner holds less than its fair share of the cluster"...)
	}
	b = append(b, ')')
	return string(b)
}

// appendExpectedRoom appends to b when held node n is expected to have
// want GPUs free (readyBy), and from what: ", room expected by 15:10 UTC
// by its sessions' max runtimes" (or "… and their owners' recent run
// times" where an estimate counted); nothing where some session needed
// has no max runtime.
func (p *planner) appendExpectedRoom(b []byte, n *nodeState, want int) []byte {
	at, known := p.readyBy(n, want)
	if !known || !at.After(p.snap.Now) {
		return b
	}
	how := "its sessions' max runtimes"
	if expectsAfter(n.view.Ledger.Allocations, p.snap.Now) || expectsAfter(n.proposed, p.snap.Now) {
		how = "its sessions' max runtimes and their owners' recent run times"
	}
	b = append(b, ", room expected by "...)
	b = at.UTC().AppendFormat(b, "15:04")
	b = append(b, " UTC by "...)
	return append(b, how...)
}

// expectsAfter reports whether any of allocs is expected, by its owner's
// recent run times, to end after now (Allocation.Expects).
func expectsAfter(allocs map[string]state.Allocation, now time.Time) bool {
	for _, a := range allocs {
		if a.Expects != nil && a.Expects.After(now) {
			return true
		}
	}
	return false
}

// endsOf is when e ends if it starts now, as planned and at the latest:
// the plan's clock plus its owner's recent run time of its size
// (expected, estimate) where that is shorter than its max runtime, and
// the plan's clock plus its max runtime (bound); both zero if it has no
// max runtime: a session that may run for ever is never counted on to
// end, however short its owner's last ones were.
func (p *planner) endsOf(e *state.QueueEntry) (expected, bound time.Time) {
	return p.endsBy(e, p.snap.Runtimes[e.Owner])
}

// endsBy is endsOf with rec as e's owner's run-time record.
func (p *planner) endsBy(e *state.QueueEntry, rec *state.RuntimeRecord) (expected, bound time.Time) {
	if e.MaxRuntime <= 0 {
		return time.Time{}, time.Time{}
	}
	return p.snap.Now.Add(endAfter(e.MaxRuntime, estimateOf(e, rec))), p.snap.Now.Add(time.Duration(e.MaxRuntime))
}

// endAfter is how long after the plan's clock a session of max runtime
// limit (above zero) is expected to end, its owner's estimate for its
// size est given (0: none): est where that is shorter, else limit. endsBy
// and the tail's probes (probeEnds) both read it.
func endAfter(limit state.Duration, est time.Duration) time.Duration {
	if est > 0 && est < time.Duration(limit) {
		return est
	}
	return time.Duration(limit)
}

// plannedEnd is endsOf's expected end alone.
func (p *planner) plannedEnd(e *state.QueueEntry) time.Time {
	at, _ := p.endsOf(e)
	return at
}

// estimate is how long e is expected to hold its GPUs by its owner's
// recent finished sessions of its size (state.RuntimeRecord.Estimate);
// zero where the snapshot has none.
func (p *planner) estimate(e *state.QueueEntry) time.Duration {
	return estimateOf(e, p.snap.Runtimes[e.Owner])
}

// estimateOf is estimate with rec as e's owner's record.
func estimateOf(e *state.QueueEntry, rec *state.RuntimeRecord) time.Duration {
	if rec == nil {
		return 0
	}
	// Every part's GPUs together, as state.SessionGPUs counts the
	// attempts the record learned from.
	return rec.Estimate(e.Request.GPUs + e.Workers*e.WorkerResources().GPUs)
}

// expectsOf is the Allocation.Expects of a part: its planned end where
// that is before its bound, else nil.
func expectsOf(pt *part) *time.Time {
	if pt.ends.Before(pt.bound) {
		at := pt.ends
		return &at
	}
	return nil
}

// planEnd is when the planner counts on a to end, seen at now: its
// expected end while that is still ahead (a session past it is taken to
// run to its bound, as one that runs long usually runs longer), else its
// max runtime's; zero if it has no max runtime. A zero now reads the
// bound alone.
func planEnd(a *state.Allocation, now time.Time) time.Time {
	if a.Expects != nil && !now.IsZero() && a.Expects.After(now) {
		return *a.Expects
	}
	return a.Ends
}

// drainBy is when every session on n (in its ledger, or proposed in this
// pass) has ended as planned at now (planEnd): the latest of their ends;
// zero if some session has no max runtime, or n runs nothing.
func drainBy(n *nodeState, now time.Time) time.Time {
	var latest time.Time
	for _, allocs := range []map[string]state.Allocation{n.view.Ledger.Allocations, n.proposed} {
		for _, a := range allocs {
			end := planEnd(&a, now)
			if end.IsZero() {
				return time.Time{}
			}
			if end.After(latest) {
				latest = end
			}
		}
	}
	return latest
}

// mayBackfill reports whether e, of the owner whose holds are oh, may
// backfill: it has a max runtime and its owner is below its fair share
// (has a hold budget). A max runtime is an upper bound, most sessions end
// well before it, so a node filled to its drain time drains later than
// it would have, and only an owner below its share may take that from
// the holder.
func (oh *ownerHolds) mayBackfill(e *state.QueueEntry) bool {
	return e.MaxRuntime > 0 && oh.budget > 0
}

// backfills reports whether part pt may run on n although n is held for
// another request: pt may backfill, n drains by a known time, and pt ends
// by then.
func backfills(pt *part, n *nodeState) bool {
	return backfillsBy(pt, n.drainBy)
}

// backfillsBy reports whether part pt may run on a node held for another
// request that drains by drain (zero: not known): pt may backfill and
// ends by then.
func backfillsBy(pt *part, drain time.Time) bool {
	return pt.backfill && !drain.IsZero() && !pt.ends.IsZero() && !pt.ends.After(drain)
}

// holdQueue is the aged requests that are not pinned, grouped by
// priority, team and owner, for holdLarge to read in order: the age
// groups of byAge, each read from its oldest request on, passing over
// what holds nothing (pinned sessions, and young requests of an owner
// that does not claim).
func (p *planner) holdQueue() *holdGroups {
	tkeys := map[string]teamKey{}
	ages := p.byAge()
	q := &holdGroups{groups: make([]*holdGroup, 0, len(ages))}
	p.buf.holdGroups = resized(p.buf.holdGroups, len(ages)) // one array, kept between passes
	all := p.buf.holdGroups
	for i, ag := range ages {
		k := ag.key
		own := p.ownerHoldsFor(k.owner) // the one holdFor adds to
		g := &all[i]
		*g = holdGroup{prio: k.prio, keys: ag.keys, own: own, claims: own.claims, rec: p.snap.Runtimes[k.owner], below: p.reserveOwners[k.owner], p: p}
		if !g.skip() {
			continue
		}
		g.share, _ = p.weightedShare(k.owner)
		if p.teams != nil {
			tk, ok := tkeys[k.team+"\x00"+k.model]
			if !ok {
				tk = p.teams.keyOfModel(k.team, k.model, teamKey{}) // teammodels.go
				tkeys[k.team+"\x00"+k.model] = tk
			}
			g.tkey = tk
		}
		q.groups = append(q.groups, g)
	}
	heap.Init(q)
	return q
}

type holdKey struct {
	prio  int
	team  string
	owner string
	model string // the request's guaranteed model key (teammodels.go)
}

// holdGroup is one owner's aged requests of one priority, oldest first:
// its age group (byAge) from keys[0] on, less what skip passes over.
type holdGroup struct {
	prio  int
	tkey  teamKey // the team's keys (teams.go); empty without teams
	share float64
	keys  []ageKey
	// own is the owner's holds and budgets (every request of a group is
	// one owner's); claims is whether its young requests are read too,
	// to claim (ownerHolds.claims).
	own    *ownerHolds
	claims bool
	// rec is the owner's run-time record (Snapshot.Runtimes), for its
	// requests' parts (partWith); below whether it may take the
	// standing reserve (part.below, as the pass stands at holdQueue).
	rec   *state.RuntimeRecord
	below bool
	p     *planner
	// headSec and headNsec are keys[0]'s time, which skip copies beside
	// the share: the merge compares groups without reading their keys
	// but where the times tie (as ownerQueue's head).
	headSec  int64
	headNsec int32
}

// skip passes over the requests at the group's head that hold nothing:
// pinned ones, and young ones unless the owner claims. It reports
// whether a request is left.
func (g *holdGroup) skip() bool {
	for len(g.keys) > 0 {
		k := &g.keys[0]
		if !g.p.facts[k.idx].pinned && (g.claims || g.p.agedKey(k)) {
			g.headSec, g.headNsec = k.sec, k.nsec
			return true
		}
		g.keys = g.keys[1:]
	}
	return false
}

// pop takes the group's oldest request, with its index in the
// snapshot's queue and whether it is past its hold delay (agedKey: its
// entry is not read for it); more reports whether another is left.
func (g *holdGroup) pop() (e *state.QueueEntry, idx int, aged, more bool) {
	k := &g.keys[0]
	e, idx, aged = k.it.Entry, k.idx, g.p.agedKey(k)
	g.keys = g.keys[1:]
	return e, idx, aged, g.skip()
}

// holdGroups merges groups by their oldest requests: higher priority
// first, then the team first in the tree's order, then the smaller
// weighted share, then the older head.
type holdGroups struct{ groups []*holdGroup }

func (q *holdGroups) Len() int { return len(q.groups) }
func (q *holdGroups) Less(i, j int) bool {
	a, b := q.groups[i], q.groups[j]
	if a.prio != b.prio {
		return a.prio > b.prio
	}
	if len(a.tkey.keys) > 0 || len(b.tkey.keys) > 0 { // without teams both are empty: equal
		if c := compareKeys(a.tkey, b.tkey); c != 0 {
			return c < 0
		}
	}
	if a.share != b.share {
		return a.share < b.share
	}
	if a.headSec != b.headSec || a.headNsec != b.headNsec {
		return a.headSec < b.headSec || a.headSec == b.headSec && a.headNsec < b.headNsec
	}
	return olderFirstKey(a.keys[0], b.keys[0]) < 0
}
func (q *holdGroups) Swap(i, j int) { q.groups[i], q.groups[j] = q.groups[j], q.groups[i] }
func (q *holdGroups) Push(x any)    { q.groups = append(q.groups, x.(*holdGroup)) }
func (q *holdGroups) Pop() any {
	old := q.groups
	x := old[len(old)-1]
	q.groups = old[:len(old)-1]
	return x
}
