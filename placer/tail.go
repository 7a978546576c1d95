package placer

import (
	"sync"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// The tail of the queue. Past the requests that fit, a backlog's
// thousands of requests each wait on the reason their shape already found
// in the pass (planner.failed), and reading each entry in the order's
// sequence (by share, then age: all over the heap) cost a cache miss or
// more per request, most of a pass at 20,000 queued
// (BenchmarkNewPlanBacklog). So the facts the tail reads of a request are
// gathered once, in one walk of the snapshot's queue in its own order,
// after the holds and before the order runs: the loop then answers a
// request whose shape has failed from them alone, exactly as place
// would (tailWaits). Everything else goes to place as before.

// tailReference, set only by the tests of tail_test.go, turns the tail's
// path off: every request goes to place, which reads its entry, as before
// tail.go. The tests plan snapshots both ways and compare.
var tailReference bool

// tailFacts is what the tail reads of one request.
type tailFacts struct {
	// shape is the index of the request's tail shape in planner.tailShapes
	// (the shape place probes the failure memo with); -1 where the
	// request does not take the tail's path: it is elastic, has
	// workers, holds nodes, or the pass checks quotas.
	shape int32
	// aged is aged(e). A request on the tail's path holds no nodes.
	aged bool
	// owner is what the tail reads of e's owner; priority and model are
	// e's priority and GPU model, which lending reads (noteWaiting).
	owner    *tailOwner
	priority int
	model    string
}

// tailIn is what gatherTail reads of a request's entry, read in byAge's
// walk of the queue, which reads every entry in the snapshot's order
// anyway: gatherTail then walks this array instead of the entries. At
// 20,000 queued each entry read again was a cache miss or more, about a
// tenth of BenchmarkNewPlanBacklog's pass.
type tailIn struct {
	// nums is the numbers of the request's tail probe (numbersOf) but
	// below and ends, which depend on its owner (gatherTail adds them).
	nums numbers
	// maxRuntime is the entry's max runtime; model its GPU model.
	maxRuntime state.Duration
	model      string
	// path: the request may take the tail's path by its entry alone
	// (not pinned, not elastic, no workers); plain: plainReq; oneNode:
	// it runs on one machine (Nodes at most 1: its part's role is
	// single, whose ports nums counts).
	path, plain, oneNode bool
}

// tailInOf is it's tailIn.
func tailInOf(it *Pending) tailIn {
	e := it.Entry
	r := &e.Request
	return tailIn{
		nums:       reqNumbers(r, e.Ports(state.RoleSingle)),
		maxRuntime: e.MaxRuntime,
		model:      r.GPUModel,
		path:       !it.Pinned && e.Elastic == nil && e.Workers == 0,
		plain:      plainReq(r),
		oneNode:    e.Nodes <= 1,
	}
}

// tailOwner is what the tail reads of an owner, read once per owner: its
// name as its first request spells it, whether its requests may backfill
// (it has a hold budget: mayBackfill, but for the max runtime; and lending
// notes its requests), whether it may take the standing reserve, and its
// run-time record (estimate); and its holds' answer to mayHold
// (ownerHolds.mayHold), kept while no hold is made (planner.holdGen). A
// request finds its owner's through its age group (byAge), without
// hashing the owner's name.
type tailOwner struct {
	name string
	// holds is the owner's holds and budgets (nil while holds are off),
	// which mayHold reads.
	holds     *ownerHolds
	backfill  bool
	below     bool
	estimates *state.RuntimeRecord
	may, seen bool
	gen       int
	// ests memoises estimates.Estimate by GPUs, up to memoGPUs: the
	// same few sizes are asked for thousands of times a pass.
	ests  [memoGPUs + 1]time.Duration
	known [memoGPUs + 1]bool
}

// memoGPUs is the most GPUs whose estimate a tailOwner memoises.
const memoGPUs = 16

// Estimate is o.estimates.Estimate(gpus) (0 without a record), memoised.
func (o *tailOwner) Estimate(gpus int) time.Duration {
	if gpus < 0 || gpus > memoGPUs {
		return o.estimates.Estimate(gpus)
	}
	if !o.known[gpus] {
		o.ests[gpus], o.known[gpus] = o.estimates.Estimate(gpus), true
	}
	return o.ests[gpus]
}

// mayHold is ownerHolds.mayHold for o's owner, read again only after a
// hold was made (holdFor changes what it reads). It only turns false as holds are made,
// and a request it wrongly let by would go to place, which answers it
// the same: the memo saves time, it cannot change a plan.
func (o *tailOwner) mayHold(p *planner) bool {
	if !o.seen || o.gen != p.holdGen {
		o.may, o.gen, o.seen = o.holds.mayHold(), p.holdGen, true
	}
	return o.may
}

// gatherTail fills p.tails and p.tailShapes from the snapshot's queue. It
// runs once the holds and the standing reserve are settled: what it reads
// of the planner (holds, hold budgets, the reserve's owners) does not
// change while the order runs, but for the request being placed.
func (p *planner) gatherTail() {
	if tailReference {
		return
	}
	p.buf.tails = sized(p.buf.tails, len(p.snap.Pending))
	p.tails = p.buf.tails
	ids := map[shape]int32{}
	// Most requests name no model, profile or selector and ask for whole
	// GPUs: their shape has no string in it, and is interned by a key of
	// numbers alone, which hashes in a fraction of the time.
	plain := map[numbers]int32{}
	intern := func(k shape) int32 {
		id, ok := ids[k]
		if !ok {
			id = int32(len(p.tailShapes))
			ids[k] = id
			p.tailShapes = append(p.tailShapes, k)
			p.tailFailed = append(p.tailFailed, nil)
		}
		return id
	}
	owners := pooledMap(&p.buf.maps.tailOwners, p.owners)
	p.buf.tailOwners = resized(p.buf.tailOwners, p.owners) // one array, kept between passes
	slab := p.buf.tailOwners[:0]
	byGroup := make([]*tailOwner, len(p.ages))
	gids := p.buf.gids
	single := state.TxnBudget{MaxOps: p.opt.MaxTxnOps}.Fits(gangSize(1, 0))
	ins, flat := p.buf.tailIns, p.buf.flat
	for i := range p.snap.Pending {
		t := &p.tails[p.buf.posOf[i]] // in the order's reading order (ageKey.pos)
		t.shape = -1
		in := &ins[i]
		// A request holding nodes is in holds: it takes place's path.
		if p.quotas || !single || !in.path || len(p.holds) > 0 && p.holds[flat[i].id] {
			continue
		}
		ag := p.ages[gids[i]]
		o := byGroup[gids[i]]
		if o == nil {
			owner := ag.key.owner
			if o = owners[owner]; o == nil {
				if len(slab) == cap(slab) {
					slab = make([]tailOwner, 0, 16)
				}
				slab = append(slab, tailOwner{name: owner, below: p.reserveOwners[owner], estimates: p.snap.Runtimes[owner]})
				o = &slab[len(slab)-1]
				if p.holdOwners != nil {
					o.holds = p.ownerHoldsFor(owner) // the one holdFor adds to
					o.backfill = o.holds.budget > 0
				}
				owners[owner] = o
			}
			byGroup[gids[i]] = o
		}
		t.owner, t.priority, t.model = o, ag.key.prio, in.model
		t.aged = p.agedKey(&flat[i])
		if !in.plain {
			e := p.snap.Pending[i].Entry
			probe := p.tailProbe(e, o.backfill, o.below, o.estimates)
			t.shape = intern(shapeOf(&probe))
			continue
		}
		// tailProbe's numbers, from the request's tailIn and its owner's
		// facts alone: its entry is read only for a shape not seen before.
		k := in.nums
		k.below = o.below
		if backfill, ends := p.probeEnds(in.maxRuntime, o.backfill, k.gpus, o); backfill {
			k.ends = ends.UnixNano()
		}
		id, ok := plain[k]
		if !ok {
			probe := p.tailProbe(p.snap.Pending[i].Entry, o.backfill, o.below, o.estimates)
			id = intern(shapeOf(&probe))
			plain[k] = id
		}
		t.shape = id
	}
}

// tailProbe is the part a single-part request e is looked up by in the
// failure memo at the tail of the queue, its owner's facts given: whether
// the owner may backfill (has a hold budget), may take the standing
// reserve, and its run-time record. place and gatherTail both make it
// here, so that the shapes they read agree.
func (p *planner) tailProbe(e *state.QueueEntry, backfill, below bool, rec *state.RuntimeRecord) part {
	probe := part{req: &e.Request, ports: e.Ports(state.RoleSingle), below: below}
	probe.backfill, probe.ends = p.probeEnds(e.MaxRuntime, backfill, e.Request.GPUs, rec)
	return probe
}

// estimator is an owner's run-time estimate by a request's GPUs: its
// record (state.RuntimeRecord, nil for none), or the tail's memo of it
// (tailOwner).
type estimator interface {
	Estimate(gpus int) time.Duration
}

// probeEnds is whether a tail probe backfills and the end it then counts,
// for a single-part request of gpus GPUs and max runtime limit whose
// owner may backfill (has a hold budget) or not, est its owner's
// estimates: it backfills only with a max runtime and such an owner, and
// counts its expected end (endAfter; est read only then). tailProbe and
// gatherTail both read it, so that the shapes they make agree.
func (p *planner) probeEnds(limit state.Duration, backfill bool, gpus int, est estimator) (bool, time.Time) {
	if limit <= 0 || !backfill {
		return false, time.Time{}
	}
	return true, p.snap.Now.Add(endAfter(limit, est.Estimate(gpus)))
}

// tailWaits answers the request whose key is at pos among the pass's
// keys (ageKey.pos) from its tail facts if place would: its shape has failed in this pass and
// it may not hold nodes. It then records it waiting on that shape's
// reason, notes it for lending, and reports true; otherwise it does
// nothing and reports false (place decides). Where it reports false for
// a request on the tail's path, open is the request's tail facts and
// failed its shape's failure in this pass (nil: none yet): placeOpen
// reads them instead of probing the failure memo again and finding the
// owner's facts by its name.
func (p *planner) tailWaits(it *Pending, pos int, plan *Plan) (waits bool, open *tailFacts, failed *failure) {
	if pos < 0 || pos >= len(p.tails) {
		return false, nil, nil
	}
	t := &p.tails[pos]
	if t.shape < 0 {
		return false, nil, nil
	}
	f := p.tailFailed[t.shape]
	if f == nil {
		got, ok := p.failed[p.tailShapes[t.shape]]
		if !ok {
			return false, t, nil
		}
		f = &got // a failure is memoised once and kept for the pass
		p.tailFailed[t.shape] = f
	}
	if t.aged && p.holdOwners != nil && t.owner.mayHold(p) {
		return false, t, f
	}
	// The entry is read only where teams add to the message or lending
	// notes the request: it is a cache miss a request at 20,000 queued.
	msg := f.message
	if p.teams != nil {
		msg = p.teamNote(it.Entry, f.reason, msg)
	}
	plan.Waiting = append(plan.Waiting, Waiting{Pending: it, Reason: f.reason, Message: msg})
	p.noteWaitingAs(t.owner.name, t.owner.backfill, t.priority, t.model, func() *state.QueueEntry { return it.Entry }, f.reason)
	plan.tailed++
	return true, nil, nil
}

// passBuffers are the arrays of one entry per queued request that a pass
// fills (byAge's keys, the tail's facts), and its nodes' states and
// rankings, kept in bufferPool between passes: at 20,000 queued and
// 2,000 nodes they are about 4 MB a pass, which the collector otherwise
// reclaims every few passes.
type passBuffers struct {
	gids            []int32
	flat, laid      []ageKey
	radix, radixTmp []radixKey
	order           []int32
	facts           []reqFacts
	tailIns         []tailIn
	posOf           []int32     // each request's ageKey.pos, by its index
	tails           []tailFacts // by ageKey.pos
	// states are the nodes' states of the pass (nodeStates): nothing
	// the pass returns points into them.
	states []nodeState
	// ranks are the pass's node rankings (rankReady, rankFor), each of
	// one entry per node, and spare those of passes before.
	ranks, spare [][]readyRank
	// owners is how many owners the queue of the pass before had: byAge
	// sizes its maps by owner from it, before it knows this pass's.
	owners int
	// The pass's records of one an owner or age group, each kept in one
	// array (at 2,000 owners together about 1.4 MB a pass, which the
	// collector otherwise reclaims every few passes), and byAge's arrays
	// of one entry a group. release clears those that point into a
	// snapshot; a pass writes each element it uses whole (resized).
	ageGroups   []ageGroup
	ages        []*ageGroup
	next        []int32
	counts      []int
	holdGroups  []holdGroup
	ownerQueues []ownerQueue
	tailOwners  []tailOwner
	ownerHolds  []ownerHolds
	// maps are the pass's maps kept between passes (pooledMap), emptied
	// by release: at 2,000 owners, made each pass, they were a third of
	// the bytes it allocated.
	maps passMaps
}

// passMaps are the maps a pass keeps in passBuffers, by what they map.
type passMaps struct {
	nodes                        map[string]*nodeState // planner.byName
	holds                        map[string]bool
	holding                      map[string][]*nodeState
	charge, charged              map[string]int64
	holdOwners                   map[string]*ownerHolds
	held, demand, waiting, large map[string]int64 // entitle's
	ageOwners                    map[string]int32 // byAge's
	ownerGroups                  map[string][]string
	tailOwners                   map[string]*tailOwner
	queues                       map[string]*ownerQueue // order's, of the first priority
}

// clear empties every map, keeping its room.
func (m *passMaps) clear() {
	clear(m.nodes)
	clear(m.holds)
	clear(m.holding)
	clear(m.charge)
	clear(m.charged)
	clear(m.holdOwners)
	clear(m.held)
	clear(m.demand)
	clear(m.waiting)
	clear(m.large)
	clear(m.ageOwners)
	clear(m.ownerGroups)
	clear(m.tailOwners)
	clear(m.queues)
}

// pooledMap is *m, made with room for hint entries where it is nil: a
// map of passBuffers, empty (release clears it), which the pass uses as
// its own and must not keep past its end.
func pooledMap[K comparable, V any](m *map[K]V, hint int) map[K]V {
	if *m == nil {
		*m = make(map[K]V, hint)
	}
	return *m
}

// ranking is an array of n rankings, zeroed, from a pass before where one
// is spare.
func (b *passBuffers) ranking(n int) []readyRank {
	var r []readyRank
	if k := len(b.spare); k > 0 {
		r, b.spare = b.spare[k-1], b.spare[:k-1]
	}
	r = sized(r, n)
	b.ranks = append(b.ranks, r)
	return r
}

// bufferPool holds passBuffers between passes, for any planner.
var bufferPool = sync.Pool{New: func() any { return new(passBuffers) }}

// release clears every buffer that can point into a snapshot to its
// capacity, so that a buffer in the pool holds no entry of a snapshot
// planned before (those of numbers alone are overwritten by the pass
// that takes them: resized).
func (b *passBuffers) release() {
	clear(b.flat[:cap(b.flat)])
	clear(b.laid[:cap(b.laid)])
	clear(b.tailIns[:cap(b.tailIns)])
	clear(b.states[:cap(b.states)])
	for _, r := range b.ranks {
		clear(r[:cap(r)])
		b.spare = append(b.spare, r)
	}
	clear(b.ranks)
	b.ranks = b.ranks[:0]
	clear(b.tails[:cap(b.tails)])
	clear(b.ageGroups[:cap(b.ageGroups)])
	clear(b.ages[:cap(b.ages)])
	clear(b.holdGroups[:cap(b.holdGroups)])
	clear(b.ownerQueues[:cap(b.ownerQueues)])
	clear(b.tailOwners[:cap(b.tailOwners)])
	clear(b.ownerHolds[:cap(b.ownerHolds)])
	b.maps.clear()
}

// resized is s with length n, s itself where its capacity holds n (its
// elements as they are), else a new slice: for a buffer whose every
// element the caller writes.
func resized[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// sized is s with length n, its elements zero: s itself where its
// capacity holds n, else a new slice.
func sized[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}
