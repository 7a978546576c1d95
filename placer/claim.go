package placer

import (
	"container/heap"

	"github.com/voyager-gpu/voyager/state"
)

// Claims (issue 34). holdLarge reads the aged requests in the fair order
// (priority, weighted share, age) and lets those that fit no node hold
// the nodes closest to fitting them. A request that fits a node now held
// nothing, so the holds of owners after it in that order, above their
// share, could take the very node it fits on; it then found no room at
// its turn, and held a node later in the drain order than theirs. Under
// spread in a flood (flood-drain and two-floods at 200 nodes) this was
// the flooder's main source of whole machines: a below-share owner's
// 4-GPU request held a node until it had drained to 4 free GPUs, then
// fitted there, and the flooder's 8-GPU hold took it (flood-drain,
// spread, seed 3: 19 of the flooder's 43 8-GPU starts in the passes below
// the Jain goal), while the request started over on a node still full.
//
// So a request of an owner well below its fair share (under claimBelow
// of it) that fits now claims the GPUs it would take (on the node its
// strategy picks, beside what earlier requests claimed), and no hold read
// after it takes a node with claimed GPUs. Such an owner's requests claim
// before they are aged as well (claimYoung): a newcomer's first requests
// (two-floods' second flooder) would otherwise find the GPUs free at its
// arrival inside the holds of the owners above their share. A request
// that fits only on GPUs claimed already is taken as fitting, as before
// claims. A claim reserves nothing for the order: at their turn requests
// go where the strategy puts them. Claims count against the owner's hold
// budget in holdLarge (what fits now is GPUs the owner gets this pass),
// which bounds the searches they cost as holds are bounded.
//
// On fewer than 20 nodes only a newcomer claims (an owner holding less
// than newcomerBelow of its share): at 16 nodes, where a node is 6% of
// the cluster, the drains that claims by every owner below claimBelow
// took from the owners above their share put 19 of the suite's 66 runs
// below TestSuiteGoals' floors (placer/README.md). And there a claim
// keeps holds off its node only where its request could not backfill
// them (yields): where it ends before the node drains, the hold takes
// the node it drains soonest and the claiming request runs there
// beside it.
//
// What claims cost: the owner above its share starts fewer large
// requests while the others are well below theirs, since the nodes that
// drain are theirs first (flood-drain with spread at 200 nodes, when
// claims came: the flooder's 8-GPU p99 rose from 226–234 to 542–655
// minutes, before spread packed a backlog).

// claimState is the claims of one pass.
type claimState struct {
	// gpus is the GPUs claimed on each node.
	gpus map[*nodeState]int
	// short is, for a request of g whole GPUs, the nodes whose unclaimed
	// free GPUs are fewer than g (best's exclude).
	short map[int]map[string]bool
	// miss memoises shapes that fit no node beside the claims: claims and
	// holds only take capacity within a pass.
	miss map[shape]bool
	// blocks marks the nodes where some claim keeps holds off: all of
	// them with claimed GPUs, but where claims yield (yields), only those
	// with a claim its request could not backfill.
	blocks map[*nodeState]bool
}

// claimBelow is the part of its fair share under which an owner's
// requests claim: an owner near its share leaves drained nodes to the
// holds after it, so that an owner above its share still starts some of
// its large requests (Jain's index over two owners at 0.9 of their
// shares and one at 1.2 is still 0.98). At 0.8, weights-3:1 with spread
// at 200 nodes still fell to 0.932 (the light user sat between 0.8 and
// 0.9 of its share for an hour, its 4-GPU requests' nodes taken by the
// heavy user's holds); at 0.9, 0.976–0.981.
const claimBelow = 0.9

// claimable reports whether e is a request whose fit holdLarge claims: a
// single part of whole GPUs of any model, of an owner whose requests
// claim (claimOwner), while the owner's claims and holds are below its
// hold budget (what it is owed; this also bounds the searches).
func (p *planner) claimable(e *state.QueueEntry, oh *ownerHolds) bool {
	if !oh.claims || oh.claimsSpent() {
		return false
	}
	r := &e.Request
	return e.Workers == 0 && e.Nodes <= 1 && r.GPUs > 0 && r.MIGProfile == "" && r.GPUModel == "" && r.GPUMemoryMiB == 0 && !r.Fraction()
}

// claimOwner reports whether the fitting requests of the owner whose
// budgets are oh, holding held GPUs, claim: holds are on, and it holds
// less than claimBelow of its fair share (it has a hold budget) on a
// cluster of at least 20 nodes, less than newcomerBelow of it on a
// smaller one (below 20, as for the standing reserve, one node is over
// 5% of the GPUs, and a drain lost by the holds after a claim cost more
// than the claim won: placer/README.md). entitle asks, once a pass
// (ownerHolds.claims).
func (p *planner) claimOwner(oh *ownerHolds, held int64) bool {
	if p.opt.ReserveAfter <= 0 || !p.on(RuleClaims) {
		return false
	}
	b := oh.budget
	if b <= 0 {
		return false
	}
	if !p.keepsAhead() {
		return float64(held) < newcomerBelow*float64(held+b)
	}
	return float64(held) < claimBelow*float64(held+b)
}

// newcomerBelow is the part of its fair share under which an owner's
// requests claim on a cluster of fewer than 20 nodes: a newcomer, or an
// owner whose sessions have all but ended. There claims are a newcomer's
// answer to the holds alone. On a full small cluster each GPU that frees
// went to the hold of an owner above its share whose requests had aged
// (on its charge budget, hold.go), while the newcomer's requests, younger
// than their hold delay, neither held nor claimed: it waited its first
// ReserveAfter with GPUs freeing beside it (TestNewcomerClaimsOnAFullCluster).
// Claims by every owner below claimBelow took the drains of the owners
// above their share all the time at 16 nodes (placer/README.md, "Tried
// and not kept"); a newcomer's claims end with its first sessions.
const newcomerBelow = 0.1

// yields reports whether claims in this pass keep holds only off nodes
// where some claim could not backfill the hold (claimState.blocks): below
// 20 nodes, where claims are a newcomer's. A claim whose request ends, by
// its max runtime, before the node drains (backfills) loses nothing to a
// hold there, and keeping the hold off sent the holder to a node that
// drains later (on two nodes, api's TestQueueViewPlansWithOwnersRunTimes:
// an 8-GPU request of an owner below its share held the node draining in
// two hours, not the one draining in one, for a 10-minute request's one
// GPU).
func (p *planner) yields() bool {
	return !p.keepsAhead()
}

// claimYoung reads e, a request not yet past its hold delay, in
// holdLarge's merge q (its owner's holds oh and run-time record rec): it
// holds nothing, but if its owner is far below
// its share and it fits now, it claims (a newcomer's requests, in the
// first passes after its arrival, would otherwise find the GPUs free on
// nodes taken by the holds of owners above their share). Once its
// owner's claims are spent the owner leaves the merge.
func (p *planner) claimYoung(q *holdGroups, more bool, e *state.QueueEntry, oh *ownerHolds, rec *state.RuntimeRecord, maxPartial int) {
	if !oh.claims || oh.claimsSpent() {
		heap.Pop(q)
		return
	}
	fixHead(q, more) // hold.go
	if !largeReq(e, maxPartial) && p.claimable(e, oh) {
		p.claimFit(e, oh, rec)
	}
}

// claimFit reports whether e (claimable; its owner's holds oh and
// run-time record rec) fits a node beside the GPUs earlier requests
// claimed; if it does, it claims the GPUs it would take
// on the node its strategy picks.
func (p *planner) claimFit(e *state.QueueEntry, oh *ownerHolds, rec *state.RuntimeRecord) bool {
	c := &p.claims
	if c.gpus == nil {
		*c = claimState{gpus: map[*nodeState]int{}, short: map[int]map[string]bool{}, miss: map[shape]bool{}, blocks: map[*nodeState]bool{}}
	}
	pt := &p.claimPart
	*pt = p.partWith(e, partsOf(e), 0, oh, rec)
	k := shapeOf(pt)
	if c.miss[k] {
		return false
	}
	g := pt.req.GPUs
	n, _, _, _ := p.best(pt, c.short[g])
	if n == nil {
		c.miss[k] = true
		return false
	}
	// The node no longer fits the sizes above what it has unclaimed
	// (larger sizes were excluded by earlier claims, or best refuses
	// them).
	before := n.freeGPUs - c.gpus[n]
	c.gpus[n] += g
	if !p.yields() || !backfillsBy(pt, p.drainOf(n)) {
		if c.blocks == nil {
			c.blocks = map[*nodeState]bool{}
		}
		c.blocks[n] = true
	}
	for s := before - g + 1; s <= before; s++ {
		if c.short[s] == nil {
			c.short[s] = map[string]bool{}
		}
		c.short[s][n.name] = true
	}
	oh.claimed += requestGPUs(e, p.usage.shareRef)
	return true
}

// claimsSpent reports whether the owner, below its fair share, has
// claimed and held in holdLarge all its hold budget allows.
func (oh *ownerHolds) claimsSpent() bool {
	return oh.budget > 0 && oh.claimed > 0 && oh.gpus+oh.claimed >= oh.budget
}

// claimed reports whether some request claimed GPUs on n in this pass
// that keep holds off it (claimState.blocks): no hold takes it.
func (p *planner) claimed(n *nodeState) bool {
	return p.claims.blocks[n]
}
