package placer

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/voyager-gpu/voyager/state"
)

// Elastic multi-node jobs (state.Elastic.ByNodes) run on any number of
// machines from MinNodes to MaxNodes, one part of the job's request on
// each, as a multi-node job does (rank 0 the head part). The decisions
// mirror those of a range of GPUs (elastic.go), with machines as the unit:
//
//   - At its turn in the plan's order, a queued job is bound on the most
//     machines from its cap (Elastic.NodeCap: MaxNodes, or the count its
//     last resize asked for) down to MinNodes that fair share (its owner's
//     water-filled share of the cluster's GPUs, less what it holds), its
//     quotas and the machines where a part fits now allow; if none do, it
//     waits at MinNodes like any multi-node job (placeElasticNodes).
//   - PlanElastic shrinks a running job by whole parts (never below
//     MinNodes) for a waiting session that fair share owes them and that
//     fits once those parts are gone (shrinkNodesFor), and grows it onto
//     machines where one more part fits while nothing waits that fair
//     share prefers (growNodes).
//
// A resize is a restart on the new count of machines (lifecycle/elastic.go):
// every part is stopped with its checkpoint grace and released, and the
// job is queued again with its cap at the new count; its parts then start
// with WORLD_SIZE, NNODES, NODE_RANK and MASTER_ADDR of the new attempt.

// placeElasticNodes places it, an elastic job over a range of machines,
// on the most machines from its cap down to MinNodes that fair share,
// quotas and the nodes allow now, else at MinNodes.
func (p *planner) placeElasticNodes(it *Pending, position int, plan *Plan) (Decision, bool) {
	e := it.Entry
	el := e.Elastic
	if it.Pinned || e.Request.Fraction() || el.MinNodes < 1 || e.Nodes < 2 {
		return p.place(it, position, plan)
	}
	hi := el.NodeCap()
	if g := e.Request.GPUs; g > 0 {
		hi = min(hi, p.fairNodes(e, g))
	}
	for n := hi; n > el.MinNodes; n-- {
		sized := sizedNodes(it, n)
		reqs := sized.Entry.Parts()
		if p.quotas {
			// A count its quotas refuse would wait on the quota every
			// pass while a smaller one is allowed.
			var need amounts
			for i := range reqs {
				need.addReq(&reqs[i], p.usage.shareRef)
			}
			if _, _, ok := p.allows(sized.Entry, need); !ok {
				continue
			}
		}
		if p.partsFit(sized.Entry, reqs) {
			return p.place(sized, position, plan)
		}
	}
	return p.place(sizedNodes(it, el.MinNodes), position, plan)
}

// partsFit reports whether every part of e (reqs) finds a node of its own
// now, by the plan's filters (best), without reserving anything.
func (p *planner) partsFit(e *state.QueueEntry, reqs []state.Resources) bool {
	exclude := make(map[string]bool, len(reqs))
	for i := range reqs {
		n, _, _, _ := p.best(p.partOf(e, reqs, i), exclude)
		if n == nil {
			return false
		}
		exclude[n.name] = true
	}
	return true
}

// fairNodes is the most machines of g GPUs each e's owner may take now by
// fair share (fairCap's share, in whole parts); at least MinNodes.
func (p *planner) fairNodes(e *state.QueueEntry, g int) int {
	if p.elastic == nil {
		p.elastic = elasticShares(p.snap, p.usage.total.gpus, p.ownerWeight, p.usage.shareRef)
	}
	left := (p.elastic.share[e.Owner] - p.elastic.held[e.Owner]) / 1000
	return max(e.Elastic.MinNodes, int(left)/g)
}

// sizedNodes is a copy of it on n machines: ranks 1 to n-1 its workers,
// its Elastic.Nodes n and Elastic.Size the GPUs of all its parts (the bind
// writes both into the status). The cached entry is shared and never
// changed.
func sizedNodes(it *Pending, n int) *Pending {
	e := *it.Entry
	el := *e.Elastic
	el.Nodes, el.Size = n, n*e.Request.GPUs
	e.Elastic, e.Workers, e.WorkerRequest = &el, n-1, nil
	cp := *it
	cp.Entry = &e
	return &cp
}

// nodeJobs are the running elastic jobs over a range of machines that
// PlanElastic decides, by session, with the nodes each holds a part on.
type nodeJobs struct {
	jobs map[string]ElasticJob
	on   map[string][]string // session → its nodes, sorted
	ids  []string            // sorted
}

// splitNodeJobs takes the jobs over a range of machines out of jobs.
func splitNodeJobs(jobs map[string]ElasticJob) (map[string]ElasticJob, *nodeJobs) {
	nj := &nodeJobs{jobs: map[string]ElasticJob{}, on: map[string][]string{}}
	rest := make(map[string]ElasticJob, len(jobs))
	for id, j := range jobs {
		if j.Nodes {
			nj.jobs[id] = j
			nj.ids = append(nj.ids, id)
		} else {
			rest[id] = j
		}
	}
	sort.Strings(nj.ids)
	return rest, nj
}

// locate finds the nodes of every job in views, and counts a job already
// being resized (Target) at its target: parts beyond it taken out, parts
// up to it put on nodes where one fits.
func (nj *nodeJobs) locate(views map[string]*NodeView, names []string) {
	if len(nj.jobs) == 0 {
		return
	}
	for _, name := range names {
		for id := range views[name].Ledger.Allocations {
			if _, ok := nj.jobs[id]; ok {
				nj.on[id] = append(nj.on[id], name)
			}
		}
	}
	for _, id := range nj.ids {
		j, on := nj.jobs[id], nj.on[id]
		switch {
		case j.Target <= 0 || len(on) == 0:
		case j.Target < len(on):
			for _, name := range workerNodes(views, id, on)[:len(on)-j.Target] {
				delete(views[name].Ledger.Allocations, id)
			}
		case j.Target > len(on):
			a := views[on[0]].Ledger.Allocations[id]
			for _, name := range idleFor(views, names, id, &a, j.Part, j.Target-len(on)) {
				addPart(views[name], id, a, j.Part)
			}
		}
	}
}

// workerNodes are job id's nodes in on with its head's last: the parts a
// shrink takes first.
func workerNodes(views map[string]*NodeView, id string, on []string) []string {
	out := slices.Clone(on)
	sort.SliceStable(out, func(i, k int) bool {
		return views[out[i]].Ledger.Allocations[id].Role != state.RoleHead && views[out[k]].Ledger.Allocations[id].Role == state.RoleHead
	})
	return out
}

// partOfJob is a worker part of request r for job id of a's owner: what
// one more machine of the job must hold.
func partOfJob(id string, a *state.Allocation, r *state.Resources) *part {
	return &part{req: r, role: state.RoleWorker, ports: 1 + state.JobPeerPorts, id: id, owner: a.Owner}
}

// idleFor names up to k nodes (in name order) not holding a part of job
// id where one more of its parts (request r) fits now.
func idleFor(views map[string]*NodeView, names []string, id string, a *state.Allocation, r state.Resources, k int) []string {
	if r.GPUs == 0 && r.CPUMilli == 0 && r.MemoryMiB == 0 {
		return nil // no request known: no grow
	}
	pt := partOfJob(id, a, &r)
	var out []string
	for _, name := range names {
		if len(out) >= k {
			break
		}
		v := views[name]
		if _, ok := v.Ledger.Allocations[id]; ok {
			continue
		}
		if feasible(pt, newNodeState(v)) == nil {
			out = append(out, name)
		}
	}
	return out
}

// addPart records on v a part of job id (request r) as a grow would bind
// it, so that no other decision of the pass counts that room as idle.
func addPart(v *NodeView, id string, a state.Allocation, r state.Resources) {
	n := newNodeState(v)
	pt := partOfJob(id, &a, &r)
	var gpus []string
	for _, i := range choosePart(n, pt) {
		gpus = append(gpus, n.devices[i].uuid)
	}
	a.Role, a.GPUs, a.CPUMilli, a.MemoryMiB, a.Ports, a.Parents = state.RoleWorker, gpus, r.CPUMilli, r.MemoryMiB, n.freePorts(pt.ports), nil
	v.Ledger.Allocations[id] = notRunning(a)
}

// waiterParts are the parts of waiting session e as the plan would place
// them.
func waiterParts(e *state.QueueEntry) []*part {
	reqs := e.Parts()
	out := make([]*part, len(reqs))
	for i := range reqs {
		role := state.RoleSingle
		if e.Workers > 0 || e.Nodes > 1 {
			role = state.RoleHead
			if i > 0 {
				role = state.RoleWorker
			}
		}
		out[i] = &part{req: &reqs[i], role: role, ports: e.Ports(role), id: e.Session, owner: e.Owner}
	}
	return out
}

// placeParts finds a node of its own for each of parts on views (in name
// order, each part the first node that holds it), or nil. Job id's parts
// on the nodes in without count as released.
func placeParts(views map[string]*NodeView, names []string, parts []*part, id string, without []string) []string {
	out := make([]string, 0, len(parts))
	used := map[string]bool{}
	for _, pt := range parts {
		found := ""
		for _, name := range names {
			if used[name] {
				continue
			}
			v := views[name]
			if slices.Contains(without, name) {
				v = withoutPart(v, id)
			}
			if mayFit(v, pt) && feasible(pt, newNodeState(v)) == nil {
				found = name
				break
			}
		}
		if found == "" {
			return nil
		}
		used[found] = true
		out = append(out, found)
	}
	return out
}

// withoutPart is a copy of v with session id's allocation taken out.
func withoutPart(v *NodeView, id string) *NodeView {
	h := *v
	h.Ledger = state.Ledger{Node: v.Node.Name, Allocations: cloneAllocs(v.Ledger.Allocations)}
	delete(h.Ledger.Allocations, id)
	return &h
}

// mayFit is false where part pt of whole GPUs cannot fit on v for want of
// them (wholeGPUsAtMost); true otherwise, and for MIG devices and
// fractions, which it does not count.
func mayFit(v *NodeView, pt *part) bool {
	if pt.req.MIGProfile != "" || pt.req.Fraction() || pt.req.GPUs == 0 {
		return true
	}
	return wholeGPUsAtMost(v) >= pt.req.GPUs
}

// wholeGPUsAtMost bounds from above the whole GPUs free on v: its GPUs
// less the physical GPUs its allocations touch. A cheap test that spares
// building the node's state where a part cannot fit.
func wholeGPUsAtMost(v *NodeView) int {
	held := 0
	var seen map[string]bool
	for _, a := range v.Ledger.Allocations {
		if len(a.Parents) == 0 && a.Share == nil {
			held += len(a.GPUs) // whole GPUs: each its own
			continue
		}
		if seen == nil {
			seen = map[string]bool{}
		}
		for _, u := range a.GPUs {
			seen[a.Parent(u, nil)] = true
		}
	}
	return len(v.Node.GPUs) - held - len(seen)
}

// shrinkNodesFor finds the smallest shrink, in whole parts, of one job
// over a range of machines that lets waiter w fit, among jobs whose GPUs
// fair share owes w (owed), never below a job's MinNodes. It applies it
// to views (the job's parts taken out, w's added) and returns it.
func (nj *nodeJobs) shrinkNodesFor(views map[string]*NodeView, names []string, decided map[string]bool, w *Pending,
	owed func(*state.QueueEntry, *state.Allocation) bool) (Resize, bool) {
	e := w.Entry
	parts := waiterParts(e)
	best, bestK, deferred := "", 0, false
	var bestNodes []string
	for _, id := range nj.ids {
		if best != "" && bestK == 1 && !deferred {
			break // a ready job's shrink by one part: none is smaller
		}
		j, on := nj.jobs[id], nj.on[id]
		if decided[id] || j.Target > 0 || len(on) <= j.Min || best != "" && !j.Ready && !deferred {
			continue
		}
		a := views[on[0]].Ledger.Allocations[id]
		if !owed(e, &a) {
			continue
		}
		// Its nodes where taking its part out lets a part of w fit there:
		// the only ones whose release serves w.
		var cands []string
		for _, name := range workerNodes(views, id, on) {
			h := withoutPart(views[name], id)
			if !slices.ContainsFunc(parts, func(pt *part) bool { return mayFit(h, pt) }) {
				continue
			}
			n := newNodeState(h)
			if slices.ContainsFunc(parts, func(pt *part) bool { return feasible(pt, n) == nil }) {
				cands = append(cands, name)
			}
		}
		for k := 1; k <= min(len(on)-j.Min, len(cands)); k++ {
			if best != "" && k >= bestK && !(deferred && j.Ready) {
				break // no smaller, and not a ready job for a deferred one
			}
			if placeParts(views, names, parts, id, cands[:k]) != nil {
				// A ready job beats one held by its rate limit.
				if best == "" || k < bestK || (deferred && j.Ready) {
					best, bestK, bestNodes, deferred = id, k, cands[:k], !j.Ready
				}
				break
			}
		}
	}
	if best == "" {
		return Resize{}, false
	}
	j, on := nj.jobs[best], nj.on[best]
	a := views[on[0]].Ledger.Allocations[best]
	for _, name := range bestNodes {
		delete(views[name].Ledger.Allocations, best)
	}
	nj.on[best] = slices.DeleteFunc(slices.Clone(on), func(n string) bool { return slices.Contains(bestNodes, n) })
	placed := placeParts(views, names, parts, "", nil)
	for i, name := range placed {
		pt := parts[i]
		n := newNodeState(views[name])
		var gpus []string
		for _, d := range choosePart(n, pt) {
			gpus = append(gpus, n.devices[d].uuid)
		}
		views[name].Ledger.Allocations[e.Session] = notRunning(allocation(e, PartPlan{Role: pt.role, Devices: gpus,
			CPUMilli: pt.req.CPUMilli, MemoryMiB: pt.req.MemoryMiB, Ports: n.freePorts(pt.ports)}))
	}
	ledgers := slices.Concat(on, placed)
	slices.Sort(ledgers)
	ledgers = slices.Compact(ledgers)
	size := len(on)
	return Resize{Session: best, Node: headNode(views, best, on, a), From: size, To: size - bestK, For: e.Session, ForRevision: w.Revision,
		Deferred: deferred, Nodes: true, Ledgers: ledgers,
		Why: fmt.Sprintf("shrinks from %d to %d nodes (range %d-%d): %s (%s, priority %d) waits for %s on %s and fair share owes it the machines",
			size, size-bestK, j.Min, j.Max, e.Session, e.Owner, e.Priority, describeParts(e), strings.Join(bestNodes, ", "))}, true
}

// headNode is the node of job id's head part among on (on[0] if none is
// marked so).
func headNode(views map[string]*NodeView, id string, on []string, _ state.Allocation) string {
	for _, name := range on {
		if a, ok := views[name].Ledger.Allocations[id]; ok && a.Role == state.RoleHead {
			return name
		}
	}
	return on[0]
}

// describeParts says what waiter e asks for: its request, and its
// machines when more than one.
func describeParts(e *state.QueueEntry) string {
	if n := len(e.Parts()); n > 1 {
		return fmt.Sprintf("%d machines of %s", n, describe(&e.Request))
	}
	return describe(&e.Request)
}

// fitsOnceFreedParts reports whether every part of e fits once the
// sessions in freeing have released what they hold: the room being freed
// serves e without a shrink.
func fitsOnceFreedParts(views map[string]*NodeView, names []string, freeing map[string]bool, e *state.QueueEntry) bool {
	if len(freeing) == 0 {
		return false
	}
	freed := make(map[string]*NodeView, len(views))
	for name, v := range views {
		freed[name] = v
		for id := range v.Ledger.Allocations {
			if freeing[id] {
				h := *v
				h.Ledger = state.Ledger{Node: name, Allocations: cloneAllocs(v.Ledger.Allocations)}
				for id := range h.Ledger.Allocations {
					if freeing[id] {
						delete(h.Ledger.Allocations, id)
					}
				}
				freed[name] = &h
				break
			}
		}
	}
	return placeParts(freed, names, waiterParts(e), "", nil) != nil
}

// growNodes grows jobs onto nodes where one more of their parts fits,
// while nothing waits that fair share prefers (blocked) and as far as
// the owner's fair share (fairGPUs: the owner's water-filled share with
// extra more demand, in thousandths) and quotas allow; at most limit
// resizes. It records each grow in views, held and order.
func (nj *nodeJobs) growNodes(s *Snapshot, views map[string]*NodeView, names []string, decided map[string]bool, held map[string]int64, order *elasticOrder,
	blocked func(*state.Allocation) bool, fairGPUs func(owner string, extra int64) int64, limit int) []Resize {
	var out []Resize
	for _, id := range nj.ids {
		j, on := nj.jobs[id], nj.on[id]
		if len(out) >= limit || len(on) == 0 || decided[id] || !j.Ready || j.Target > 0 || len(on) >= j.Max {
			continue
		}
		a := views[on[0]].Ledger.Allocations[id]
		if blocked(&a) {
			continue
		}
		size := len(on)
		idle := idleFor(views, names, id, &a, j.Part, j.Max-size)
		to := size + len(idle)
		if g := int64(j.Part.GPUs); g > 0 {
			fair := fairGPUs(a.Owner, 1000*g*int64(j.Max-size))
			to = min(to, size+int(max64(0, fair-held[a.Owner])/(1000*g)))
			to = min(to, size+quotaRoom(s, views, names, &a)/int(g))
		}
		if to <= size {
			continue
		}
		idle = idle[:to-size]
		for _, name := range idle {
			addPart(views[name], id, a, j.Part)
		}
		held[a.Owner] += 1000 * int64(j.Part.GPUs) * int64(to-size)
		order.addGPUs(a.Team, a.Owner, 1000*int64(j.Part.GPUs)*int64(to-size))
		decided[id] = true
		ledgers := slices.Concat(on, idle)
		slices.Sort(ledgers)
		out = append(out, Resize{Session: id, Node: headNode(views, id, on, a), From: size, To: to, Nodes: true, Ledgers: ledgers,
			Why: fmt.Sprintf("grows from %d to %d nodes (range %d-%d): a part fits on idle %s and nothing waits that fair share prefers",
				size, to, j.Min, j.Max, strings.Join(idle, ", "))})
	}
	return out
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}
