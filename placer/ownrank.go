package placer

// A hold's ranking for its owner (issue 34, NewPlan's cost at 2,000
// nodes). soonest walks the nodes in the order they free whole GPUs
// (rankReady) until the first whose place is unchanged for the hold; a
// node where the holder's owner's own sessions hold the GPUs asked for
// counts as unknown for that owner (ownGPUs), so it is "changed", and the
// walk goes past it. An owner asking only for 8-GPU sessions runs a whole
// node per session, whose one session's max runtime frees it soon: those
// nodes rank first, and every hold of that owner walked past all of them.
// At 2,000 nodes, in the suite's 8-only-vs-1-flood shape (binpack, seed
// 1, three simulated hours), 16,782 searches walked 6.4 million nodes, 4.4
// million of them the owner's own: 40% of NewPlan's CPU time, growing
// with the cluster (more of the owner's nodes, and more holds a pass).
//
// So a (size, owner) whose holds have walked more than twice the nodes
// in the pass gets its own ranking for the rest of it, made with the
// owner's view of each node (rankOf with the owner): its own nodes rank
// among the unknown, after every node whose time is known, and the walk
// stops at the first unchanged node as before. Making it costs a walk of
// every node and a sort, so only the pairs whose walks are long get one
// (at 2,000 nodes with seven owners holding for 1 to 8 GPUs, a ranking
// for every pair cost a fifth of BenchmarkNewPlanBacklog's pass).
// soonest's answer is the same either way: a node's place for an owner,
// as for anyone, only worsens as the pass proposes sessions, so the
// first node whose place is unchanged still beats every node after it in
// either ranking.

// ownRankKey is a ranking's size and owner.
type ownRankKey struct {
	want  int
	owner string
}

// ownRankReference, set only by TestOwnerRankingMatchesReference (never
// concurrently with other plans), makes soonest walk the ranking for
// anyone (rankReady) for every owner, as before ownrank.go: the reference
// that its plans are compared with.
var ownRankReference bool

// ownRankWalk is how many times the nodes in the pass a pair's searches
// walk before it gets its own ranking; a variable only so that
// TestOwnerRankingMatchesReference can make every pair's at once.
var ownRankWalk = 2

// ownRank is a (size, owner) pair's walk so far and, once that earned
// it one, its own ranking: one record, found by one look-up a search
// (soonest), where a map for each took four.
type ownRank struct {
	r     *ranking
	walks int
}

// rankFor is the ranking soonest walks for a hold of owner's for want
// GPUs: rankReady's for anyone (owner "", or a pair whose searches have
// walked ownRankWalk times the nodes or fewer), else every node ranked
// as owner sees it (rankOf), as the pass stands the first time it is
// made, kept for the rest of the pass; with the pair's record (nil for
// owner "", or a pair not yet walked), for walked.
func (p *planner) rankFor(want int, owner string) (*ranking, *ownRank) {
	if owner == "" || ownRankReference {
		return p.rankReady(want), nil
	}
	o := p.ownRanks[ownRankKey{want, owner}]
	if o != nil && o.r != nil {
		return o.r, o
	}
	base := p.rankReady(want)
	if o == nil || o.walks <= ownRankWalk*len(p.nodes) {
		return base, o
	}
	r := p.buf.ranking(len(base.ranks))
	for i, b := range base.ranks {
		r[i] = p.rankOf(b.n, want, owner)
	}
	p.sortRanks(r)
	o.r = &ranking{ranks: r, let: p.letGo}
	return o.r, o
}

// walked adds read, the nodes a search for a hold of owner's for want
// GPUs read that could take the hold (its ok accepted them), to the walk
// that earns the pair its own ranking (rankFor); o is the pair's record
// as rankFor found it. The nodes no hold may
// take (held, claimed, of another kind) are as many in the owner's own
// ranking as in the ranking for anyone, so a walk past them earns none:
// at 2,000 nodes with 2,000 owners each queueing ten requests, every
// hold's search walked past the nodes held before it, hundreds of owners
// earned rankings that did not shorten those walks, and counting each
// node in a map was a third of the pass.
func (p *planner) walked(o *ownRank, want int, owner string, read int) {
	if owner == "" || ownRankReference || read == 0 {
		return
	}
	if o == nil {
		if p.ownRanks == nil {
			p.ownRanks = map[ownRankKey]*ownRank{}
		}
		if len(p.ownRankSlab) == cap(p.ownRankSlab) {
			p.ownRankSlab = make([]ownRank, 0, 64)
		}
		p.ownRankSlab = append(p.ownRankSlab, ownRank{})
		o = &p.ownRankSlab[len(p.ownRankSlab)-1]
		p.ownRanks[ownRankKey{want, owner}] = o
	}
	if o.r != nil {
		return
	}
	o.walks += read
}
