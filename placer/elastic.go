package placer

import (
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/voyager-gpu/voyager/state"
)

// Elastic jobs (state.Elastic) run at any size from a minimum to a maximum
// of GPUs on one machine (ranges of machines: elastic_nodes.go). Two
// decisions are made here, both pure:
//
//   - At its turn in the plan's order, a queued elastic job is bound at
//     the largest size from its cap (Elastic.Cap: its maximum, or the size
//     its last resize asked for) down to its minimum that fair share allows
//     (its owner's water-filled share of the cluster's GPUs, given every
//     owner's holding and waiting demand, less what it holds) and that some
//     node holds now; if none does, it waits at its minimum like any
//     request (placeElastic).
//   - For running elastic jobs, PlanElastic decides resizes: a shrink
//     (never below the minimum) when a session waits for capacity that the
//     job's GPUs would let fit and fair share owes the waiter them (a
//     higher priority, or an owner first down the team tree, then holding
//     less: elasticteams.go); a grow when GPUs sit idle
//     on the job's node and nothing waits for capacity that fair share
//     prefers. Shrinks come before any preemption of fixed-size work: the
//     lifecycle controller lets the sessions a shrink serves wait for it.
//
// A resize is a restart at the new size (lifecycle/elastic.go): the job is
// stopped with its checkpoint grace, released, and queued again with its
// cap at the new size.

// elasticState is what planning elastic jobs derives once per plan: each
// owner's fair share of the cluster's GPUs, in thousandths, and what it
// held when the plan began.
type elasticState struct {
	share, held map[string]int64
}

// placeElastic places it as place does; an elastic job (not pinned, one
// part) first gets its size: the largest from its cap down to its minimum
// that fair share and its quotas allow and some node holds now, else its
// minimum.
func (p *planner) placeElastic(it *Pending, position int, plan *Plan) (Decision, bool) {
	e := it.Entry
	if e.Elastic != nil && e.Elastic.ByNodes() {
		return p.placeElasticNodes(it, position, plan) // elastic_nodes.go
	}
	if e.Elastic == nil || it.Pinned || e.Workers > 0 || e.Request.Fraction() || e.Elastic.Min < 1 {
		return p.place(it, position, plan)
	}
	hi := min(e.Elastic.Cap(), p.fairCap(e))
	for size := hi; size > e.Elastic.Min; size-- {
		sized := sizedPending(it, size)
		if p.quotas {
			// A size its owner's quota refuses would wait on the quota
			// every pass while a smaller one is allowed.
			var need amounts
			need.addReq(&sized.Entry.Request, p.usage.shareRef)
			if _, _, ok := p.quota.quotaAllows(sized.Entry, need, p.snap); !ok {
				continue
			}
		}
		if n, _, _, _ := p.best(p.partOf(sized.Entry, []state.Resources{sized.Entry.Request}, 0), nil); n != nil {
			return p.place(sized, position, plan)
		}
	}
	return p.place(sizedPending(it, e.Elastic.Min), position, plan)
}

// sizedPending is a copy of it asking for size GPUs, its Elastic.Size the
// size: the bind writes that into the status. The cached entry is shared
// and never changed.
func sizedPending(it *Pending, size int) *Pending {
	e := *it.Entry
	el := *e.Elastic
	el.Size = size
	e.Elastic, e.Request.GPUs = &el, size
	return &Pending{Entry: &e, Revision: it.Revision}
}

// fairCap is the most GPUs e's owner may take now by fair share: its
// water-filled share of the cluster's GPUs, given what every owner holds
// and waits for (an elastic job at its cap), less what it holds; at least
// e's minimum.
func (p *planner) fairCap(e *state.QueueEntry) int {
	if p.elastic == nil {
		p.elastic = elasticShares(p.snap, p.usage.total.gpus, p.ownerWeight, p.usage.shareRef)
	}
	left := (p.elastic.share[e.Owner] - p.elastic.held[e.Owner]) / 1000
	return max(e.Elastic.Min, int(left))
}

// elasticShares computes every owner's water-filled share of total (in
// thousandths of a GPU) from the ledgers' holdings and the queue's demand.
func elasticShares(s *Snapshot, total int64, weight func(string) float64, shareRef int64) *elasticState {
	held := map[string]int64{}
	for i := range s.Nodes {
		for _, a := range s.Nodes[i].Ledger.Allocations {
			held[a.Owner] += a.MilliGPUs()
		}
	}
	demand := make(map[string]int64, len(held))
	for o, g := range held {
		demand[o] = g
	}
	for i := range s.Pending {
		it := &s.Pending[i]
		if it.Pinned {
			continue
		}
		if el := it.Entry.Elastic; el != nil && !el.ByNodes() && it.Entry.Workers == 0 {
			demand[it.Entry.Owner] += 1000 * int64(el.Cap())
			continue
		}
		demand[it.Entry.Owner] += requestGPUs(it.Entry, shareRef)
	}
	return &elasticState{share: waterFill(total, demand, weight), held: held}
}

// ElasticJob is a running elastic job as PlanElastic sees it: its range,
// and whether it may be resized now.
type ElasticJob struct {
	Session  string
	Min, Max int
	// Ready: running, not stopping, and past the resize rate limit.
	Ready bool
	// Target, when above 0, is the size a resize already decided takes
	// it to: the job counts at that size, and is not decided again.
	Target int
	// Nodes: Min, Max and Target count machines, not GPUs (a range of
	// machines, elastic_nodes.go), and Part is each machine's request.
	Nodes bool
	Part  state.Resources
	// Goodput is what the job reported of its throughput at the sizes it
	// ran at (Status.Goodput): with ElasticOptions.Goodput, the planner's
	// estimate of what a GPU more or less adds or takes (goodput.go).
	Goodput []state.GoodputSample
	// Claim, for a job of a range of GPUs whose resize is under way (its
	// Target set) and that holds no allocation (released, not yet bound
	// again), is the node the resize was decided on: PlanElastic counts it
	// there at Target, owned by Owner (Team, Groups, Priority), so that no
	// other job grows into the GPUs it is to run on (elastic_claims.go).
	Claim    string
	Owner    string
	Team     string
	Groups   []string
	Priority int
}

// Resize is one decision of PlanElastic: Session, holding From GPUs on
// Node, is to run at To GPUs.
type Resize struct {
	Session  string
	Node     string
	From, To int
	// For is the waiting session a shrink makes room for; empty for a
	// grow.
	For string
	// ForRevision is For's queue entry revision, which the decision read.
	ForRevision int64
	// Deferred: the shrink is owed but the job may not resize yet (its
	// rate limit): its waiter still waits for it rather than preempt.
	Deferred bool
	// Why says the decision in plain words, for the warning, the status
	// and the events.
	Why string
	// Nodes: From and To count machines (a range of machines); Ledgers
	// are then every node whose ledger the decision read (the job's, and
	// those it grows onto or its waiter takes), Node its head's.
	Nodes   bool
	Ledgers []string
	// Claims are, for a grow, the jobs whose resize is under way with a
	// claim on its node that the decision counted (elastic_claims.go):
	// the grow's warning compares their specs as read.
	Claims []string
}

// ElasticOptions tune PlanElastic.
type ElasticOptions struct {
	// Max bounds the resizes one pass decides. Default 8.
	Max int
	// Freeing are sessions being stopped: a waiter that fits once they
	// have released their room needs no shrink, but their GPUs are not
	// idle yet, so no job grows into them.
	Freeing map[string]bool
	// Goodput: grows and shrinks prefer the jobs whose reported goodput
	// gains the most, or loses the least, per GPU (goodput.go).
	Goodput bool
}

// PlanElastic decides resizes of running elastic jobs (jobs, by session),
// given the plan NewPlan made of s: shrinks for sessions the plan left
// waiting for capacity that fair share owes the GPUs (in plan order, the
// smallest shrink of one job on one node that lets the waiter fit), then
// grows into idle GPUs while nothing waits for capacity that fair share
// prefers. Jobs over a range of machines (ElasticJob.Nodes) shrink, when no
// range of GPUs serves a waiter, and grow, after them, by whole parts
// (elastic_nodes.go). Like NewPlan it is pure and deterministic.
func PlanElastic(s *Snapshot, plan *Plan, jobs map[string]ElasticJob, opt ElasticOptions) []Resize {
	if len(jobs) == 0 {
		return nil
	}
	if opt.Max <= 0 {
		opt.Max = 8
	}
	jobs, nj := splitNodeJobs(jobs) // ranges of machines: elastic_nodes.go
	views, names := planViews(s, plan)
	nj.locate(views, names)
	claims := addClaims(views, jobs) // elastic_claims.go
	// Jobs already being resized count at their target size.
	where := map[string]string{} // elastic session → node
	for _, name := range names {
		v := views[name]
		for id := range v.Ledger.Allocations {
			if j, ok := jobs[id]; ok {
				where[id] = name
				if j.Target > 0 {
					resizeAlloc(v, id, j.Target)
				}
			}
		}
	}
	held := map[string]int64{}
	for _, name := range names {
		for _, a := range views[name].Ledger.Allocations {
			held[a.Owner] += a.MilliGPUs()
		}
	}
	weight := func(owner string) float64 {
		if q, ok := s.UserQuotas[owner]; ok && q.Weight != nil && *q.Weight > 0 {
			return *q.Weight
		}
		return 1
	}
	// owed reports whether fair share gives GPUs to waiter e before job
	// j's owner: a higher priority, or (at equal priority) an owner first
	// down the team tree, then by weighted holding (elasticteams.go).
	order := newElasticOrder(s, views, names, weight)
	owed := func(e *state.QueueEntry, a *state.Allocation) bool {
		if e.Priority != a.Priority {
			return e.Priority > a.Priority
		}
		return order.compare(e, a) < 0
	}
	var out []Resize
	decided := map[string]bool{}
	blocking := []*state.QueueEntry{} // waiters no shrink serves
	for _, w := range plan.Waiting {
		e := w.Pending.Entry
		if w.Reason != "Capacity" || w.Pending.Pinned {
			continue
		}
		if len(out) >= opt.Max || e.Request.Fraction() {
			blocking = append(blocking, e)
			continue
		}
		single := e.Workers == 0 && e.Request.GPUs > 0
		if single && fitsOnceFreed(views, names, opt.Freeing, e) || !single && fitsOnceFreedParts(views, names, opt.Freeing, e) {
			continue // room being freed serves it: no shrink, and no grow into it
		}
		var r Resize
		ok := false
		if single {
			r, ok = shrinkFor(views, names, jobs, decided, w.Pending, owed, opt.Goodput)
		}
		if !ok {
			r, ok = nj.shrinkNodesFor(views, names, decided, w.Pending, owed)
		}
		if !ok {
			blocking = append(blocking, e)
			continue
		}
		decided[r.Session] = true
		out = append(out, r)
		g := 1000 * int64(e.Request.GPUs)
		if !single {
			g = requestGPUs(e, 0)
		}
		held[e.Owner] += g
		order.addGPUs(e.Team, e.Owner, g)
	}
	// Grows: idle GPUs on the job's node, nothing waiting that fair
	// share prefers, no more than the owner's water-filled share.
	demand := map[string]int64{}
	for o, g := range held {
		demand[o] = g
	}
	for _, e := range blocking {
		demand[e.Owner] += requestGPUs(e, 0)
	}
	ids := make([]string, 0, len(jobs))
	for id := range jobs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	total := s.totalMilliGPUs()
	// blocked: a waiter no shrink serves that fair share prefers to a's
	// owner; fairGPUs: owner's water-filled share with extra more demand.
	blocked := func(a *state.Allocation) bool {
		return slices.ContainsFunc(blocking, func(e *state.QueueEntry) bool {
			return !(e.Priority < a.Priority) && order.compare(e, a) <= 0
		})
	}
	fairGPUs := func(owner string, extra int64) int64 {
		d := maps.Clone(demand)
		d[owner] += extra
		return waterFill(total, d, weight)[owner]
	}
	var want map[string]int // goodput-aware sizes; nil: size-blind
	if opt.Goodput && anyGoodput(jobs) {
		want = goodputTargets(views, where, jobs, decided)
	}
	for _, id := range ids {
		j := jobs[id]
		name, ok := where[id]
		if !ok || decided[id] || !j.Ready || j.Target > 0 || len(out) >= opt.Max {
			continue
		}
		v := views[name]
		a := v.Ledger.Allocations[id]
		size := len(a.GPUs)
		if size >= j.Max {
			continue
		}
		if blocked(&a) {
			continue
		}
		req := state.Resources{GPUs: 1}
		free := newNodeState(v).freeDevices(&req)
		to := min(j.Max, size+free)
		if want != nil {
			to = min(to, max(size, want[id]))
		}
		to = min(to, max(size, int((fairGPUs(a.Owner, 1000*int64(j.Max-size))-held[a.Owner])/1000)+size))
		to = min(to, size+quotaRoom(s, views, names, &a))
		if to <= size {
			continue
		}
		resizeAlloc(v, id, to)
		held[a.Owner] += 1000 * int64(to-size)
		order.addGPUs(a.Team, a.Owner, 1000*int64(to-size))
		decided[id] = true
		out = append(out, Resize{Session: id, Node: name, From: size, To: to, Claims: claims[name],
			Why: fmt.Sprintf("grows from %d to %d GPUs (range %d-%d): %d GPUs sit idle on %s and nothing waits that fair share prefers%s",
				size, to, j.Min, j.Max, to-size, name, claimsNote(v, claims[name]))})
	}
	if len(out) < opt.Max {
		out = append(out, nj.growNodes(s, views, names, decided, held, order, blocked, fairGPUs, opt.Max-len(out))...)
	}
	return out
}

// quotaRoom is how many more whole GPUs a's owner and groups may hold
// under their quotas (a large number when none caps them).
func quotaRoom(s *Snapshot, views map[string]*NodeView, names []string, a *state.Allocation) int {
	room := int64(1 << 30)
	limit := func(q state.Quota, ok bool, held int64) {
		if ok && q.GPUs != nil {
			room = min(room, (1000**q.GPUs-held)/1000)
		}
	}
	var user int64
	groups := map[string]int64{}
	for _, name := range names {
		for _, b := range views[name].Ledger.Allocations {
			if b.Owner == a.Owner {
				user += b.MilliGPUs()
			}
			for _, g := range b.Groups {
				groups[g] += b.MilliGPUs()
			}
		}
	}
	q, ok := s.UserQuotas[a.Owner]
	limit(q, ok, user)
	for _, g := range a.Groups {
		q, ok := s.GroupQuotas[g]
		limit(q, ok, groups[g])
	}
	return int(max(room, 0))
}

// shrinkFor finds the smallest shrink of one ready elastic job on one node
// that lets waiter w fit there, among jobs whose GPUs fair share owes w.
// It applies it to views (the job at its new size, w's allocation added)
// and returns it.
func shrinkFor(views map[string]*NodeView, names []string, jobs map[string]ElasticJob, decided map[string]bool,
	w *Pending, owed func(*state.QueueEntry, *state.Allocation) bool, goodput bool) (Resize, bool) {
	e := w.Entry
	pt := &part{req: &e.Request, role: state.RoleSingle, ports: e.Ports(state.RoleSingle), id: e.Session, owner: e.Owner}
	best, bestK, bestNode, bestLoss := "", 0, "", 0.0
	deferred := false
	for _, name := range names {
		v := views[name]
		// Cheap bound first: the node's GPUs not held, plus the most any
		// elastic job there could give, fall short of the waiter.
		spare, room := len(v.Node.GPUs), 0
		for id, a := range v.Ledger.Allocations {
			spare -= len(a.GPUs)
			if j, ok := jobs[id]; ok && !decided[id] && j.Target == 0 {
				room = max(room, len(a.GPUs)-j.Min)
			}
		}
		if room <= 0 || spare+room < e.Request.GPUs {
			continue
		}
		ids := make([]string, 0, len(v.Ledger.Allocations))
		for id := range v.Ledger.Allocations {
			if _, ok := jobs[id]; ok && !decided[id] {
				ids = append(ids, id)
			}
		}
		sort.Strings(ids)
		for _, id := range ids {
			j, a := jobs[id], v.Ledger.Allocations[id]
			size := len(a.GPUs)
			if j.Target > 0 || size <= j.Min || !owed(e, &a) {
				continue
			}
			for k := 1; k <= size-j.Min; k++ {
				// With goodput, a shrink as small as the best one so far
				// wins if it loses less (goodput.go).
				if best != "" && (k > bestK || k == bestK && !(goodput && shrinkLoss(j, size, size-k) < bestLoss)) {
					break
				}
				h := *v
				h.Ledger = state.Ledger{Node: name, Allocations: cloneAllocs(v.Ledger.Allocations)}
				resizeAlloc(&h, id, size-k)
				if feasible(pt, newNodeState(&h)) == nil {
					// A ready job beats one held by its rate limit.
					if best == "" || j.Ready || !deferred {
						best, bestK, bestNode, deferred = id, k, name, !j.Ready
						bestLoss = shrinkLoss(j, size, size-k)
					}
					break
				}
			}
		}
	}
	if best == "" {
		return Resize{}, false
	}
	v := views[bestNode]
	size := len(v.Ledger.Allocations[best].GPUs)
	resizeAlloc(v, best, size-bestK)
	v.Ledger.Allocations[e.Session] = notRunning(allocation(e, PartPlan{Role: state.RoleSingle,
		Devices: devicesFor(v, e), CPUMilli: e.Request.CPUMilli, MemoryMiB: e.Request.MemoryMiB}))
	j := jobs[best]
	return Resize{Session: best, Node: bestNode, From: size, To: size - bestK, For: e.Session, ForRevision: w.Revision, Deferred: deferred,
		Why: fmt.Sprintf("shrinks from %d to %d GPUs (range %d-%d): %s (%s, priority %d) waits for %s on %s and fair share owes it the GPUs",
			size, size-bestK, j.Min, j.Max, e.Session, e.Owner, e.Priority, describe(&e.Request), bestNode)}, true
}

// fitsOnceFreed reports whether e fits on some node once the sessions in
// freeing have released what they hold there.
func fitsOnceFreed(views map[string]*NodeView, names []string, freeing map[string]bool, e *state.QueueEntry) bool {
	if len(freeing) == 0 {
		return false
	}
	pt := &part{req: &e.Request, role: state.RoleSingle, ports: e.Ports(state.RoleSingle), id: e.Session, owner: e.Owner}
	for _, name := range names {
		v := views[name]
		h := *v
		h.Ledger = state.Ledger{Node: name, Allocations: cloneAllocs(v.Ledger.Allocations)}
		freed := false
		for id := range h.Ledger.Allocations {
			if freeing[id] {
				delete(h.Ledger.Allocations, id)
				freed = true
			}
		}
		if freed && feasible(pt, newNodeState(&h)) == nil {
			return true
		}
	}
	return false
}

// planViews are s's nodes with the plan's bindings added to their ledgers
// (copies), so that capacity the plan gives away is not counted twice, and
// their names in order.
func planViews(s *Snapshot, plan *Plan) (map[string]*NodeView, []string) {
	views := make(map[string]*NodeView, len(s.Nodes))
	names := make([]string, 0, len(s.Nodes))
	for i := range s.Nodes {
		v := s.Nodes[i]
		v.Ledger = state.Ledger{Node: v.Node.Name, Allocations: cloneAllocs(v.Ledger.Allocations)}
		views[v.Node.Name] = &v
		names = append(names, v.Node.Name)
	}
	sort.Strings(names)
	for _, d := range plan.Bound {
		for _, pp := range d.Parts {
			if v := views[pp.Node]; v != nil {
				v.Ledger.Allocations[d.Pending.Entry.Session] = notRunning(allocation(d.Pending.Entry, pp))
			}
		}
	}
	return views, names
}

// resizeAlloc sets session id's allocation on v to size GPUs: it keeps
// the first size of those it holds, or adds free whole GPUs.
func resizeAlloc(v *NodeView, id string, size int) {
	a, ok := v.Ledger.Allocations[id]
	if !ok {
		return
	}
	if size <= len(a.GPUs) {
		a.GPUs = append([]string(nil), a.GPUs[:size]...)
		v.Ledger.Allocations[id] = a
		return
	}
	n := newNodeState(v)
	gpus := append([]string(nil), a.GPUs...)
	for i := range n.devices {
		if len(gpus) >= size {
			break
		}
		if !n.taken[i] && n.devices[i].whole() {
			gpus = append(gpus, n.devices[i].uuid)
		}
	}
	a.GPUs = gpus
	v.Ledger.Allocations[id] = a
}

func cloneAllocs(m map[string]state.Allocation) map[string]state.Allocation {
	out := maps.Clone(m)
	if out == nil {
		out = map[string]state.Allocation{}
	}
	return out
}

// totalMilliGPUs is every node's GPUs, in thousandths.
func (s *Snapshot) totalMilliGPUs() int64 {
	var t int64
	for i := range s.Nodes {
		n := newNodeState(&s.Nodes[i])
		t += 1000 * int64(n.totalGPU)
	}
	return t
}

// elasticNote is what a bound status's message adds for an elastic job:
// its size within its range.
func elasticNote(e *state.QueueEntry) string {
	if e.Elastic == nil || e.Elastic.Current() <= 0 {
		return ""
	}
	return " (elastic: " + e.Elastic.Range(e.Elastic.Current()) + ")"
}
