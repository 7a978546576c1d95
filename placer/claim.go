package placer

import "github.com/voyager-gpu/voyager/state"

// Claims (issue 34). holdLarge reads the aged requests in the fair order
// (priority, weighted share, age) and lets those that fit no node hold
// the nodes closest to fitting them. A request that fits a node now held
// nothing, so the holds of owners after it in that order, above their
// share, could take the very node it fits on; it then found no room at
// its turn, and held a node later in the drain order than theirs. Under
// spread in a flood (flood-drain and two-floods at 200 nodes) this was
// the flooder's main source of whole machines: a below-share owner's
// 4-GPU request held a node until it had drained to 4 free GPUs, then
// fitted there, and the flooder's 8-GPU hold took it (about a third of
// its 8-GPU starts in flood-drain, spread, seed 3), while the request
// started over on a node still full.
//
// So a request of an owner below its fair share that fits now claims the
// GPUs it would take (the node its strategy picks, beside what earlier
// requests claimed): no hold read after it takes a node with claimed
// GPUs, and the next request of the owner is checked beside the claims,
// so a second one that would only fit on the same GPUs holds a node of
// its own instead of counting as fitting. A claim reserves nothing for
// the order: at their turn, requests go where the strategy puts them, as
// before. Claims count against the owner's hold budget in holdLarge (what
// fits now is GPUs the owner gets this pass), which bounds the searches
// they cost as holds are bounded.

// claimState is the claims of one pass.
type claimState struct {
	// gpus is the GPUs claimed on each node.
	gpus map[*nodeState]int
	// short is, for a request of g whole GPUs, the nodes whose unclaimed
	// free GPUs are fewer than g (best's exclude).
	short map[int]map[string]bool
	// owners is the GPUs each owner's fitting requests claimed.
	owners map[string]int64
	// miss memoises shapes that fit no node beside the claims: claims and
	// holds only take capacity within a pass.
	miss map[shape]bool
}

// claimBelow is the part of its fair share under which an owner's
// fitting requests claim: an owner near its share (Jain's index over
// owners at 0.8 and above their shares, against one owner at 1.3, is
// still 0.96) leaves drained nodes to the holds after it, so an owner
// above its share still starts its large requests.
const claimBelow = 0.8

// claimable reports whether e is a request whose fit holdLarge claims: a
// single part of whole GPUs of any model, of an owner holding less than
// claimBelow of its fair share, on a cluster of at least 20 nodes (below
// that, as for the standing reserve, one node is over 5% of the GPUs,
// and a drain lost by the holds after a claim cost more than the claim
// won: placer/README.md), while the owner's claims and holds are below
// its hold budget (what it is owed; this also bounds the searches).
func (p *planner) claimable(e *state.QueueEntry) bool {
	if len(p.nodes) < 20 {
		return false
	}
	b := p.holdBudget[e.Owner]
	if b <= 0 || p.holdGPUs[e.Owner]+p.claims.owners[e.Owner] >= b {
		return false
	}
	var held int64
	if a := p.quota.users[e.Owner]; a != nil {
		held = a.gpus
	}
	r := &e.Request
	return float64(held) < claimBelow*float64(held+b) && e.Workers == 0 && e.Nodes <= 1 && r.GPUs > 0 &&
		r.MIGProfile == "" && r.GPUModel == "" && r.GPUMemoryMiB == 0 && !r.Fraction()
}

// claimFit reports whether e (claimable) fits a node beside the GPUs
// earlier requests claimed; if it does, it claims the GPUs it would take
// on the node its strategy picks.
func (p *planner) claimFit(e *state.QueueEntry) bool {
	c := &p.claims
	if c.gpus == nil {
		*c = claimState{gpus: map[*nodeState]int{}, short: map[int]map[string]bool{}, owners: map[string]int64{}, miss: map[shape]bool{}}
	}
	pt := p.partOf(e, e.Parts(), 0)
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
	for s := before - g + 1; s <= before; s++ {
		if c.short[s] == nil {
			c.short[s] = map[string]bool{}
		}
		c.short[s][n.name] = true
	}
	c.owners[e.Owner] += requestGPUs(e, p.usage.shareRef)
	return true
}

// claimsSpent reports whether e's owner, below its fair share, has
// claimed and held in holdLarge all its hold budget allows.
func (p *planner) claimsSpent(e *state.QueueEntry) bool {
	b := p.holdBudget[e.Owner]
	return b > 0 && p.claims.owners[e.Owner] > 0 && p.holdGPUs[e.Owner]+p.claims.owners[e.Owner] >= b
}

// claimed reports whether some request claimed GPUs on n in this pass:
// no hold takes it.
func (p *planner) claimed(n *nodeState) bool {
	return p.claims.gpus[n] > 0
}
