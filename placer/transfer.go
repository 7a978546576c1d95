package placer

import (
	"fmt"
	"slices"
)

// Transfer (issue 34). A hold drains the node that has a whole machine
// free soonest, and where the owners below their fair share ask only for
// whole machines, that is another such owner's single whole-machine
// session, never a node of an owner above its share running many small
// sessions: those refill a GPU as soon as one frees. The holds then only
// move whole machines among the owners below their share, and an owner
// above it keeps its excess for hours (four-8-users-and-flood in
// placer/README.md: the flood at 1.4 times its share, Jain's least
// 0.78–0.88).
//
// So, beside the holds, the planner drains nodes that run only sessions
// of owners above their fair share, as many as whole machines of the
// lesser of what those owners hold beyond their share and what the
// owners below it wait for in large requests, less the nodes of such
// owners already held or kept: the excess moves to those owed it, a node
// at a time, as its sessions end. They are kept as the standing
// reserve's nodes are (reserveMark): only a whole-machine request of an
// owner below its share takes one, at its turn in the fair order, and
// work that ends by its max runtime before the node drains may run there
// meanwhile (backfill). The holds keep taking the nodes that free
// soonest, so a burst of whole-machine requests waits no longer than
// before.
//
// What it costs: a node drains only as its last session ends, and its
// freed GPUs idle until then, while the owners above their share wait.
// At most a twentieth of the nodes drain so (transferShare).

// transferShare bounds the nodes kept for transfer: at most one node in
// transferShare, counting those the holds and the reserve already keep
// of owners above their share.
const transferShare = 10

// transferReserve keeps, after the holds and the standing reserve, the
// nodes that transfer drains (see above).
func (p *planner) transferReserve(plan *Plan) {
	if !p.keepsAhead() || !p.on(RuleTransfer) || p.whole == 0 || p.reserveOwners == nil {
		return
	}
	whole := p.whole
	large := p.buf.maps.large // entitle's: GPUs each owner waits for in large requests
	// In thousandths of a GPU, as usage amounts and budgets.
	var excess, owed int64
	above := map[string]bool{}
	for o, oh := range p.holdOwners {
		switch {
		case !oh.entitled:
		case oh.budget < 0:
			excess -= oh.budget
			above[o] = true
		case p.reserveOwners[o]:
			owed += min(oh.budget, large[o])
		}
	}
	if len(above) == 0 {
		return
	}
	want := int(min(excess, owed) / (1000 * int64(whole)))
	want = min(want, len(p.nodes)/transferShare)
	if want <= 0 {
		return
	}
	// Nodes of owners above their share only, ranked as a hold's search
	// ranks them (soonest by max runtimes); those already kept count
	// against want.
	var cands []readyRank
	for _, n := range p.nodes {
		if n.totalGPU < whole || n.view.Cordon != nil || n.usedGPU == 0 || !p.onlyOf(n, above) {
			continue
		}
		if n.reservedFor != "" {
			want--
			continue
		}
		cands = append(cands, p.rankOf(n, whole, ""))
	}
	if want <= 0 || len(cands) == 0 {
		return
	}
	slices.SortFunc(cands, func(a, b readyRank) int {
		if a.before(b) {
			return -1
		}
		if b.before(a) {
			return 1
		}
		return 0
	})
	what := fmt.Sprintf("%d-GPU requests of owners below their fair share: others hold %d GPUs beyond theirs, so nodes running only their sessions drain for those owed them",
		whole, excess/1000)
	for _, c := range cands[:min(want, len(cands))] {
		c.n.reservedFor, c.n.reservedWhat = reserveMark, what
		c.n.drainBy = drainBy(c.n, p.snap.Now)
	}
}

// onlyOf reports whether every session on n is of an owner in owners.
func (p *planner) onlyOf(n *nodeState, owners map[string]bool) bool {
	for _, a := range n.view.Ledger.Allocations {
		if !owners[a.Owner] {
			return false
		}
	}
	for _, a := range n.proposed {
		if !owners[a.Owner] {
			return false
		}
	}
	return true
}
