package placer

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/state"
)

// fraction adds to v session id of owner, a fraction of mib MiB of v's
// GPU g, of kind and priority, preemptible or not.
func fraction(v NodeView, id, owner string, g int, mib int64, kind state.SessionKind, prio int, preemptible bool) NodeView {
	v.Ledger.Allocations[id] = state.Allocation{Kind: kind, Owner: owner, Priority: prio, Preemptible: preemptible, Role: state.RoleSingle,
		GPUs: []string{v.Node.GPUs[g].UUID}, Share: &state.GPUShare{MemoryMiB: mib, GPUMemoryMiB: v.Node.GPUs[g].MemoryMiB}, CPUMilli: 1000, MemoryMiB: 1024}
	return v
}

// urgentFraction is a pending fraction of mib MiB for owner at priority prio.
func urgentFraction(id, owner string, mib int64, prio int) Pending {
	p := fracReq(id, owner, mib)
	p.Entry.Priority = prio
	return p
}

// TestFractionPreemptsOnlyWhereItsOwnerMayRun: a shared GPU holds ada's
// fraction that may not be preempted and a lower one that may. Bob's
// urgent fraction could fit in the lower one's memory, but never beside
// ada's other fraction (one owner per shared GPU): nobody is preempted
// for bob. Ada's urgent fraction of the same shape may: her lower one
// goes. Before fractions were preemption-aware, bob's request (planned
// without its owner) preempted ada's fraction for a room it could never
// take, and ada's request, of the same shape, was never tried.
func TestFractionPreemptsOnlyWhereItsOwnerMayRun(t *testing.T) {
	v := view(shareNode(gpuNode("n", 1, "A100"), 0))
	v = fraction(v, "ada-keep", "ada", 0, 40960, state.KindNotebook, 0, false)
	v = fraction(v, "ada-low", "ada", 0, 40960, state.KindBatch, 0, true)
	bob := urgentFraction("bob-vip", "bob", 30000, 10)
	bob.Entry.Created = bob.Entry.Created.Add(-1) // first in the order
	ps := preempt(snap([]NodeView{v}, bob, urgentFraction("ada-vip", "ada", 30000, 10)), PreemptOptions{})
	if len(ps) != 1 {
		t.Fatalf("got %d preemptions %+v; want one, for ada-vip", len(ps), ps)
	}
	if ps[0].Preemptor.Entry.Session != "ada-vip" || !reflect.DeepEqual(victimIDs(ps[0]), []string{"ada-low"}) {
		t.Fatalf("%s preempts %v; want ada-vip preempting ada-low", ps[0].Preemptor.Entry.Session, victimIDs(ps[0]))
	}
}

// TestFractionPreemptsAnotherOwnersFractions: a shared GPU with room to
// spare holds bob's lower, preemptible fractions; ada's urgent fraction
// may not join them (one owner per shared GPU), so all of bob's fractions
// there are its victims, though memory alone needed none. Where one of
// bob's fractions may not be preempted, ada's waits and no one is
// stopped. Before, the preemption search ignored the owner rule and found
// that ada fits without anyone leaving.
func TestFractionPreemptsAnotherOwnersFractions(t *testing.T) {
	v := view(shareNode(gpuNode("n", 1, "A100"), 0))
	v = fraction(v, "bob-1", "bob", 0, 10240, state.KindBatch, 0, true)
	v = fraction(v, "bob-2", "bob", 0, 10240, state.KindBatch, 0, true)
	ps := preempt(snap([]NodeView{v}, urgentFraction("vip", "ada", 10240, 10)), PreemptOptions{})
	if len(ps) != 1 || !reflect.DeepEqual(victimIDs(ps[0]), []string{"bob-1", "bob-2"}) {
		t.Fatalf("preemptions %+v; want vip preempting bob-1 and bob-2", ps)
	}
	v = fraction(v, "bob-2", "bob", 0, 10240, state.KindBatch, 50, true)
	if ps := preempt(snap([]NodeView{v}, urgentFraction("vip", "ada", 10240, 10)), PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("preemptions %+v; want none: bob-2 outranks vip and would keep the GPU bob's", ps)
	}
}

// TestFractionPreemptionPicksTheGPUAndVictims: of two shared GPUs, the
// preemptor takes the one where the fewest fractions go, and there the
// largest of its owner's own lower fractions rather than several small
// ones; a notebook fraction is a victim only when notebooks may be.
func TestFractionPreemptionPicksTheGPUAndVictims(t *testing.T) {
	v := view(shareNode(gpuNode("n", 2, "A100"), 0, 1))
	// GPU 0: three of bob's fractions fill it; GPU 1: ada's 10, 30 and 40 GiB.
	for i := range 3 {
		v = fraction(v, fmt.Sprintf("bob-%d", i), "bob", 0, 27306, state.KindBatch, 0, true)
	}
	v = fraction(v, "a10", "ada", 1, 10240, state.KindBatch, 0, true)
	v = fraction(v, "a30", "ada", 1, 30720, state.KindBatch, 0, true)
	v = fraction(v, "a40", "ada", 1, 40960, state.KindNotebook, 0, true)
	s := snap([]NodeView{v}, urgentFraction("vip", "ada", 30720, 10))
	ps := preempt(s, PreemptOptions{Notebooks: true})
	if len(ps) != 1 || !reflect.DeepEqual(victimIDs(ps[0]), []string{"a40"}) {
		t.Fatalf("preemptions %+v; want vip preempting a40 alone", ps)
	}
	ps = preempt(s, PreemptOptions{})
	if len(ps) != 1 || !reflect.DeepEqual(victimIDs(ps[0]), []string{"a30"}) {
		t.Fatalf("preemptions without notebooks %+v; want vip preempting a30 alone", ps)
	}
}

// TestWholeRequestNeverPreemptsFractions: a shared GPU is never allocated
// whole, so stopping its fractions frees no GPU for a whole request.
func TestWholeRequestNeverPreemptsFractions(t *testing.T) {
	v := view(shareNode(gpuNode("n", 2, "A100"), 1))
	v = running(v, "keep", state.KindBatch, 50, false, 0, 1)
	v = fraction(v, "low", "bob", 1, 10240, state.KindBatch, 0, true)
	if ps := preempt(snap([]NodeView{v}, urgent("vip", 1, 10)), PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("preemptions %+v; want none", ps)
	}
}

// TestPreemptionWithFractionsKeepsDeviceInvariants is the property: on
// random clusters of whole, MIG-split and shared GPUs filled with lower
// sessions of a few owners (whole, MIG and fractions, some preemptible),
// urgent requests of every kind preempt; each preemption's victims are
// allowed ones on its node, and once they are released its preemptor
// binds, the bind's refit accepting it. Every ledger of the run goes
// through the history checker, which must find no violation (fractions
// within their GPU and of one owner, nothing beside what excludes it).
func TestPreemptionWithFractionsKeepsDeviceInvariants(t *testing.T) {
	owners := []string{"ada", "bob", "cy"}
	var fracPreemptors, fracVictims int
	for seed := range uint64(60) {
		rng := rand.New(rand.NewPCG(seed, 3535))
		var views []NodeView
		for i := range 1 + rng.IntN(3) {
			n := gpuNode(fmt.Sprintf("n%d", i), 1+rng.IntN(4), "A100")
			for g := range n.GPUs {
				switch rng.IntN(3) {
				case 1:
					n = split(n, g)
				case 2:
					n = shareNode(n, g)
				}
			}
			views = append(views, view(n))
		}
		hc := newLedgerChecker(t, views)
		next := 0
		request := func(prio int) Pending {
			next++
			id, owner := fmt.Sprintf("s%d", next), owners[rng.IntN(len(owners))]
			var p Pending
			switch rng.IntN(3) {
			case 0:
				p = req(id, owner, 1+rng.IntN(2), 0)
			case 1:
				p = migReq(id, 1)
				p.Entry.Owner = owner
			default:
				p = fracReq(id, owner, int64(1+rng.IntN(8))*10240)
			}
			p.Entry.Priority = prio
			p.Entry.Preemptible = rng.IntN(4) > 0
			if rng.IntN(2) == 0 {
				p.Entry.Kind = state.KindNotebook
			}
			return p
		}
		// Fill the cluster with lower sessions.
		for range 3 {
			var queue []Pending
			for range 6 {
				queue = append(queue, request(rng.IntN(3)))
			}
			commitOn(t, views, NewPlan(snap(views, queue...), PlanOptions{}))
			hc.apply(t, views)
		}
		var urgentQ []Pending
		for range 1 + rng.IntN(6) {
			urgentQ = append(urgentQ, request(10))
		}
		ps := PlanPreemption(snap(views, urgentQ...), NewPlan(snap(views, urgentQ...), PlanOptions{}), PreemptOptions{Notebooks: true})
		for _, p := range ps {
			e := p.Preemptor.Entry
			var v *NodeView
			for i := range views {
				if views[i].Node.Name == p.Node {
					v = &views[i]
				}
			}
			for _, vi := range p.Victims {
				a, ok := v.Ledger.Allocations[vi.Session]
				if !ok || !a.Preemptible || a.Priority >= e.Priority {
					t.Fatalf("seed %d: %s preempts %s on %s, which it may not (%+v, held %v)", seed, e.Session, vi.Session, p.Node, a, ok)
				}
				if a.Share != nil {
					fracVictims++
				}
				delete(v.Ledger.Allocations, vi.Session)
			}
			v.LedgerRevision++
			hc.apply(t, views)
			if e.Request.Fraction() {
				fracPreemptors++
			}
			s := snap(views, p.Preemptor)
			s.Held = map[string]string{p.Node: e.Session}
			bound := NewPlan(s, PlanOptions{})
			if len(bound.Bound) != 1 {
				t.Fatalf("seed %d: %s's victims %v on %s left, and it still does not bind: %+v", seed, e.Session, victimIDs(p), p.Node, bound.Waiting)
			}
			commitOn(t, views, bound)
			checkDevices(t, views)
			hc.apply(t, views)
		}
	}
	if fracPreemptors == 0 || fracVictims == 0 {
		t.Fatalf("%d fraction preemptors, %d fraction victims in all seeds: the property was not exercised", fracPreemptors, fracVictims)
	}
	t.Logf("%d fraction preemptors, %d fraction victims", fracPreemptors, fracVictims)
}

// ledgerChecker feeds the history checker the ledgers of a test's views
// as a real history would carry them: each change of ledgers one
// revision, with the bindings of the allocations it adds and the
// deletions of those it removes.
type ledgerChecker struct {
	c    *history.Checker
	k    state.Keys
	rev  int64
	last map[string]state.Ledger
}

func newLedgerChecker(t *testing.T, views []NodeView) *ledgerChecker {
	t.Helper()
	k := state.MustKeys("/h3")
	hc := &ledgerChecker{c: history.New(k), k: k, last: map[string]state.Ledger{}}
	var load []history.Change
	for _, v := range views {
		b, err := state.Encode(v.Node)
		if err != nil {
			t.Fatal(err)
		}
		load = append(load, history.Change{Key: k.Node(v.Node.Name), Value: []byte(b)})
		hc.last[v.Node.Name] = state.Ledger{Node: v.Node.Name, Allocations: map[string]state.Allocation{}}
	}
	hc.rev = 1
	if vs := hc.c.Load(hc.rev, load); len(vs) > 0 {
		t.Fatalf("checker: %v", vs)
	}
	return hc
}

// apply writes every ledger that changed since the last call.
func (hc *ledgerChecker) apply(t *testing.T, views []NodeView) {
	t.Helper()
	var ch []history.Change
	for _, v := range views {
		name := v.Node.Name
		old := hc.last[name]
		if reflect.DeepEqual(old.Allocations, v.Ledger.Allocations) {
			continue
		}
		l := state.Ledger{Node: name, Allocations: make(map[string]state.Allocation, len(v.Ledger.Allocations))}
		for id, a := range v.Ledger.Allocations {
			l.Allocations[id] = a
			if _, had := old.Allocations[id]; !had {
				b, err := state.Encode(state.Binding{Session: id, Node: name, GPUs: slices.Clone(a.GPUs), Ports: slices.Clone(a.Ports), Share: a.Share})
				if err != nil {
					t.Fatal(err)
				}
				ch = append(ch, history.Change{Key: hc.k.Binding(name, id), Value: []byte(b)})
			}
		}
		for id := range old.Allocations {
			if _, still := l.Allocations[id]; !still {
				ch = append(ch, history.Change{Key: hc.k.Binding(name, id)})
			}
		}
		b, err := state.Encode(l)
		if err != nil {
			t.Fatal(err)
		}
		ch = append(ch, history.Change{Key: hc.k.Ledger(name), Value: []byte(b)})
		hc.last[name] = l
	}
	if len(ch) == 0 {
		return
	}
	hc.rev++
	if vs := hc.c.Apply(hc.rev, ch); len(vs) > 0 {
		t.Fatalf("checker at revision %d: %v", hc.rev, vs)
	}
}
