package placer

import (
	"fmt"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// The standing reserve (issue 34). Holds (hold.go) start draining a node
// only once a whole-machine request has waited: at 90% load that request
// then waits for the node's last session to end, tens of minutes, while a
// 1-GPU request starts within a pass. So the planner keeps whole machines
// free or draining ahead of whole-machine arrivals, as many as are
// expected to arrive within ReserveAfter at the rate they arrived over the
// last hour (reserveWindow): at 200 nodes of 8 GPUs at 90% load, about one
// 8-GPU request a minute, eight nodes; at 16 nodes, none. The nodes kept
// are the empty ones first, then those whose sessions' max runtimes free
// them soonest (drain.go), after the holds have taken theirs. Nothing
// but a request for a whole machine is placed on a node of the reserve,
// except work that ends by its max runtime before the node drains
// (backfill, as on a held node). Every whole-machine request may take a
// node of the reserve at its turn in the fair order.
//
// The rate is read from the snapshot alone, so placers agree on it: the
// whole-machine parts queued within the window among the ledgers'
// allocations (state.Allocation.Queued) and the queue. Sessions that
// arrived and ended within the window are not in the snapshot, so each
// one still running stands for as many as the window holds of its
// owner's whole-machine run times (stillRunning): an owner whose 8-GPU
// runs take 10 minutes has six times as many arrive in an hour as run
// at once. Without that, an owner of short whole-machine runs had a
// reserve of a sixth of its arrivals: whenever fewer arrived in a pass
// than ended, the nodes its runs freed beyond the reserve went to
// another owner's small sessions, and where those run for hours the
// nodes did not come back (short-8-long-1 in placer/README.md: the
// owner of 10-minute 8-GPU runs held 70 nodes against its 80 for the
// rest of the run).
//
// What it costs: the reserve's free GPUs stand idle while smaller
// requests wait, as a held node's do (placer/README.md gives the busy
// figures). What it buys: a whole-machine request finds an empty node at
// its arrival, or one that empties soonest, instead of starting a drain
// once it has waited. Spread, which by itself keeps no whole machine
// free (it places on the emptiest node), gets whole machines from it
// too: the reserve is kept off spread's search as off binpack's; and
// while whole-machine requests arrive spread leaves empty nodes to them
// (spreadwhole.go), so a node an 8-GPU session frees stays whole.

// reserveMark is the reservedFor of a node in the standing reserve: no
// session's id (ids never hold a NUL byte).
const reserveMark = "\x00reserve"

// reserveSlack is how far above an equal split (a fraction of it) an
// owner within its fair share may hold and still take a node of the
// standing reserve (belowEqualShare). Two steady users of a full cluster
// each hold about an equal split, a few percent either side as sessions
// come and go; with no slack, the one just above it waited beside the
// reserve's idle nodes, kept for the other's arrivals (steady-90 at 200
// nodes with a pass a minute: 8-GPU p99 up to 8 minutes against the
// 1-GPU p99's one or two, p99 8/1 2.0-5.6, all six runs over 2; with a
// tenth, 0.6-2.2, two over 2). A hog's 8-GPU backlog holds far more (25%
// over in TestStandingReserveOnlyForOwnersBelowAnEqualSplit). A variable
// only so that TestStandingReserveForAnOwnerNearAnEqualSplit can show
// the rule without it.
var reserveSlack = 0.1

// reserveShare bounds the reserve where whole-machine requests arrive
// fast: at most one node in reserveShare, and no more than arrive within
// ReserveAfter. A twentieth (10 nodes at 200), the cap at any rate,
// held an owner of 10-minute 8-GPU runs at about 480 arrivals an hour
// to 10 nodes when its arrivals dipped, and the rest of the nodes its
// runs freed went to 8-hour sessions (short-8-long-1 in
// placer/README.md). Where a few arrive an hour, the reserve is a
// twentieth at most, as before: a tenth of 20 nodes kept for one
// arrival an hour idles a tenth of the GPUs.
const reserveShare = 10

// reserveWindow is how far back the planner counts whole-machine arrivals
// to size the standing reserve.
const reserveWindow = time.Hour

// standingReserve keeps, after the holds, nodes free or draining for
// whole-machine requests: as many as reserveSize says the last hour's
// arrivals of them need.
func (p *planner) standingReserve(plan *Plan) {
	if !p.keepsAhead() || !p.on(RuleReserve) {
		return
	}
	whole := p.whole // the GPUs of the largest node
	if whole == 0 {
		return
	}
	p.reserveOwners = p.belowEqualShare()
	arrived, contended := p.wholeArrivals()
	if arrived == 0 || contended {
		return
	}
	ok := func(n *nodeState) bool {
		return n.reservedFor == "" && n.view.Cordon == nil && n.totalGPU >= whole
	}
	rate := arrived / float64(reserveWindow) // per nanosecond
	want := p.reserveSize(whole, rate, ok)
	if want <= 0 {
		return
	}
	what := fmt.Sprintf("%d-GPU requests: about %.0f arrived in the last hour, so up to %d nodes are kept free or draining, as many as their max runtimes free before the next ones are expected",
		whole, arrived, want)
	for k := range want {
		n := p.soonest(whole, "", false, ok)
		if n == nil {
			break
		}
		n.reservedFor, n.reservedWhat = reserveMark, what
		// Backfill only what ends before the node drains and before the
		// whole-machine request it is kept for is expected: the k-th
		// node of the reserve serves the (k+1)-th arrival.
		n.drainBy = drainBy(n, p.snap.Now)
		if need := p.snap.Now.Add(time.Duration(float64(k+1) / rate)); need.Before(n.drainBy) {
			n.drainBy = need
		}
	}
}

// wholeArrivals estimates the parts asking for whole GPUs of at least
// whole (p.whole, the largest node's) queued within reserveWindow before
// the snapshot's clock: requests in the queue (by QueueEntry.Created;
// pinned ones are in the ledgers) and allocations in the ledgers (by
// Allocation.Queued), each of those as many as stillRunning says, of the
// owners that may take a node of the reserve (reserveOwners). contended
// reports that the reserve is not for this pass: some owner waits at or
// above its fair share (a backlog beyond the cluster, which the holds
// divide by fair share; a whole machine kept for whoever asks next would
// go to whoever asks for whole machines most, a hog's own 8-GPU backlog),
// or a request for less than a whole machine holds nodes (it has waited
// ReserveAfter over its GPUs and found no room: a node kept from it would
// only make more such requests wait and hold, a node each;
// planner.smallHolds). The queue is read by age group (byAge), so that
// an owner's facts are looked up once a group.
func (p *planner) wholeArrivals() (arrived float64, contended bool) {
	if p.smallHolds > 0 {
		return 0, true
	}
	whole := p.whole
	since := p.snap.Now.Add(-reserveWindow)
	sinceSec, sinceNsec := since.Unix(), int32(since.Nanosecond())
	for _, ag := range p.byAge() { // first: a contended pass reads no ledger
		spent, below := p.ownerHoldsOf(ag.key.owner).budget <= 0, p.reserveOwners[ag.key.owner]
		for i := range ag.keys {
			k := &ag.keys[i]
			f := &p.facts[k.idx]
			if f.pinned {
				continue
			}
			if spent {
				return 0, true
			}
			// The key's age and the request's facts first: its entry is
			// read only for a request of a whole machine queued within the
			// window (each entry read is a cache miss, and most requests
			// are neither).
			if below && f.largest >= whole && (k.sec > sinceSec || k.sec == sinceSec && k.nsec >= sinceNsec) {
				arrived += float64(wholeParts(k.it.Entry, whole))
			}
		}
	}
	stands := map[string]float64{}
	for i := range p.snap.Nodes {
		for _, a := range p.snap.Nodes[i].Ledger.Allocations {
			if a.Share == nil && len(a.GPUs) >= whole && !a.Queued.IsZero() && !a.Queued.Before(since) && p.reserveOwners[a.Owner] {
				k, seen := stands[a.Owner]
				if !seen {
					k = stillRunning(p.snap.Runtimes[a.Owner], whole)
					stands[a.Owner] = k
				}
				arrived += k
			}
		}
	}
	return arrived, false
}

// stillRunning is how many whole-machine arrivals within reserveWindow
// one of them still running stands for, by its owner's record of
// finished runs: the window over the mean of its runs of at least whole
// GPUs, at least 1 (runs as long as the window or longer are mostly
// still running). 1 where the record holds fewer than
// state.EstimateOver such runs, too few to tell a habit from chance:
// where an owner's whole-machine runs are a tenth of its sessions, the
// three or so among its last 32 say little, and weighting by them kept
// nodes idle for arrivals that did not come (odd-sizes at 200 nodes:
// busy while waiting 94.8–95.2%, two runs below 95%, against 95.0–95.5%
// with the floor).
func stillRunning(rec *state.RuntimeRecord, whole int) float64 {
	if rec == nil {
		return 1
	}
	var n, secs int64
	for _, s := range rec.Samples {
		if s.GPUs >= whole {
			n++
			secs += s.Seconds
		}
	}
	if n < state.EstimateOver || secs <= 0 {
		return 1
	}
	return max(1, float64(n)*reserveWindow.Seconds()/float64(secs))
}

// wholeParts is how many of e's parts ask for at least whole whole GPUs.
func wholeParts(e *state.QueueEntry, whole int) int {
	c := 0
	if e.Request.GPUs >= whole && !e.Request.Fraction() && e.Request.MIGProfile == "" {
		c++
	}
	if e.Workers > 0 {
		if w := e.WorkerResources(); w.GPUs >= whole && !w.Fraction() && w.MIGProfile == "" {
			c += e.Workers
		}
	}
	return c
}

// takesReserve reports whether part pt may use n, a node of the standing
// reserve: it asks for every GPU of the node and its owner is below its
// fair share. A whole machine drained for whoever asks next would
// otherwise go to whoever asks for whole machines most (a hog's own
// 8-GPU backlog), whatever its share.
func takesReserve(pt *part, n *nodeState) bool {
	return n.reservedFor == reserveMark && pt.below && pt.req.GPUs >= n.totalGPU && !pt.req.Fraction() && pt.req.MIGProfile == ""
}

// reserveSize is how many nodes the standing reserve keeps: walking the
// nodes ok accepts in the order they have whole GPUs free by their
// sessions' max runtimes (readyBy), the k-th (from 0) is kept while the
// requests expected by the time it is ready, at rate (per nanosecond),
// number at least k: a node that frees later than the arrivals it would
// serve must start draining now. Beyond those, as many as arrive within
// ReserveAfter, so that one is free when the next comes. At most a
// twentieth of the nodes, or as many as arrive within ReserveAfter where
// that is more, up to a tenth (reserveShare); none below 20 nodes (where
// one node is over 5% of the GPUs and idles them below busy ≥ 95%). A
// node whose time is unknown (a session without a max runtime) ends the
// walk.
func (p *planner) reserveSize(whole int, rate float64, ok func(*nodeState) bool) int {
	soon := int(rate * float64(p.opt.ReserveAfter))
	limit := max(len(p.nodes)/20, min(soon, len(p.nodes)/reserveShare))
	k := 0
	for _, r := range p.rankReady(whole).ranks {
		if k >= limit {
			break
		}
		if !ok(r.n) {
			continue
		}
		if !r.known || float64(k) > rate*float64(r.at.Sub(p.snap.Now)) {
			break
		}
		k++
	}
	return min(k+1+soon, limit)
}

// standing lists, once the pass is planned, the nodes of the standing
// reserve that no hold took and no whole-machine request of this pass
// was placed on (Plan.Standing), and counts every node the reserve kept,
// a full one draining included (Plan.reserveKept).
func (p *planner) standing(plan *Plan) {
	for _, n := range p.nodes {
		if n.reservedFor != reserveMark {
			continue
		}
		plan.reserveKept++
		if n.usedGPU < n.totalGPU {
			plan.Standing = append(plan.Standing, n.name)
		}
	}
}

// belowEqualShare is the owners that may take a node of the standing
// reserve: not above their fair share (hold.go's budget: an owner with
// nothing waiting is at its demand-capped share) and holding less than
// an equal split of the cluster's GPUs by weight among the owners that
// hold or ask for any, give or take reserveSlack of it. The second keeps the reserve from an
// owner whose demand-capped share is large only because others ask for
// little now (a hog's 8-GPU backlog while the others' queues are short):
// its own arrivals would size the reserve, and it would take every node
// drained, ahead of the others' requests to come.
func (p *planner) belowEqualShare() map[string]bool {
	wsum := 0.0
	for o, oh := range p.holdOwners {
		if oh.entitled {
			wsum += p.ownerWeight(o)
		}
	}
	out := map[string]bool{}
	for o, oh := range p.holdOwners {
		if !oh.entitled || oh.budget < 0 {
			continue
		}
		var held int64
		if a := p.quota.users[o]; a != nil {
			held = a.gpus
		}
		if float64(held) < (1+reserveSlack)*float64(p.usage.total.gpus)*p.ownerWeight(o)/wsum {
			out[o] = true
		}
	}
	return out
}
