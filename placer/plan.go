package placer

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/voyager-gpu/voyager/state"
)

// PlanOptions tune a planning pass.
type PlanOptions struct {
	// Strategy is Binpack (the default), Spread or Pack.
	Strategy Strategy
	// ReserveAfter is how long a 1-GPU request may wait before, if it fits
	// no node in use, it holds the nodes closest to fitting it, so that a
	// stream of small requests cannot starve a large one; a request of g
	// GPUs in all may hold after ReserveAfter/g (hold.go). How many
	// requests of an owner hold nodes is bounded by what its fair share
	// exceeds its holding by. Holding does not move a request ahead of the
	// fair-share order. Zero disables holds, the standing reserve
	// (reserve.go) and lending only short work (lend.go).
	ReserveAfter time.Duration
	// Candidates bounds how many feasible nodes are scored for one part;
	// zero means 16. Like the Kubernetes scheduler's percentageOfNodesToScore
	// it trades a perfect choice for a pass that stays fast at 1,000 nodes.
	Candidates int
	// MaxSessionsPerNode caps the sessions one node holds, so that its
	// ledger (one etcd value) stays far below etcd's request limit. Zero
	// means no cap.
	MaxSessionsPerNode int
	// MaxTxnOps is the operations one bind transaction may hold (etcd's
	// --max-txn-ops or less); zero means state.DefaultMaxTxnOps. A gang
	// whose bind cannot fit one transaction waits as Unsatisfiable with
	// the limit named, instead of being planned and never committed.
	MaxTxnOps int
	// ShortFirst orders each owner's own requests by when each would end
	// if started at its arrival (created plus declared max runtime; none
	// counts as ShortFirstNone), earliest first, instead of oldest first:
	// shortest declared first, aged (issue 40, order.go). The order of
	// owners by fair share is unchanged.
	ShortFirst bool
	// Without turns off some of issue 34's rules for large requests,
	// each alone, the rest of the policy as it is: for measuring what a
	// rule buys (simsuite -without). The placer's settings never set it;
	// with ReserveAfter at zero every one of them is off anyway.
	Without Rules
}

// Rules is a set of the planner's rules for large requests (issue 34)
// that PlanOptions.Without can turn off.
type Rules uint8

// The rules PlanOptions.Without can turn off (placer/README.md, "Fair
// share under a backlog", items 5–7 and 9, and spread's bands).
const (
	// RuleReserve is the standing reserve of whole machines (reserve.go).
	RuleReserve Rules = 1 << iota
	// RuleClaims is claims (claim.go).
	RuleClaims
	// RuleDrainFit is the drain fit (drainfit.go).
	RuleDrainFit
	// RuleBands is spread's bands and its packing of a backlog
	// (spreadwhole.go).
	RuleBands
	// RuleLend is lending only short work (lend.go).
	RuleLend
	// RuleTransfer is draining nodes of owners above their fair share
	// for whole-machine requests of owners below it (transfer.go).
	RuleTransfer
)

// ruleNames names each rule as ParseRules reads it, in String's order.
var ruleNames = []string{"reserve", "claims", "drainfit", "bands", "lend", "transfer"}

// ParseRules reads a comma-separated list of rule names (reserve,
// claims, drainfit, bands, lend, transfer) into a set; empty is none.
func ParseRules(s string) (Rules, error) {
	var out Rules
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		i := slices.Index(ruleNames, f)
		if i < 0 {
			return 0, fmt.Errorf("parse rules: unknown rule %q, want some of %s", f, strings.Join(ruleNames, ", "))
		}
		out |= 1 << i
	}
	return out, nil
}

// String is the set's names, comma-separated, as ParseRules reads them.
func (r Rules) String() string {
	var names []string
	for i, n := range ruleNames {
		if r&(1<<i) != 0 {
			names = append(names, n)
		}
	}
	return strings.Join(names, ",")
}

// on reports whether rule r applies in this pass: PlanOptions.Without
// does not name it. Each rule's own gate (keepsAhead and the like)
// still applies.
func (p *planner) on(r Rules) bool {
	return p.opt.Without&r == 0
}

func (o PlanOptions) txnOps() int {
	if o.MaxTxnOps > 0 {
		return o.MaxTxnOps
	}
	return state.DefaultMaxTxnOps
}

// MaxRayWorkers is the most Ray workers a session may have so that its
// head and workers, each on its own node, bind in one transaction of at
// most maxOps operations (zero: state.DefaultMaxTxnOps), leaving room for
// guards parts (quota guards) on top.
func MaxRayWorkers(maxOps, guards int) int {
	b := state.TxnBudget{MaxOps: maxOps}
	w := 0
	for b.Fits(gangSize(w+2, guards)) {
		w++
	}
	return w
}

// gangSize is the size of the bind transaction of one session of parts
// parts (each on its own node) with guards quota scopes, counting its
// secrets' copies (a Ray gang always has its token).
func gangSize(parts, guards int) state.TxnSize {
	return state.BindSize(parts, 1, parts).Plus(state.QuotaGuardSize(guards)).Plus(state.SecretsSize(parts))
}

// PartPlan is one node's share of a planned session.
type PartPlan struct {
	Node      string
	Role      state.Role
	Worker    int
	Devices   []string
	CPUMilli  int64
	MemoryMiB int64
	Ports     []int
	Scores    map[string]float64
	// Ends is when the part ends at the latest by its session's max
	// runtime, from the plan's clock (state.Allocation.Ends); zero: none.
	Ends time.Time
	// Expects is when it is expected to end by its owner's recent run
	// times, before Ends (state.Allocation.Expects); nil: no estimate.
	Expects *time.Time
}

// Decision binds one session: every part on its own node.
type Decision struct {
	// Pending is the queue entry as the snapshot holds it (shared with
	// the snapshot: read only), as in Waiting: a pass binding 30,000
	// sessions copies no entry.
	Pending  *Pending
	Parts    []PartPlan
	Position int // 1-based place in the queue order of this pass
}

// Waiting is a session left pending by the pass, with why.
type Waiting struct {
	// Pending is the queue entry as the snapshot holds it (shared with
	// the snapshot: read only). A pointer, so that a pass leaving 100,000
	// sessions waiting does not copy each entry again.
	Pending *Pending
	// Position is the 1-based place among the sessions still waiting.
	Position int
	// Reason is "Capacity", "Quota", "Unsatisfiable" or "Cordoned".
	Reason string
	// Message says why in plain words; the caller adds the queue position.
	Message string
}

// Plan is the outcome of one pass over a snapshot.
type Plan struct {
	// Epoch is the plan epoch its binds belong to: the snapshot's
	// (Snapshot.Epoch), or, when the epoch the snapshot plans again could
	// not be planned on it, the new one it starts (Snapshot.Fresh).
	Epoch   int64
	Bound   []Decision
	Waiting []Waiting
	// Reserved maps nodes held for long-waiting requests, or for a
	// preempting session while its victims stop, to the session holding
	// them.
	Reserved map[string]string
	// Standing is the nodes of the standing reserve with GPUs free that
	// no whole-machine request of the pass took: kept free or draining
	// for whole-machine requests expected to arrive (reserve.go). A
	// reserve node whose GPUs are all in use, draining, is kept too but
	// not listed.
	Standing []string
	// reserveKept is how many nodes the standing reserve kept in the
	// pass, full ones draining included, which Standing leaves out
	// (benchmarks read it to know the reserve was in effect).
	reserveKept int
	// tailed is how many requests the tail's path answered (tail.go;
	// tests read it to know the path was taken).
	tailed int
}

// planner is the state of one pass.
type planner struct {
	opt     PlanOptions
	snap    *Snapshot
	elastic *elasticState // fair shares for sizing elastic jobs (elastic.go), made at the first
	nodes   []*nodeState
	byName  map[string]*nodeState
	// sharedNodes and migNodes are the nodes, in nodes' order, with a
	// shared GPU and with a MIG device (nodesOf).
	sharedNodes, migNodes []*nodeState
	buckets               [][]*nodeState // by free whole GPUs
	scorers               []scorer
	// devBufs are best's two buffers for its candidates' devices: each
	// candidate's are chosen into the one the best so far does not use,
	// and only the winner's are copied out.
	devBufs [2][stackDevices]int
	// lenders are the requests of owners below their fair share left
	// waiting for room so far this pass (lend.go).
	lenders []lender
	// failed memoises the shortfall message of part shapes that found no
	// node in this pass: capacity only shrinks within a pass, so the same
	// shape fails again. Past the head of the queue that fits, every
	// request is answered here, without a search (BenchmarkNewPlan/full).
	failed map[shape]failure
	// quotas is whether the snapshot has any quota to check.
	quotas bool
	// holds marks every session some node is reserved for.
	holds map[string]bool
	// collided is set when a pinned session, at its turn, finds any of
	// what it holds (devices, ports, CPU, memory) taken by a session
	// placed before it.
	collided bool
	usage    usage
	// ownerGroups caches groupsOf.
	ownerGroups map[string][]string
	// ages is the queue in age groups (byAge), made once a pass, and
	// facts what the holds read of each request, by its index in the
	// snapshot's queue (reqFacts), made with them.
	ages  []*ageGroup
	facts []reqFacts
	// owners is how many owners the queue has (byAge), for sizing the
	// pass's maps by owner: grown from empty, at 2,000 owners they
	// were a fifth of the bytes a pass allocated.
	owners int
	// tails are the tail facts of the snapshot's queue, by ageKey.pos, and
	// tailShapes the shapes they name, with each one's failure once read
	// from failed (tail.go).
	tails      []tailFacts
	tailShapes []shape
	tailFailed []*failure
	// buf holds the pass's arrays of one entry per queued request, from
	// bufferPool and back to it when the pass ends (tail.go).
	buf *passBuffers
	// holding marks the sessions that hold nodes in this pass, with the
	// nodes they hold. All GPU amounts of the planner are thousandths of
	// a GPU (a fraction is its share).
	holding map[string][]*nodeState
	// holdOwners is each owner's hold budgets and what its holds and
	// claims took (ownerHolds), from entitle on; nil while holds are off
	// or before entitle.
	holdOwners map[string]*ownerHolds
	// charged is the idle GPUs held beyond an owner's budget, counted in
	// its share for the order (by owner), and charge what each such
	// session was charged.
	charged map[string]int64
	charge  map[string]int64
	// holdGen counts the requests that came to hold nodes in the pass:
	// what ownerHolds.mayHold reads changes only then (tailOwner.mayHold).
	holdGen int
	// smallHolds counts the requests holding nodes that ask for no whole
	// machine (wholeParts at whole): the standing reserve is then off
	// (wholeArrivals).
	smallHolds int
	// ranked ranks the nodes by readyBy for each size held for
	// (drain.go); the rank arrays are sortRanks' scratch.
	ranked                           map[int]*ranking
	rankKeys, rankTimes, rankScratch []radixKey
	rankNamed                        []readyRank
	// ownRanks is each (size, owner) pair's walk, and its ranking of
	// the nodes as the owner's holds see them once its searches walked
	// far (ownrank.go); ownRankSlab holds the records.
	ownRanks    map[ownRankKey]*ownRank
	ownRankSlab []ownRank
	// letGo counts the holds let go in the pass (unhold): a ranking's
	// held head is read again after one (ranking.held).
	letGo int
	// reserveOwners is the owners whose whole-machine requests may take
	// a node of the standing reserve (reserve.go).
	reserveOwners map[string]bool
	// claims is the GPUs that aged requests of owners below their fair
	// share, fitting now, claimed in holdLarge (claim.go).
	claims claimState
	// placePart and claimPart are the part that place, and claimFit,
	// searches a node for, reused from request to request: no search
	// keeps its part past its return, and a part each (partOf) was 1.5 MB
	// a pass at 2,000 owners.
	placePart, claimPart part
	// pinned is what each pinned session of the snapshot holds (PinEpoch).
	pinned map[string][]pinnedPart
	// whole is the GPUs of the largest node; levels the free blocks
	// spread keeps, once levelsKnown, and spreadOrders its search order
	// by request size (spreadwhole.go).
	whole        int
	levels       []int
	levelsKnown  bool
	spreadOrders map[int][]int
	// fitsDrains is whether equally scored nodes go by drain fit this
	// pass, and drains memoises drainBy per node for it (drainfit.go).
	fitsDrains bool
	drains     map[*nodeState]drainMemo
	// teams is the team tree of the pass (teams.go); nil without teams.
	teams *teamPlan
	// quota is the usage that quotas are checked against: usage, except
	// that what pinned sessions hold counts from the start, not from
	// their turn. Pinned sessions are bound: a request placed before one
	// of them in the order must fit its owner's quota beside it.
	quota *usage
}

type failure struct{ reason, message string }

// NewPlan plans the whole queue of s: the same snapshot and options always
// give the same plan, so concurrent placers agree on it.
func NewPlan(s *Snapshot, opt PlanOptions) *Plan {
	plan, collided := newPlan(s, opt, nil)
	if !collided {
		return plan
	}
	// A pinned session's devices went to a session before its turn: the
	// epoch was planned on a snapshot that did not show all this one
	// does (each cache is at its own revision, so a queue entry older
	// than the epoch can have been missing from it), and planning it
	// again here places sessions on devices its binds hold. Every reader
	// of this snapshot finds the same: the epoch is left, and the queue
	// planned afresh, the epoch's binds held where they are.
	fresh := *s
	fresh.Pending = make([]Pending, 0, len(s.Pending))
	for _, it := range s.Pending {
		if !it.Pinned {
			fresh.Pending = append(fresh.Pending, it)
		}
	}
	fresh.Epoch = max(s.Fresh, s.Epoch)
	plan, _ = newPlan(&fresh, opt, nil)
	return plan
}

// planEmitting is NewPlan for a snapshot that plans no epoch again (no
// session in it is pinned): such a plan never collides, so it is final as
// it is made, and emit gets each decision of plan.Bound at once, in plan
// order, on the calling goroutine, with what tells which nodes the plan
// has filled (emitFunc). A placer commits them while the plan
// goes on (pass). It reports false, planning nothing, if s pins a session.
func planEmitting(s *Snapshot, opt PlanOptions, emit emitFunc) (*Plan, bool) {
	if slices.ContainsFunc(s.Pending, func(it Pending) bool { return it.Pinned }) {
		return nil, false
	}
	plan, _ := newPlan(s, opt, emit)
	return plan, true
}

// emitFunc gets a decision as the plan makes it, with full, which reports
// whether a node has no GPU device left free in the plan so far; both are
// valid only during the call.
type emitFunc func(d Decision, full func(node string) bool)

// full reports whether the named node has no GPU device left free in the
// plan so far (or is not in the snapshot).
func (p *planner) full(name string) bool {
	n := p.byName[name]
	return n == nil || n.usedGPU >= n.totalGPU
}

// newPlan plans s; collided reports that a pinned session found some of
// what it holds already taken at its turn. emit, if set, gets each
// decision as it is made.
func newPlan(s *Snapshot, opt PlanOptions, emit emitFunc) (plan *Plan, collided bool) {
	if opt.Candidates <= 0 {
		opt.Candidates = 16
	}
	if opt.Strategy == "" {
		opt.Strategy = Binpack
	}
	p := &planner{opt: opt, snap: s, failed: map[shape]failure{},
		scorers: scorers(opt.Strategy), quotas: len(s.UserQuotas)+len(s.GroupQuotas) > 0}
	p.buf = bufferPool.Get().(*passBuffers) // tail.go
	p.byName, p.holds = pooledMap(&p.buf.maps.nodes, len(s.Nodes)), pooledMap(&p.buf.maps.holds, 0)
	defer func() {
		p.buf.release()
		bufferPool.Put(p.buf)
	}()
	maxFree := 0
	var states []nodeState
	if s.Cache != nil {
		states = s.Cache.nodeStates(s, p.buf.states)
	} else {
		states = sized(p.buf.states, len(s.Nodes))
		for i := range s.Nodes {
			initNodeState(&states[i], &s.Nodes[i])
		}
	}
	p.buf.states = states
	p.nodes = make([]*nodeState, 0, len(s.Nodes))
	for i := range states {
		n := &states[i]
		n.maxSessions = opt.MaxSessionsPerNode
		p.nodes = append(p.nodes, n)
		p.byName[n.name] = n
		p.whole = max(p.whole, n.totalGPU)
	}
	p.releasePinned()
	for _, n := range p.nodes {
		maxFree = max(maxFree, n.freeGPUs)
	}
	if !slices.IsSortedFunc(p.nodes, byNodeName) {
		slices.SortFunc(p.nodes, byNodeName)
	}
	p.buckets = make([][]*nodeState, maxFree+1)
	for i, n := range p.nodes {
		n.byName = int32(i)
		p.index(n)
		if n.shares != nil {
			p.sharedNodes = append(p.sharedNodes, n)
		}
		if n.migs > 0 {
			p.migNodes = append(p.migNodes, n)
		}
	}
	if opt.Strategy == Spread && p.packsBacklog() { // spreadwhole.go
		p.opt.Strategy, p.scorers = Binpack, scorers(Binpack)
	}
	p.fitsDrains = p.opt.Strategy != Pack && p.on(RuleDrainFit) && len(p.blockLevels()) > 0 && !p.deepBacklog() // drainfit.go
	p.usage = newUsage(p.nodes, p.pinned)
	p.quota = &p.usage
	p.teams = newTeamPlan(s, p.nodes, p.usage.total, p.pinned)
	p.quotas = p.quotas || p.teams != nil && p.teams.maxima
	if p.pinned != nil {
		q := newUsage(p.nodes, nil)
		p.quota = &q
	}

	plan = &Plan{Epoch: s.Epoch, Reserved: map[string]string{}, Waiting: make([]Waiting, 0, len(s.Pending))}
	if len(s.Held) > 0 {
		pending := make(map[string]*state.QueueEntry, len(s.Pending))
		for i := range s.Pending {
			if !s.Pending[i].Pinned {
				pending[s.Pending[i].Entry.Session] = s.Pending[i].Entry
			}
		}
		for name, id := range s.Held {
			if n := p.byName[name]; n != nil && pending[id] != nil {
				n.reservedFor, n.reservedWhat = id, describe(&pending[id].Request)
				p.holds[id] = true
				plan.Reserved[name] = id
			}
		}
	}
	p.holdLarge(plan)
	p.standingReserve(plan)
	p.transferReserve(plan)
	order := p.order()
	p.gatherTail() // tail.go
	position := 0
	for it, pos, pinned := order.next(); it != nil; it, pos, pinned = order.next() {
		position++
		if pinned {
			p.placePinned(it, plan)
			order.placed(it.Entry, p)
			continue
		}
		waits, open, failed := p.tailWaits(it, pos, plan)
		if waits {
			continue
		}
		var (
			d  Decision
			ok bool
		)
		if open != nil { // on the tail's path: neither elastic nor pinned
			d, ok = p.placeOpen(it, position, plan, open, failed)
		} else {
			d, ok = p.placeElastic(it, position, plan)
		}
		if ok {
			plan.Bound = append(plan.Bound, d)
			order.placed(it.Entry, p)
			if emit != nil {
				emit(d, p.full)
			}
		} else if w := len(plan.Waiting); w > 0 && plan.Waiting[w-1].Pending.Entry.Session == it.Entry.Session {
			p.noteWaiting(it.Entry, plan.Waiting[w-1].Reason) // lend.go
		}
	}
	p.standing(plan)
	// Positions among the still waiting, in processing order.
	for i := range plan.Waiting {
		plan.Waiting[i].Position = i + 1
	}
	return plan, p.collided
}

func byNodeName(a, b *nodeState) int { return strings.Compare(a.name, b.name) }

// index puts n in the bucket of its free whole GPUs.
func (p *planner) index(n *nodeState) {
	b := n.freeGPUs
	n.bucket = b
	n.pos = len(p.buckets[b])
	p.buckets[b] = append(p.buckets[b], n)
}

// reindex moves n after its free GPU count changed.
func (p *planner) reindex(n *nodeState) {
	if n.freeGPUs == n.bucket {
		return
	}
	bk := p.buckets[n.bucket]
	last := bk[len(bk)-1]
	bk[n.pos] = last
	last.pos = n.pos
	p.buckets[n.bucket] = bk[:len(bk)-1]
	p.index(n)
}

// place tries to bind it; on failure it records a Waiting entry.
func (p *planner) place(it *Pending, position int, plan *Plan) (Decision, bool) {
	return p.placeOpen(it, position, plan, nil, nil)
}

// placeOpen is place for a request whose tail facts are open where it is
// on the tail's path (tailWaits left it to place), with failed its
// shape's failure in this pass, if any; nil for any other request.
func (p *planner) placeOpen(it *Pending, position int, plan *Plan, open *tailFacts, failed *failure) (Decision, bool) {
	e := it.Entry
	budget := state.TxnBudget{MaxOps: p.opt.MaxTxnOps}
	scopes := 0
	if p.quotas {
		scopes = len(quotaScopes(e, p.snap))
	}
	quotaChecked := false
	// With open, the tail probed the same shape the block below probes
	// the memo with (the pass's quotas, holds, budgets and reserve
	// owners as gatherTail read them), so failed answers as it would,
	// and e's owner's facts are read from open rather than by its name.
	if open != nil {
		if failed != nil && !p.mayHoldOpen(open) {
			plan.Waiting = append(plan.Waiting, Waiting{Pending: it, Reason: failed.reason, Message: p.teamNote(e, failed.reason, failed.message)})
			return Decision{}, false
		}
	} else if e.Workers == 0 && !p.holds[e.Session] && budget.Fits(gangSize(1, scopes)) {
		// The tail of the queue: a single part of a shape that found no
		// node earlier in this pass waits at once, on that shape's reason,
		// without building parts or searching nodes, unless it may hold
		// nodes (hold.go): then it goes on to hold them.
		if p.quotas {
			var need amounts
			need.addReq(&e.Request, p.usage.shareRef)
			if reason, msg, ok := p.allows(e, need); !ok {
				plan.Waiting = append(plan.Waiting, Waiting{Pending: it, Reason: reason, Message: msg})
				return Decision{}, false
			}
			quotaChecked = true
		}
		probe := p.tailProbe(e, p.ownerHoldsOf(e.Owner).budget > 0, p.reserveOwners[e.Owner], p.snap.Runtimes[e.Owner]) // tail.go
		if f, ok := p.failed[shapeOf(&probe)]; ok && !p.mayHold(e) {
			plan.Waiting = append(plan.Waiting, Waiting{Pending: it, Reason: f.reason, Message: p.teamNote(e, f.reason, f.message)})
			return Decision{}, false
		}
	}
	reqs := partsOf(e)
	if size := gangSize(len(reqs), scopes); !budget.Fits(size) {
		what, most := fmt.Sprintf("a Ray head and %d workers", len(reqs)-1), MaxRayWorkers(p.opt.MaxTxnOps, scopes)
		ask := fmt.Sprintf("at most %d workers", most)
		if e.Nodes > 1 {
			what, ask = "a multi-node job", fmt.Sprintf("at most %d nodes", most+1)
		}
		plan.Waiting = append(plan.Waiting, Waiting{Pending: it, Reason: "Unsatisfiable", Message: fmt.Sprintf(
			"a session on %d nodes (%s) binds in one transaction of %d operations, above the limit of %d (VOYAGER_PLACER_MAX_TXN_OPS, at most etcd's --max-txn-ops); ask for %s",
			len(reqs), what, size.Ops(), p.opt.txnOps(), ask)})
		return Decision{}, false
	}
	if p.quotas && !quotaChecked {
		var need amounts
		for i := range reqs {
			need.addReq(&reqs[i], p.usage.shareRef)
		}
		if reason, msg, ok := p.allows(e, need); !ok {
			plan.Waiting = append(plan.Waiting, Waiting{Pending: it, Reason: reason, Message: msg})
			return Decision{}, false
		}
	}
	if msg := p.shortOnly(e, open); msg != "" { // lend.go
		plan.Waiting = append(plan.Waiting, Waiting{Pending: it, Reason: "Capacity", Message: p.teamNote(e, "Capacity", msg)})
		return Decision{}, false
	}
	var (
		d       Decision
		chosen  []*nodeState
		exclude map[string]bool // nodes taken by this session's earlier parts
	)
	for i := range reqs {
		pt := &p.placePart
		if open != nil {
			*pt = p.partOwned(e, reqs, i, open.owner)
		} else {
			*pt = p.partAt(e, reqs, i)
		}
		role := pt.role
		n, devs, scores, fail := p.best(pt, exclude)
		if n == nil {
			for _, c := range chosen {
				c.unreserve(e.Session)
				p.reindex(c)
			}
			if open != nil && p.mayHoldOpen(open) || open == nil && p.mayHold(e) {
				p.holdFor(e, reqs, plan)
			}
			if held := p.holding[e.Session]; len(held) > 0 {
				fail.message = p.heldMessage(e, reqs, held)
			}
			plan.Waiting = append(plan.Waiting, Waiting{Pending: it, Reason: fail.reason, Message: p.teamNote(e, fail.reason, fail.message)})
			return Decision{}, false
		}
		if d.Parts == nil {
			d = Decision{Pending: it, Position: position, Parts: make([]PartPlan, 0, len(reqs))}
		}
		uuids := make([]string, 0, len(devs))
		for _, di := range devs {
			uuids = append(uuids, n.devices[di].uuid)
		}
		alloc := allocation(e, PartPlan{Role: role, Devices: uuids, CPUMilli: pt.req.CPUMilli, MemoryMiB: pt.req.MemoryMiB, Ports: n.freePorts(pt.ports), Ends: pt.bound, Expects: expectsOf(pt)})
		n.reserve(e.Session, alloc, devs)
		p.reindex(n)
		chosen = append(chosen, n)
		if len(reqs) > 1 {
			if exclude == nil {
				exclude = make(map[string]bool, len(reqs))
			}
			exclude[n.name] = true
		}
		worker := 0
		if role == state.RoleWorker {
			worker = i
		}
		d.Parts = append(d.Parts, PartPlan{Node: n.name, Role: role, Worker: worker, Devices: alloc.GPUs,
			CPUMilli: alloc.CPUMilli, MemoryMiB: alloc.MemoryMiB, Ports: alloc.Ports, Scores: scores, Ends: alloc.Ends, Expects: alloc.Expects})
	}
	for _, c := range chosen {
		if c.reservedFor == e.Session {
			p.unhold(c, plan)
		}
	}
	if c := p.charge[e.Session]; c > 0 {
		p.charged[e.Owner] -= c // its own GPUs count now
		p.teams.charge(e.Team, -c)
	}
	// Placed elsewhere than some node it held (binpack's choice among
	// equally empty nodes): the rest of the pass may use that node,
	// unless the part took a node of the standing reserve instead. Then
	// the held node takes its place in the reserve: else the reserve
	// was a node short for the rest of the pass, and small sessions of
	// another owner took the held node (short-8-long-1: a whole machine
	// a pass, where they run for hours).
	var took []*nodeState
	if len(p.holding[e.Session]) > 0 {
		for _, c := range chosen {
			if c.reservedFor == reserveMark {
				took = append(took, c)
			}
		}
	}
	for _, c := range p.holding[e.Session] {
		if c.reservedFor != e.Session {
			continue
		}
		p.unhold(c, plan)
		if len(took) > 0 && c.totalGPU >= took[0].totalGPU {
			c.reservedFor, c.reservedWhat, c.drainBy = reserveMark, took[0].reservedWhat, took[0].drainBy
			took = took[1:]
		}
	}
	p.usage.add(e, reqs)
	if p.teams != nil {
		p.teams.addRequest(e, reqs, p.usage.shareRef)
		p.teams.models.addParts(e, d.Parts) // teammodels.go
	}
	if p.quota != &p.usage {
		p.quota.add(e, reqs)
	}
	return d, true
}

// allocation is what session e holds on pp's node, as ledgers record it:
// the session's kind, owner, groups, priority and preemptibility with the
// part's role, devices, CPU, memory and ports.
func allocation(e *state.QueueEntry, pp PartPlan) state.Allocation {
	return state.Allocation{
		Kind: e.Kind, Owner: e.Owner, Groups: e.Groups, Team: e.Team, Priority: e.Priority, Preemptible: e.Preemptible,
		Role: pp.Role, GPUs: pp.Devices, Share: partShare(e, pp.Role), CPUMilli: pp.CPUMilli, MemoryMiB: pp.MemoryMiB, Ports: pp.Ports, Ends: pp.Ends, Expects: pp.Expects,
		GPUModel: partModel(e, pp.Role), // teammodels.go
	}
}

// nodesOf is the pass's nodes, in order, that may have devices of r's
// kind: those with a shared GPU for a fraction, with a MIG device for a
// MIG profile (nodeState.lacksKind), every node otherwise. The searches
// that read every node read these; at 2,000 nodes most have neither.
func (p *planner) nodesOf(r *state.Resources) []*nodeState {
	switch {
	case r.GPUs == 0 || modelScanReference:
		return p.nodes
	case r.Fraction():
		return p.sharedNodes
	case r.MIGProfile != "":
		return p.migNodes
	}
	return p.nodes
}

// best returns the highest scoring feasible node for pt, with the devices
// to use, or the reason none fits.
func (p *planner) best(pt *part, exclude map[string]bool) (*nodeState, []int, map[string]float64, failure) {
	// A session that holds nodes may use them where others of its shape
	// may not: it neither reads nor writes the memo.
	key, memo := shape{}, len(exclude) == 0 && !p.holds[pt.id]
	if memo {
		key = shapeOf(pt)
		if f, ok := p.failed[key]; ok {
			return nil, nil, nil, f
		}
	}
	var (
		bestN    *nodeState
		bestDevs []int
		bestVals [2]float64 // per scorer, for the winner only
		bestC    candidate
		found    int
		spare    int // the buffer of p.devBufs the best so far does not use
	)
	// Spread ranks a band's nodes by drain fit first (drainfit.go).
	band := p.fitsDrains && p.opt.Strategy == Spread
	consider := func(n *nodeState) bool {
		if exclude[n.name] || !fits(pt, n) {
			return false
		}
		devs := choosePartInto(n, pt, p.devBufs[spare][:0])
		var vals [2]float64
		c := candidate{tie: tieBreak(pt.id, n.name)}
		for i, s := range p.scorers {
			vals[i] = s.score(pt, n, devs)
			c.total += s.weight * vals[i]
		}
		if p.fitsDrains {
			c.fit = drainFit(pt.ends, p.drainOf(n))
		}
		if bestN == nil || c.beats(bestC, band) {
			bestN, bestDevs, bestVals, bestC = n, devs, vals, c
			spare ^= 1
		}
		found++
		return found >= p.opt.Candidates
	}
	if pt.req.MIGProfile != "" || pt.req.Fraction() || len(p.buckets) == 0 {
		// Every node in order, those without the devices pt asks for free
		// passed over before the filters (gpusFit): the buckets do so for
		// whole GPUs. At 2,000 nodes most nodes are (a fraction fits only
		// a shared GPU, a MIG request only its profile's devices), and
		// each filter's refusal writes its reason, which a search throws
		// away: with 2,500 fractions waiting, most of the pass
		// (BenchmarkNewPlanDeviceKinds).
		for _, n := range p.nodesOf(pt.req) {
			if (modelScanReference || gpusFit(pt, n)) && consider(n) {
				break
			}
		}
	} else {
		last := -1 // the bucket visited before, for spread's bands
		for k := pt.req.GPUs; k < len(p.buckets); k++ {
			b := k // binpack: the fullest that fits first
			if p.opt.Strategy == Spread {
				b = p.spreadBucket(pt, k-pt.req.GPUs) // the emptiest first (spreadwhole.go)
			}
			if band && found > 0 && b > last { // a band ends where the order turns emptier
				break
			}
			last = b
			bk := p.buckets[b]
			if len(bk) == 0 {
				continue
			}
			start := int(tieBreak(pt.id, "") % uint64(len(bk)))
			for i := 0; i < len(bk); i++ {
				if consider(bk[(start+i)%len(bk)]) {
					break
				}
			}
			if found >= p.opt.Candidates || found > 0 && p.opt.Strategy != Pack && !band { // pack looks on through the buckets (pack.go), spread through its band
				break
			}
		}
	}
	if bestN != nil {
		scores := make(map[string]float64, len(p.scorers)+1)
		for i, s := range p.scorers {
			scores[s.name] = bestVals[i]
		}
		if p.fitsDrains {
			scores["drain"] = bestC.fit
		}
		return bestN, slices.Clone(bestDevs), scores, failure{}
	}
	if len(p.holding[pt.id]) > 0 {
		// A request holding nodes waits on them: its reason names them
		// (heldMessage), so no search for the best node's shortfall.
		return nil, nil, nil, failure{reason: "Capacity"}
	}
	f := p.explain(pt, exclude)
	if memo {
		p.failed[key] = f
	}
	return nil, nil, nil, f
}

// explain turns every node's shortfall for pt into one plain reason.
func (p *planner) explain(pt *part, exclude map[string]bool) failure {
	want := describe(pt.req)
	if len(p.nodes) == 0 {
		return failure{"Capacity", fmt.Sprintf("waiting for %s: no nodes are registered", want)}
	}
	var (
		cordoned, capable int
		bestFree          = -1
		bestMsg           string
		m                 = &modelMatcher{pattern: pt.req.GPUModel} // modelmatch.go
		whole             = pt.req.MIGProfile == "" && !pt.req.Fraction() && !modelScanReference
	)
	// Once a capable node that is not cordoned is known, the counts can
	// only say "Capacity": a node then matters only if it may beat the
	// best, and one whose free whole GPUs cannot is passed over before
	// its devices are read (at 2,000 nodes most of a failed search).
	open := false
	for _, n := range p.nodesOf(pt.req) {
		if exclude[n.name] {
			continue
		}
		if open && whole && n.freeGPUs <= bestFree {
			continue // its free GPUs of pt's kind cannot beat the best
		}
		if filterLabels(pt, n) != nil {
			continue
		}
		if pt.req.GPUs > 0 && n.capacityDevicesWith(pt.req, m) < pt.req.GPUs {
			continue
		}
		if pt.req.CPUMilli > n.view.Node.CPUMilli || pt.req.MemoryMiB > n.view.Node.MemoryMiB {
			continue
		}
		capable++
		if n.view.Cordon != nil {
			cordoned++
			continue
		}
		open = true // bestFree is -1 until now: the first open node is read
		free := n.freeDevicesWith(pt.req, m)
		if free > bestFree {
			bestFree = free
			if s := feasible(pt, n); s != nil && s.Filter != "gpus" {
				bestMsg = s.Message
			} else {
				bestMsg = ""
			}
		}
	}
	switch {
	case capable == 0:
		return failure{"Unsatisfiable", fmt.Sprintf("no node can ever hold %s: %s", want, p.largest(pt.req))}
	case cordoned == capable:
		return failure{"Cordoned", fmt.Sprintf("waiting for %s: every node that could hold it is cordoned", want)}
	case pt.req.GPUs == 0 || bestMsg != "":
		if bestMsg == "" {
			bestMsg = "no node has the CPU and memory free"
		}
		return failure{"Capacity", fmt.Sprintf("waiting for %s: %s", want, bestMsg)}
	}
	return failure{"Capacity", fmt.Sprintf("waiting for %s: the best node has %d free", want, bestFree)}
}

// largest describes the biggest node for an Unsatisfiable message.
func (p *planner) largest(r *state.Resources) string {
	maxDev, maxCPU, maxMem := 0, int64(0), int64(0)
	for _, n := range p.nodes {
		if c := n.capacityDevices(r); c > maxDev {
			maxDev = c
		}
		maxCPU = max(maxCPU, n.view.Node.CPUMilli)
		maxMem = max(maxMem, n.view.Node.MemoryMiB)
	}
	return fmt.Sprintf("the largest node has %d matching GPUs, %s CPU and %d MiB memory", maxDev, milli(maxCPU), maxMem)
}

// partsOf is e.Parts() without its copies for the single part most
// requests are: e's own Request, shared with the snapshot as every part's
// req is (read only), where Parts copies the entry and allocates a slice
// for the copy (at 2,000 owners a fifth of a pass's allocations).
func partsOf(e *state.QueueEntry) []state.Resources {
	if e.Workers == 0 {
		return unsafe.Slice(&e.Request, 1)
	}
	return e.Parts()
}

// partOf is part i of e, whose parts are reqs: the single part, or the
// Ray head (0) and its workers; it ends by e's max runtime.
func (p *planner) partOf(e *state.QueueEntry, reqs []state.Resources, i int) *part {
	pt := p.partAt(e, reqs, i)
	return &pt
}

// partAt is partOf's part as a value, for a caller that only reads it
// (no allocation: the holds ask thousands of requests' shapes a pass).
func (p *planner) partAt(e *state.QueueEntry, reqs []state.Resources, i int) part {
	return p.partWith(e, reqs, i, p.ownerHoldsOf(e.Owner), p.snap.Runtimes[e.Owner])
}

// partOwned is partAt for a request on the tail's path, whose owner's
// facts o holds (tailWaits): the same part, found without hashing the
// owner's name.
func (p *planner) partOwned(e *state.QueueEntry, reqs []state.Resources, i int, o *tailOwner) part {
	oh := o.holds
	if oh == nil { // holds off: ownerHoldsOf's
		oh = &noHolds
	}
	return p.partBelow(e, reqs, i, oh, o.estimates, o.below)
}

// partWith is partAt for e whose owner's holds are oh and run-time record
// rec, which the holds' merge finds once an owner (at 2,000 owners
// finding them by name for each request was 2% of the pass).
func (p *planner) partWith(e *state.QueueEntry, reqs []state.Resources, i int, oh *ownerHolds, rec *state.RuntimeRecord) part {
	return p.partBelow(e, reqs, i, oh, rec, p.reserveOwners[e.Owner])
}

// partBelow is partWith where whether e's owner may take the standing
// reserve is known (below).
func (p *planner) partBelow(e *state.QueueEntry, reqs []state.Resources, i int, oh *ownerHolds, rec *state.RuntimeRecord, below bool) part {
	role := state.RoleSingle
	if e.Workers > 0 || e.Nodes > 1 { // a multi-node job on one machine (elastic_nodes.go) is still its rank 0
		role = state.RoleHead
		if i > 0 {
			role = state.RoleWorker
		}
	}
	ends, bound := p.endsBy(e, rec)
	return part{req: &reqs[i], role: role, ports: e.Ports(role), id: e.Session, owner: e.Owner, ends: ends, bound: bound,
		backfill: oh.mayBackfill(e), below: below, now: p.snap.Now}
}

// describe writes a request the way a person would ask for it: "8×A100-80GB".
func describe(r *state.Resources) string {
	if r.GPUs == 0 {
		return fmt.Sprintf("%s CPU and %d MiB memory", milli(r.CPUMilli), r.MemoryMiB)
	}
	if r.Fraction() {
		return describeShare(r)
	}
	if r.GPUModel == "" && r.MIGProfile == "" && r.GPUMemoryMiB == 0 && r.GPUs < len(plainGPUWords) {
		// Most requests: written once, not each time a reason or a hold
		// names one (fmt here was 2.5% of a pass at 2,000 owners).
		return plainGPUWords[r.GPUs]
	}
	model := "GPU"
	if r.GPUModel != "" {
		model = strings.Trim(r.GPUModel, "*")
	}
	if r.MIGProfile != "" {
		model += " MIG " + r.MIGProfile
	}
	s := strconv.Itoa(r.GPUs) + "×" + model
	if r.GPUMemoryMiB > 0 {
		s += " with ≥" + strconv.FormatInt(r.GPUMemoryMiB, 10) + " MiB"
	}
	return s
}

// plainGPUWords is describe's words for n GPUs of any model, by n, up
// to the most GPUs a node is likely to have and more.
var plainGPUWords = func() []string {
	w := make([]string, 65)
	for n := range w {
		w[n] = strconv.Itoa(n) + "×GPU"
	}
	return w
}()

// shape identifies requests that are interchangeable for placement: a
// comparable value, so that looking one up allocates nothing (the selector
// is written out only for requests that have one).
type shape struct {
	numbers
	model, mig string
	selector   string
	share      shareShape
}

// numbers is the part of a shape that holds no string: all of it for a
// request of whole GPUs of any model with no selector (plainReq), which
// the tail interns by it alone (tail.go).
type numbers struct {
	gpus     int
	gpuMem   int64
	cpu, mem int64
	ports    int
	// ends: parts that end at different times may backfill different
	// held nodes.
	ends int64
	// below: the owner is below its fair share and may take a node of
	// the standing reserve (reserve.go).
	below bool
}

// numbersOf is the numbers of pt's shape.
func numbersOf(pt *part) numbers {
	k := reqNumbers(pt.req, pt.ports)
	k.below = pt.below
	if pt.backfill && !pt.ends.IsZero() {
		k.ends = pt.ends.UnixNano()
	}
	return k
}

// reqNumbers is the numbers a request's resources r and its count of
// ports give a shape, before what its owner adds (below, ends).
func reqNumbers(r *state.Resources, ports int) numbers {
	return numbers{gpus: r.GPUs, gpuMem: r.GPUMemoryMiB, cpu: r.CPUMilli, mem: r.MemoryMiB, ports: ports}
}

// plainReq reports whether r's shape is its numbers alone: it names no
// model, profile or selector and asks for no fraction.
func plainReq(r *state.Resources) bool {
	return r.GPUModel == "" && r.MIGProfile == "" && len(r.NodeSelector) == 0 && !r.Fraction()
}

// shapeOf is pt's shape.
func shapeOf(pt *part) shape {
	r := pt.req
	k := shape{numbers: numbersOf(pt), model: r.GPUModel, mig: r.MIGProfile, share: shareShapeOf(pt)}
	if len(r.NodeSelector) > 0 {
		keys := make([]string, 0, len(r.NodeSelector))
		for key := range r.NodeSelector {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		var b strings.Builder
		for _, key := range keys {
			b.WriteString(strconv.Quote(key) + "=" + strconv.Quote(r.NodeSelector[key]) + ";")
		}
		k.selector = b.String()
	}
	return k
}
