package placer

import (
	"fmt"
	"sort"

	"github.com/voyager-gpu/voyager/state"
)

// PreemptOptions tune PlanPreemption.
type PreemptOptions struct {
	// Notebooks lets preemptible notebook sessions be victims too; by
	// default only batch sessions are.
	Notebooks bool
	// Max bounds how many preemptions one pass decides. Default 8.
	Max int
	// Victims are sessions already warned of a preemption: they are not
	// chosen again.
	Victims map[string]bool
	// Preemptors are sessions whose earlier preemption is still under way:
	// they wait for it rather than take more.
	Preemptors map[string]bool
}

// Victim is one session a preemption stops, with what it holds on the
// preemption's node.
type Victim struct {
	Session    string
	Allocation state.Allocation
	// Reason says why it is taken when the preemptor's priority is not
	// above its own: its team's borrowed GPUs reclaimed (reclaim.go).
	// Empty for a preemption by priority.
	Reason string
}

// Preemption is one decision of PlanPreemption: once Victims have stopped,
// Preemptor fits on Node.
type Preemption struct {
	Preemptor Pending
	Node      string
	Victims   []Victim
}

// PlanPreemption decides, for sessions that plan left waiting for capacity,
// which running sessions to stop so that they fit. A session may preempt
// only sessions of lower priority that are marked preemptible, and only
// batch sessions unless opt.Notebooks. For each preemptor, in plan order,
// it picks the node where the fewest victims free enough room (then the
// lowest victim priority, then the fewest GPUs taken from others), and the
// victims within a node largest first, dropping any that turn out not to be
// needed. Multi-node (Ray) requests do not preempt: they wait with
// reservations. With teams, a session of a team below its guarantee may
// also stop preemptible sessions of teams holding more than theirs,
// whatever their priority, and with them any team below its fair share may
// stop preemptible sessions of teams over theirs (reclaim.go). A session
// for which a node is held (Snapshot.Held) plans no other preemption. Like
// NewPlan it is pure and deterministic.
//
// Fractions of shared GPUs preempt and are preempted under the rules of
// the shared GPU (share.go): a fraction preempts on one shared GPU, whose
// fractions of other owners must all go (one owner per shared GPU at a
// time) and whose preemptor's own lower fractions go, largest first, only
// as far as its memory needs (chooseShareVictims); a fraction victim
// frees its memory and CPU, never a GPU for a whole request, since a
// shared GPU is never allocated whole.
func PlanPreemption(s *Snapshot, plan *Plan, opt PreemptOptions) []Preemption {
	if opt.Max <= 0 {
		opt.Max = 8
	}
	views, names := workingViews(s, plan)
	taken := map[string]bool{}  // victims chosen in this pass
	held := map[string]string{} // node → preemptor, the snapshot's and this pass's
	for n, id := range s.Held {
		held[n] = id
	}
	waiting := make([]*Pending, len(plan.Waiting))
	for i := range plan.Waiting {
		waiting[i] = plan.Waiting[i].Pending
	}
	rc := newReclaim(s, waiting, views, names)
	holders := holdersOf(s) // their preemptions are under way (preempthold.go)
	var out []Preemption
	// A request shape (with its priority) that found no victims anywhere
	// finds none again in this pass: room only shrinks as it goes.
	hopeless := map[string]bool{}
	for _, w := range plan.Waiting {
		if len(out) >= opt.Max {
			break
		}
		e := w.Pending.Entry
		if w.Reason != "Capacity" || e.Workers > 0 || opt.Preemptors[e.Session] || holders[e.Session] {
			continue
		}
		shape := fmt.Sprintf("%d|%s|%s|%+v", e.Priority, e.Kind, e.Team, e.Request)
		if e.Request.Fraction() {
			// Who owns a shared GPU's fractions decides whom a fraction
			// must preempt: another owner's request may find victims
			// where this one found none.
			shape += "|" + e.Owner
		}
		if hopeless[shape] {
			continue
		}
		best, bestKey := (*Preemption)(nil), [3]int{}
		for _, name := range names {
			v := views[name]
			if h, ok := held[name]; ok && h != e.Session {
				continue // already promised to another preemptor
			}
			victims := chooseVictims(v, e, opt, taken, rc.allow(e))
			if victims == nil || !rc.within(e, victims) {
				continue
			}
			key := [3]int{len(victims), -1 << 31, 0}
			for _, vi := range victims {
				key[1] = max(key[1], vi.Allocation.Priority)
				key[2] += int(vi.Allocation.MilliGPUs())
			}
			if best == nil || key[0] < bestKey[0] || key[0] == bestKey[0] && (key[1] < bestKey[1] || key[1] == bestKey[1] && key[2] < bestKey[2]) {
				best, bestKey = &Preemption{Preemptor: *w.Pending, Node: name, Victims: victims}, key
			}
		}
		if best == nil {
			hopeless[shape] = true
			continue
		}
		// The node is promised: its victims' room goes to this preemptor.
		held[best.Node] = e.Session
		rc.took(e, best.Victims)
		v := views[best.Node]
		for _, vi := range best.Victims {
			taken[vi.Session] = true
			delete(v.Ledger.Allocations, vi.Session)
		}
		v.Ledger.Allocations[e.Session] = notRunning(allocation(e, PartPlan{Role: state.RoleSingle,
			Devices: devicesFor(v, e), CPUMilli: e.Request.CPUMilli, MemoryMiB: e.Request.MemoryMiB}))
		out = append(out, *best)
	}
	return out
}

// workingViews are the snapshot's ledgers with the plan's bindings added,
// so that capacity the plan gives away is not counted twice, by node, and
// the nodes' names in order.
func workingViews(s *Snapshot, plan *Plan) (map[string]*NodeView, []string) {
	views := make(map[string]*NodeView, len(s.Nodes))
	names := make([]string, 0, len(s.Nodes))
	for i := range s.Nodes {
		v := s.Nodes[i]
		allocs := make(map[string]state.Allocation, len(v.Ledger.Allocations))
		for id, a := range v.Ledger.Allocations {
			allocs[id] = a
		}
		v.Ledger = state.Ledger{Node: v.Node.Name, Allocations: allocs}
		views[v.Node.Name] = &v
		names = append(names, v.Node.Name)
	}
	sort.Strings(names)
	for _, d := range plan.Bound {
		e := d.Pending.Entry
		for _, pp := range d.Parts {
			if v := views[pp.Node]; v != nil {
				v.Ledger.Allocations[e.Session] = notRunning(allocation(e, pp))
			}
		}
	}
	return views, names
}

// chooseVictims returns the fewest sessions on v whose stop lets e fit, or
// nil when no choice of allowed victims does (or e needs none: it then
// waits for room being freed already).
func chooseVictims(v *NodeView, e *state.QueueEntry, opt PreemptOptions, taken map[string]bool, reclaim func(*state.Allocation) bool) []Victim {
	pt := &part{req: &e.Request, role: state.RoleSingle, ports: e.Ports(state.RoleSingle), id: e.Session, owner: e.Owner}
	if v.Cordon != nil {
		return nil
	}
	for k, want := range e.Request.NodeSelector {
		if got, ok := v.Node.Labels[k]; !ok || got != want {
			return nil
		}
	}
	var cands []Victim
	for id, a := range v.Ledger.Allocations {
		if !a.Preemptible || a.Priority >= e.Priority && !reclaim(&a) || taken[id] || opt.Victims[id] {
			continue
		}
		if a.Kind != state.KindBatch && !(opt.Notebooks && a.Kind == state.KindNotebook) {
			continue
		}
		cands = append(cands, Victim{Session: id, Allocation: a})
	}
	if len(cands) == 0 {
		return nil
	}
	// Cheap bound first: even all candidates plus what is free fall short.
	n := newNodeState(v)
	gpus, cpu, mem := n.freeDevices(&e.Request), n.freeCPU, n.freeMem
	for _, c := range cands {
		for _, u := range c.Allocation.GPUs {
			for i := range n.devices {
				if n.devices[i].uuid == u && deviceMatches(&n.devices[i], &e.Request) {
					gpus++
				}
			}
		}
		cpu += c.Allocation.CPUMilli
		mem += c.Allocation.MemoryMiB
	}
	if cpu < e.Request.CPUMilli || mem < e.Request.MemoryMiB || !e.Request.Fraction() && gpus < e.Request.GPUs {
		return nil
	}
	// Largest first: with one dimension (GPUs) this takes the fewest.
	sort.Slice(cands, func(i, j int) bool {
		a, b := cands[i].Allocation, cands[j].Allocation
		if len(a.GPUs) != len(b.GPUs) {
			return len(a.GPUs) > len(b.GPUs)
		}
		if a.Priority != b.Priority {
			return a.Priority < b.Priority
		}
		if a.CPUMilli != b.CPUMilli {
			return a.CPUMilli > b.CPUMilli
		}
		return cands[i].Session > cands[j].Session // the younger (later id) first: less work lost
	})
	fits := func(without []Victim) bool {
		h := *v
		allocs := make(map[string]state.Allocation, len(v.Ledger.Allocations))
		for id, a := range v.Ledger.Allocations {
			allocs[id] = a
		}
		for _, vi := range without {
			delete(allocs, vi.Session)
		}
		h.Ledger = state.Ledger{Node: v.Node.Name, Allocations: allocs}
		return feasible(pt, newNodeState(&h)) == nil
	}
	if fits(nil) {
		return nil // it fits without anyone leaving: nothing to preempt here
	}
	if e.Request.Fraction() {
		return chooseShareVictims(n, pt, cands, fits)
	}
	return takeUntilFits(nil, cands, nil, fits)
}

// takeUntilFits adds candidates to chosen in order until fits holds (nil
// if it never does), then spares every one of them not needed, highest
// priority first; the victims in keep are never spared. The victims come
// back sorted by session.
func takeUntilFits(chosen, cands []Victim, keep map[string]bool, fits func([]Victim) bool) []Victim {
	for _, c := range cands {
		if fits(chosen) {
			break
		}
		chosen = append(chosen, c)
	}
	if !fits(chosen) {
		return nil
	}
	// Spare whoever is not needed, highest priority first.
	order := append([]Victim(nil), chosen...)
	sort.SliceStable(order, func(i, j int) bool { return order[i].Allocation.Priority > order[j].Allocation.Priority })
	for _, o := range order {
		if keep[o.Session] {
			continue
		}
		rest := make([]Victim, 0, len(chosen))
		for _, c := range chosen {
			if c.Session != o.Session {
				rest = append(rest, c)
			}
		}
		if fits(rest) {
			chosen = rest
		}
	}
	sort.Slice(chosen, func(i, j int) bool { return chosen[i].Session < chosen[j].Session })
	return chosen
}

// notRunning marks an allocation this pass only proposes: its session is
// not running yet, so it is nobody's victim.
func notRunning(a state.Allocation) state.Allocation {
	a.Preemptible = false
	return a
}

// devicesFor names the devices e would take on v (after its victims left),
// so that later preemptors in the same pass see them taken.
func devicesFor(v *NodeView, e *state.QueueEntry) []string {
	n := newNodeState(v)
	var out []string
	for _, i := range choosePart(n, &part{req: &e.Request, role: state.RoleSingle, id: e.Session, owner: e.Owner}) {
		out = append(out, n.devices[i].uuid)
	}
	return out
}

// Describe says a preemption in plain words, for warnings and logs.
func (p Preemption) Describe() string {
	return fmt.Sprintf("%s (priority %d) needs %s on %s", p.Preemptor.Entry.Session, p.Preemptor.Entry.Priority, describe(&p.Preemptor.Entry.Request), p.Node)
}
