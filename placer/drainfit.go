package placer

import "time"

// Which of equally good nodes a part goes to (issue 34). Binpack puts a
// small request on the fullest node that fits, and spread, while it keeps
// blocks (spreadwhole.go), on the emptiest node of a band; either way
// several nodes tie, and a hash used to pick among them. Yet they differ
// in what the part costs the next whole-machine request: a node frees
// whole only when its last session ends, so a 1-GPU session of two hours
// placed beside sessions whose max runtimes end within twenty minutes
// keeps that node busy for two hours, while beside sessions that run for
// four it costs nothing. So while whole-machine or half-machine requests
// arrive (blockLevels: 20 nodes and more, holds on) and the queue is not
// a deep backlog (deepBacklog), the planner prefers,
// among nodes of equal score, the one the part fits in time best
// (drainFit): one whose sessions end, by their max runtimes, no earlier
// than the part does, the tightest such first, so nodes about to drain
// are left to drain and nodes that run long keep room for long parts;
// then a node whose drain no max runtime bounds (a session without one:
// it does not drain anyway); then the node whose drain the part delays
// least. Spread ranks a whole band's nodes by fit before emptiness (the
// bands already give up spreading onto idle machines while such requests
// arrive). At 200 nodes it met steady-90's p99 8/1 goal on every seed
// of both strategies, where five of six runs missed it (placer/README.md,
// "Drain fit"). Below 20 nodes, where a node is over 5% of the GPUs and
// the reserve, claims and bands are off, it is off too: there it met the
// goals of two more of the 66 runs but put four Jain floors of
// TestSuiteGoals a little below (by 0.005-0.013).

// deepBacklog reports whether the queue's waiting requests ask for more
// whole GPUs than a quarter of the cluster's (every part of every request
// not pinned). Then the drain fit is off: where the load exceeds the
// cluster for hours, whole machines drained sooner go to each owner's
// large requests through the holds, ahead of its older small ones, and
// the fit bought nothing the goals ask for there at the small ones'
// cost (weights-3:1 at 200 nodes, 160% offered: the most any request
// waited beyond its fair-share wait 737-814 min without the fit,
// 952-1,102 with it, 766-845 with it off in such a backlog; two-floods'
// Jain at its least 0.951 with it, 0.956 so). A burst at 90% load, what
// the fit is for, asks for a few percent of the cluster.
func (p *planner) deepBacklog() bool {
	total := 0
	for _, n := range p.nodes {
		total += n.totalGPU
	}
	return p.asksMoreThan(total / 4)
}

// drainFit is how well a part that ends at ends (zero: no max runtime)
// fits beside sessions that have all ended by drain (zero: some session
// has no max runtime, or the node runs none), in [0, 1]: above 1/2 when
// the part ends by drain, the more the less time lies between them (1
// when they end together); 1/2 when drain is unknown; below 1/2 when
// the part runs past drain, the less the longer it delays it; 0 for a
// part without a max runtime on a node that would drain.
func drainFit(ends, drain time.Time) float64 {
	switch {
	case drain.IsZero():
		return 0.5
	case ends.IsZero():
		return 0
	case ends.After(drain):
		return 0.5 / (1 + ends.Sub(drain).Hours())
	}
	return 0.5 + 0.5/(1+drain.Sub(ends).Hours())
}

// drainMemo is a node's drainBy, valid while the pass has released and
// proposed as many of its sessions as when it was read (within a pass
// the ledger's sessions only go, released for a pinned session, and
// come back, and proposals only come).
type drainMemo struct {
	released, proposed int
	at                 time.Time
}

// drainOf is drainBy(n), memoised for the pass: the same few nodes of the
// fullest bucket are scored for request after request, and reading a
// node's allocations each time cost the backlog benchmark's pass about a
// sixth of its time.
func (p *planner) drainOf(n *nodeState) time.Time {
	if m, ok := p.drains[n]; ok && m.released == n.released && m.proposed == len(n.proposed) {
		return m.at
	}
	at := drainBy(n, p.snap.Now)
	if p.drains == nil {
		p.drains = make(map[*nodeState]drainMemo)
	}
	p.drains[n] = drainMemo{n.released, len(n.proposed), at}
	return at
}

// candidate is a node's standing in best's search: its weighted score,
// its drain fit (drainFit, zero unless the pass fits drains) and its
// hash tie-break.
type candidate struct {
	total, fit float64
	tie        uint64
}

// beats reports whether c ranks above o: by total score, then fit, then
// the hash; with fitFirst (spread ranking a band), by fit first.
func (c candidate) beats(o candidate, fitFirst bool) bool {
	if fitFirst && c.fit != o.fit {
		return c.fit > o.fit
	}
	if c.total != o.total {
		return c.total > o.total
	}
	if c.fit != o.fit {
		return c.fit > o.fit
	}
	return c.tie < o.tie
}
