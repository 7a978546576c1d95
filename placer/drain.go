package placer

import (
	"math"
	"slices"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// Which node a hold drains (issue 34). A held node frees for its request
// only as fast as the sessions on it end, so the node to hold is the one
// whose sessions leave room soonest. Max runtimes bound that: every
// allocation with one ends by state.Allocation.Ends, so a node whose
// allocations end, in order, soon enough to free the GPUs a part asks for
// has room by the end of the last of them (readyBy) whatever the sessions
// do. The emptiest node is only the best guess where that bound is
// unknown: with run times of mean 1 h, the emptiest node of an 8-GPU
// cluster at 90% load typically runs a session that started minutes ago,
// while a fuller one runs sessions a max runtime ends within the hour.
// Holding the node with the earliest bound shortens the wait of the
// request and the time its free GPUs stand idle alike.

// readyMemo is what readyBy reads of a node, valid while the node's
// sessions and free GPUs are unchanged in the pass: the ends of its
// sessions that have one, soonest first, for every request size alike (a
// pass ranks the nodes for each size it holds for). set says it was made
// in this pass; ends may be a PlanCache template's (ledgerEnds): read
// only.
type readyMemo struct {
	sessions, free int
	set            bool
	ends           []drainEnd
}

// ledgerEnds is the ends of a node's ledger alone, soonest first, as
// planEnd reads them at any clock from at up to until (zero: at any clock
// from at on). A PlanCache template keeps the last one a pass made, so
// that the next pass at a clock in that range, on the same ledger, reads
// it instead of walking the ledger and sorting again: at 2,000 nodes that
// was about 7% of a pass that holds nodes (BenchmarkNewPlanBacklog).
// planEnd moves only when the clock passes a session's expected end, so
// until is the first expected end after at. Shared between passes: never
// written once made.
type ledgerEnds struct {
	at, until time.Time
	ends      []drainEnd
}

// covers reports whether e reads as planEnd would at now.
func (e *ledgerEnds) covers(now time.Time) bool {
	return !now.Before(e.at) && (e.until.IsZero() || now.Before(e.until))
}

// drainEnd is a session's planned end (planEnd) and the GPUs it frees.
type drainEnd struct {
	at   time.Time
	gpus int
}

// readyBy is when n has at least want whole GPUs free by the max runtimes
// of what runs there (its ledger and this pass's proposals): now if it
// has them free, else the end of the allocation whose end frees the last
// GPU needed, the allocations taken in order of their ends. known is false
// when some GPU needed is held by an allocation without a max runtime (or
// a shared GPU's fractions, which free their device only together).
func (p *planner) readyBy(n *nodeState, want int) (at time.Time, known bool) {
	free := n.freeGPUs
	if free >= want {
		return p.snap.Now, true
	}
	m := &n.ready
	if !m.set || m.sessions != n.sessions() || m.free != free {
		*m = readyMemo{sessions: n.sessions(), free: free, set: true, ends: p.nodeEnds(n)}
	}
	for _, e := range m.ends {
		free += e.gpus
		if free >= want {
			return e.at, true
		}
	}
	return time.Time{}, false
}

// nodeEnds is the planned ends (planEnd) of what runs on n, its ledger and
// this pass's proposals, soonest first, for readyBy. A node with nothing
// proposed or released in the pass reads its ledger's from its PlanCache
// template where they cover the pass's clock (ledgerEnds), and leaves
// them there for the next pass where not.
func (p *planner) nodeEnds(n *nodeState) []drainEnd {
	now := p.snap.Now
	pristine := n.tmpl != nil && len(n.proposed) == 0 && n.released == 0 && !now.IsZero()
	if pristine {
		if c := n.tmpl.ends.Load(); c != nil && c.covers(now) {
			return c.ends
		}
	}
	ends := make([]drainEnd, 0, n.sessions())
	var until time.Time
	add := func(allocs map[string]state.Allocation) {
		for _, a := range allocs {
			if a.Expects != nil && a.Expects.After(now) && (until.IsZero() || a.Expects.Before(until)) {
				until = *a.Expects
			}
			at := planEnd(&a, now)
			if a.Share != nil || at.IsZero() {
				continue
			}
			ends = append(ends, drainEnd{at, len(a.GPUs)})
		}
	}
	add(n.view.Ledger.Allocations)
	add(n.proposed)
	// Ends at one time free their GPUs together: their order among
	// themselves changes no answer.
	slices.SortFunc(ends, func(a, b drainEnd) int { return a.at.Compare(b.at) })
	if pristine {
		n.tmpl.ends.Store(&ledgerEnds{at: now, until: until, ends: ends})
	}
	return ends
}

// soonest is, of the nodes ok accepts, the one that has want whole GPUs
// free soonest by max runtimes (readyBy); among equals, or where no
// node's time is known, the one with the most free (then the first by
// name). A node where owner's own sessions hold the GPUs asked for counts
// as unknown (ownGPUs): holding it keeps nothing from others. nil if ok
// accepts none.
//
// The nodes are ranked once a pass for each size asked for (rankReady),
// and each search walks the ranking: a node's place only worsens as the
// pass proposes sessions on it (its time moves later, its free GPUs
// fewer), so the first node in the ranking whose place is unchanged
// beats every node after it, and only the changed ones before it need
// comparing: a search reads a few nodes, not all 2,000. ok accepts no
// held node (reservedFor set), and where claimed is set no claimed node
// either (a hold's search, claim.go): a search starts after such nodes at
// the ranking's head (ranking.from).
func (p *planner) soonest(want int, owner string, claimed bool, ok func(*nodeState) bool) *nodeState {
	rk, own := p.rankFor(want, owner) // owner's view (ownrank.go)
	n, read := p.walk(rk, want, owner, claimed, ok)
	p.walked(own, want, owner, read) // toward the pair's own ranking
	return n
}

// walk is soonest's search of ranking rk for owner's holds, with how
// many nodes it read that ok accepted.
func (p *planner) walk(rk *ranking, want int, owner string, claimed bool, ok func(*nodeState) bool) (n *nodeState, read int) {
	var (
		changed readyRank
		found   bool
	)
	for _, r := range rk.from(p, claimed) {
		if !ok(r.n) {
			continue
		}
		read++
		cur := p.rankOf(r.n, want, owner)
		if cur.same(r) {
			if found && changed.before(cur) {
				return changed.n, read
			}
			return cur.n, read
		}
		if !found || cur.before(changed) {
			changed, found = cur, true
		}
	}
	if found {
		return changed.n, read
	}
	return nil, read
}

// readyRank is a node's place in soonest's ranking for one size.
type readyRank struct {
	n     *nodeState
	known bool
	at    time.Time
	free  int
}

// same reports whether a and b are one node's same place.
func (a readyRank) same(b readyRank) bool {
	return a.n == b.n && a.known == b.known && a.at.Equal(b.at) && a.free == b.free
}

// before orders ranks: a known time before none, an earlier time first,
// then more GPUs free, then the node's name.
func (a readyRank) before(b readyRank) bool {
	if a.known != b.known {
		return a.known
	}
	if a.known && !a.at.Equal(b.at) {
		return a.at.Before(b.at)
	}
	if a.free != b.free {
		return a.free > b.free
	}
	return a.n.name < b.n.name
}

// rankOf is n's place now for want GPUs, for a hold of owner's ("": any).
func (p *planner) rankOf(n *nodeState, want int, owner string) readyRank {
	at, known := p.readyBy(n, want)
	if known && owner != "" && ownGPUs(n, owner) >= want {
		known = false
	}
	if !known {
		at = time.Time{}
	}
	return readyRank{n: n, known: known, at: at, free: n.freeGPUs}
}

// ranking is a ranking soonest walks: every node by its place for one
// size (rankReady's, for anyone, or an owner's, ownrank.go), with how
// many of its first nodes no search can take.
type ranking struct {
	ranks []readyRank
	// held is how many of ranks' first nodes were held (reservedFor set)
	// when a search last read them, and taken how many were held or
	// claimed (claim.go), while the planner's letGo was let. A claim
	// lasts the pass, and a node held stays held until some hold is let
	// go (planner.unhold counts letGo up), so while letGo is unchanged a
	// search starts after them. Without it each hold's search walked
	// past every node held or claimed before it: at 2,000 nodes with
	// 2,000 owners each queueing ten requests, 1,700 holds a pass.
	held, taken, let int
}

// from is where a search of r starts: after the held nodes at its head,
// and the claimed ones among them where claimed is set.
func (r *ranking) from(p *planner, claimed bool) []readyRank {
	if heldHeadReference {
		return r.ranks
	}
	if r.let != p.letGo {
		r.held, r.taken, r.let = 0, 0, p.letGo
	}
	if claimed {
		for r.taken < len(r.ranks) && (r.ranks[r.taken].n.reservedFor != "" || p.claimed(r.ranks[r.taken].n)) {
			r.taken++
		}
		return r.ranks[r.taken:]
	}
	for r.held < len(r.ranks) && r.ranks[r.held].n.reservedFor != "" {
		r.held++
	}
	return r.ranks[r.held:]
}

// heldHeadReference, set only by TestHeldHeadMatchesReference (never
// concurrently with other plans), makes every search walk its ranking
// from the first node, as before ranking.held: the reference its plans
// are compared with.
var heldHeadReference bool

// rankReady is every node ranked for want GPUs (before) as the pass
// stands the first time it is asked for, kept for the rest of the pass.
func (p *planner) rankReady(want int) *ranking {
	if r, ok := p.ranked[want]; ok {
		return r
	}
	r := p.buf.ranking(len(p.nodes))
	for i, n := range p.nodes {
		r[i] = p.rankOf(n, want, "")
	}
	p.sortRanks(r)
	if p.ranked == nil {
		p.ranked = map[int]*ranking{}
	}
	rk := &ranking{ranks: r, let: p.letGo}
	p.ranked[want] = rk
	return rk
}

// sortRanks sorts r best first (readyRank.before, a total order: node
// names are unique). A ranking is of every node of the pass, so it is
// laid out by name first (nodeState.byName, the node's place among the
// pass's nodes, which are sorted by name), then sorted stably by free
// GPUs, most first (a count of each number), and its known times stably
// by a radix sort of their nanoseconds since the soonest (radixSort):
// each a few walks of the ranking. A comparison sort of 2,000 nodes
// through time.Time and names was a twentieth of a pass that holds nodes.
// A time compares as time.Compare does, by wall clock: all of a
// ranking's times are read alike (the pass's clock, the ends of its
// ledgers, or its clock plus a max runtime, whose monotonic readings
// agree with their wall clocks). A ranking that is not of every node, or
// whose times span too long, is sorted by before.
func (p *planner) sortRanks(r []readyRank) {
	byBefore := func() {
		slices.SortFunc(r, func(a, b readyRank) int {
			if a.before(b) {
				return -1
			}
			return 1
		})
	}
	n := len(r)
	if n != len(p.nodes) {
		byBefore()
		return
	}
	named := sized(p.rankNamed, n)
	p.rankNamed = named
	most := 0
	var lo time.Time
	known := 0
	for i := range r {
		j := int(r[i].n.byName)
		if j >= n || p.nodes[j] != r[i].n || named[j].n != nil {
			byBefore()
			return
		}
		named[j] = r[i]
		most = max(most, r[i].free)
		if r[i].known {
			if known == 0 || r[i].at.Before(lo) {
				lo = r[i].at
			}
			known++
		}
	}
	// By free GPUs, most first, stably: a count of each number.
	count := make([]int, most+2)
	for i := range named {
		count[most-named[i].free+1]++
	}
	for d := 1; d < len(count); d++ {
		count[d] += count[d-1]
	}
	byFree := sized(p.rankKeys, n)
	p.rankKeys = byFree
	for i := range named {
		d := most - named[i].free
		byFree[count[d]] = radixKey{i: int32(i)}
		count[d]++
	}
	// The known by time, stably, first; then the unknown as they are
	// (kept at the front of byFree, which the walk has passed).
	times, scratch := sized(p.rankTimes, known), sized(p.rankScratch, known)
	p.rankTimes, p.rankScratch = times, scratch
	var top uint64
	k, u := 0, 0
	for _, x := range byFree {
		rk := &named[x.i]
		if !rk.known {
			byFree[u] = x
			u++
			continue
		}
		span := rk.at.Sub(lo)
		if span == math.MaxInt64 { // too long for nanoseconds
			byBefore()
			return
		}
		times[k] = radixKey{t: uint64(span), i: x.i}
		top = max(top, times[k].t)
		k++
	}
	for i, x := range radixSort(times, scratch, top) {
		r[i] = named[x.i]
	}
	for i, x := range byFree[:u] {
		r[k+i] = named[x.i]
	}
}

// ownGPUs is the GPUs that owner's sessions hold on n (ledger and
// proposed). When they are at least what a hold of owner's asks for, the
// hold keeps nothing from others: the node has room for it once they end,
// whatever others take of its free GPUs meanwhile, and what they free is
// the owner's again at its turn.
func ownGPUs(n *nodeState, owner string) int {
	c := 0
	if h := n.ledgerSums(); h != nil {
		for i := range h.owners {
			if h.owners[i].owner == owner {
				c = h.owners[i].devices
				break
			}
		}
	} else {
		for _, a := range n.view.Ledger.Allocations {
			if a.Owner == owner {
				c += len(a.GPUs)
			}
		}
	}
	for _, a := range n.proposed {
		if a.Owner == owner {
			c += len(a.GPUs)
		}
	}
	return c
}
