package placer

import "github.com/voyager-gpu/voyager/state"

// What spread trades for whole machines (issue 34). Spread places each
// request on the emptiest node that fits it, so an empty node, the only
// place a whole-machine request can go, is the first a 1-GPU request
// takes: under a stream of small requests spread keeps no whole machine
// free (BenchmarkFragmentation), and every 8-GPU request waits for a
// node to drain. The same holds for half a machine and 4-GPU requests.
// So while requests for a whole or half machine arrive (blockLevels),
// spread places a smaller request on the emptiest node that keeps those
// blocks: among the nodes with fewer GPUs free than the smallest such
// size above the request's, the emptiest first; then among those with
// fewer than the next size; and an empty node last. A node freed whole,
// typically by an 8-GPU session's end, stays whole for the next 8-GPU
// request, and a node with half its GPUs free stays so for a 4-GPU one.
// What spread gives up is spreading onto idle and half-idle machines
// while such requests are made; within each band it still fills the
// emptiest first. With no such request in the last reserveWindow, it
// spreads over every node as before; so it does below 20 nodes, as the
// standing reserve is off there: at 16 nodes the bands lowered Jain's
// least on adv-sticky-small (0.678 to 0.591), adv-hold-hog (0.936 to
// 0.783) and adv-7-of-8 (0.758 to 0.643) with spread, a node there being
// over 5% of the GPUs (placer/README.md).
//
// Under a backlog the bands are not enough. While the queue asks for more
// whole GPUs than are free, every free GPU is wanted, so spreading buys
// no headroom: it only decides which GPUs are left free as sessions end,
// and spread leaves them one or two to a node, where only the smallest
// requests fit. In a flood that drains (flood-drain, 200 nodes) the
// flooder's 1-GPU requests then started within a pass on those single
// GPUs while its 2-, 4- and 8-GPU requests waited out the flood for
// drains (8-GPU p99 542-655 min against a 1-GPU p99 of 2-6), and a
// second flooder arriving at a full cluster got its GPUs too slowly
// (two-floods, Jain's least 0.936). So while blocks are kept and the
// queue asks for more whole GPUs than are free (packsBacklog), spread
// places as binpack does, fullest node first, and each decision's score
// is named binpack; with the backlog gone it spreads again.

// spreadBucket is the bucket of free whole GPUs that spread's search for
// part pt visits at step i (from 0 to len(p.buckets)-1-pt.req.GPUs).
func (p *planner) spreadBucket(pt *part, i int) int {
	g := pt.req.GPUs
	order := p.spreadOrders[g]
	if order == nil {
		var levels []int
		if p.on(RuleBands) {
			levels = p.blockLevels()
		}
		order = spreadOrder(g, len(p.buckets)-1, levels)
		if p.spreadOrders == nil {
			p.spreadOrders = map[int][]int{}
		}
		p.spreadOrders[g] = order
	}
	return order[i]
}

// spreadOrder is the buckets from g to top (free whole GPUs) in the order
// spread visits them for a request of g GPUs: in bands split at each of
// levels above g, the band below the lowest level first, each band from
// its emptiest bucket down.
func spreadOrder(g, top int, levels []int) []int {
	order := make([]int, 0, top-g+1)
	lo := g
	band := func(hi int) { // buckets lo..hi-1, the emptiest first
		for b := hi - 1; b >= lo; b-- {
			order = append(order, b)
		}
		lo = max(lo, hi)
	}
	for _, l := range levels {
		if l > lo && l <= top {
			band(l)
		}
	}
	band(top + 1)
	return order
}

// blockLevels is the sizes, ascending, of the blocks spread keeps (none
// below 20 nodes, or with holds off, ReserveAfter zero, the policy before
// issue 34): the GPUs of the largest node (whole) and half of them,
// each while requests of at least that size arrive: some part of a request in the queue, or
// of a session queued within reserveWindow (state.Allocation.Queued),
// asks for it. Computed once a pass, from the snapshot alone.
func (p *planner) blockLevels() []int {
	if p.levelsKnown {
		return p.levels
	}
	p.levelsKnown = true
	if !p.keepsAhead() {
		return nil
	}
	whole, half := p.whole, p.whole/2
	if half < 2 {
		half = whole
	}
	var hasWhole, hasHalf bool
	note := func(g int) {
		hasWhole = hasWhole || g >= whole
		hasHalf = hasHalf || g >= half && g < whole
	}
	for i := range p.snap.Pending {
		e := p.snap.Pending[i].Entry
		for _, r := range []*state.Resources{&e.Request, e.WorkerRequest} {
			if r != nil && !r.Fraction() && r.MIGProfile == "" {
				note(r.GPUs)
			}
		}
		if hasWhole && hasHalf {
			break
		}
	}
	since := p.snap.Now.Add(-reserveWindow)
	for i := range p.snap.Nodes {
		if hasWhole && hasHalf {
			break
		}
		for _, a := range p.snap.Nodes[i].Ledger.Allocations {
			if a.Share == nil && !a.Queued.IsZero() && !a.Queued.Before(since) {
				note(len(a.GPUs))
			}
		}
	}
	if hasHalf && half < whole {
		p.levels = append(p.levels, half)
	}
	if hasWhole {
		p.levels = append(p.levels, whole)
	}
	return p.levels
}

// packsBacklog reports whether this pass places spread's requests as
// binpack does: spread keeps blocks (blockLevels) and the queue's
// waiting requests ask for more whole GPUs than the nodes have free
// (every part of every request not pinned; fractions and MIG devices
// aside, which go to devices of their own kind). Requests that cannot
// start for another reason, a quota's cap or a GPU model no node has,
// count too: the test is the snapshot's, made once before the order.
func (p *planner) packsBacklog() bool {
	if !p.on(RuleBands) || len(p.blockLevels()) == 0 {
		return false
	}
	free := 0
	for _, n := range p.nodes {
		free += n.freeGPUs
	}
	return p.asksMoreThan(free)
}

// asksMoreThan reports whether the queue's waiting requests ask for more
// than limit whole GPUs: every part of every request not pinned,
// fractions and MIG devices aside, whether or not it could start.
func (p *planner) asksMoreThan(limit int) bool {
	want := 0
	for i := range p.snap.Pending {
		it := &p.snap.Pending[i]
		if it.Pinned {
			continue
		}
		e := it.Entry
		want += wholeGPUs(&e.Request)
		if e.Workers > 0 {
			want += e.Workers * wholeGPUs(e.WorkerResources())
		}
		if want > limit {
			return true
		}
	}
	return false
}

// wholeGPUs is the whole GPUs r asks for: none for a fraction or a MIG
// device.
func wholeGPUs(r *state.Resources) int {
	if r.Fraction() || r.MIGProfile != "" {
		return 0
	}
	return r.GPUs
}
