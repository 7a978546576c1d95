package placer

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// shareNode returns n with GPUs idx shared (offered in fractions).
func shareNode(n state.Node, idx ...int) state.Node {
	n.GPUs = append([]state.GPU(nil), n.GPUs...)
	for _, i := range idx {
		n.GPUs[i].Shared = true
	}
	return n
}

// fracReq is a pending fraction of mib MiB of one shared GPU.
func fracReq(id, owner string, mib int64) Pending {
	p := req(id, owner, 1, 0)
	p.Entry.Request.GPUShareMiB = mib
	return p
}

// commitOn adds what p bound to the views' ledgers as the bind does:
// each allocation re-checked by refit against the ledger it joins. A
// refit that refuses a planned choice fails the test: the plan and the
// bind's re-check must agree.
func commitOn(t *testing.T, views []NodeView, p *Plan) {
	t.Helper()
	byName := map[string]*NodeView{}
	for i := range views {
		byName[views[i].Node.Name] = &views[i]
	}
	for _, d := range p.Bound {
		e := d.Pending.Entry
		for _, pp := range d.Parts {
			v := byName[pp.Node]
			a := allocation(e, pp)
			if err := refit(&v.Node, &v.Ledger, e.Session, &a, 0); err != nil {
				t.Fatalf("refit refuses the plan's choice for %s on %s: %v", e.Session, pp.Node, err)
			}
			v.Ledger.Allocations[e.Session] = a
			v.LedgerRevision++
		}
	}
}

// checkDevices asserts the invariants of devices over every ledger:
// nothing excludes anything held beside it (a whole GPU beside a fraction
// or a MIG device of it, a device twice), a GPU's fractions within its
// memory and of one owner, and whole allocations never on shared GPUs,
// fractions only on them.
func checkDevices(t *testing.T, views []NodeView) {
	t.Helper()
	for _, v := range views {
		inv := v.Node.DeviceParents()
		h := state.HoldingsOf(v.Ledger, inv)
		gpus := map[string]state.GPU{}
		for _, g := range v.Node.GPUs {
			gpus[g.UUID] = g
		}
		for id, a := range v.Ledger.Allocations {
			if c := h.Conflicts(id, a, inv); len(c) > 0 {
				t.Fatalf("node %s: %v", v.Node.Name, c)
			}
			for _, u := range a.GPUs {
				if g, ok := gpus[u]; ok && g.Shared != (a.Share != nil) {
					t.Fatalf("node %s: %s holds %s (shared %v) with share %v", v.Node.Name, id, u, g.Shared, a.Share)
				}
			}
		}
		for p, s := range v.Ledger.Fractions() {
			if s.MemoryMiB > gpus[p].MemoryMiB {
				t.Fatalf("node %s: fractions of %s hold %d MiB of %d", v.Node.Name, p, s.MemoryMiB, gpus[p].MemoryMiB)
			}
			if len(s.Owners) > 1 {
				t.Fatalf("node %s: shared GPU %s holds fractions of %v", v.Node.Name, p, s.Owners)
			}
		}
	}
}

// TestFractionsPackAndNeverExceedTheGPU: fractions of one owner fill the
// shared GPU that already holds fractions before an empty one, up to its
// memory and no further; a whole-GPU request never lands on a shared GPU;
// a fraction that fits nowhere waits with a reason that names the room.
func TestFractionsPackAndNeverExceedTheGPU(t *testing.T) {
	n := shareNode(gpuNode("n", 3, "A100"), 1, 2) // 0 whole, 1 and 2 shared, 80 GiB each
	views := []NodeView{view(n)}
	p := NewPlan(snap(views, fracReq("f1", "ada", 30000), fracReq("f2", "ada", 30000), fracReq("f3", "ada", 20000), req("w", "bob", 1, 0)), PlanOptions{})
	commitOn(t, views, p)
	checkDevices(t, views)
	l := views[0].Ledger.Allocations
	if len(p.Bound) != 4 {
		t.Fatalf("bound %d of 4: waiting %+v", len(p.Bound), p.Waiting)
	}
	if l["f1"].GPUs[0] != l["f2"].GPUs[0] || l["f2"].GPUs[0] != l["f3"].GPUs[0] {
		t.Fatalf("fractions spread over %s, %s, %s; want them packed on one shared GPU", l["f1"].GPUs[0], l["f2"].GPUs[0], l["f3"].GPUs[0])
	}
	if l["w"].GPUs[0] != n.GPUs[0].UUID {
		t.Fatalf("whole request on %s; want the only whole GPU %s", l["w"].GPUs[0], n.GPUs[0].UUID)
	}
	if s := l["f1"].Share; s == nil || s.GPUMemoryMiB != 81920 || s.MemoryMiB != 30000 {
		t.Fatalf("f1's share %+v; want 30000 of 81920 MiB", s)
	}
	// 80000 of 81920 MiB held on that GPU: 2000 more goes to the other.
	p = NewPlan(snap(views, fracReq("f4", "ada", 2000)), PlanOptions{})
	commitOn(t, views, p)
	if len(p.Bound) != 1 || views[0].Ledger.Allocations["f4"].GPUs[0] == l["f1"].GPUs[0] {
		t.Fatalf("f4 bound %+v; want it on the other shared GPU", p.Bound)
	}
	// Nothing has 81920 MiB left now, and no whole GPU is free.
	p = NewPlan(snap(views, fracReq("f5", "ada", 81000), req("w2", "bob", 1, 0)), PlanOptions{})
	if len(p.Bound) != 0 || len(p.Waiting) != 2 {
		t.Fatalf("bound %+v; want f5 and w2 waiting", p.Bound)
	}
	for _, w := range p.Waiting {
		if w.Pending.Entry.Session == "f5" && !strings.Contains(w.Message, "fraction") {
			t.Errorf("f5 waits with %q; want it to say what fraction it waits for", w.Message)
		}
	}
	checkDevices(t, views)
}

// TestSharedGPUHoldsOneOwner: a shared GPU holding one owner's fractions
// takes no other owner's (classic MPS serves one user at a time); another
// owner's fraction goes to another shared GPU or waits saying why, and the
// bind's refit refuses it too.
func TestSharedGPUHoldsOneOwner(t *testing.T) {
	n := shareNode(gpuNode("n", 1, "A100"), 0)
	views := []NodeView{view(n)}
	commitOn(t, views, NewPlan(snap(views, fracReq("a1", "ada", 10000)), PlanOptions{}))
	p := NewPlan(snap(views, fracReq("b1", "bob", 10000), fracReq("a2", "ada", 10000)), PlanOptions{})
	if len(p.Bound) != 1 || p.Bound[0].Pending.Entry.Session != "a2" {
		t.Fatalf("bound %+v; want only ada's a2", p.Bound)
	}
	if len(p.Waiting) != 1 || !strings.Contains(p.Waiting[0].Message, "one user per shared GPU") {
		t.Fatalf("waiting %+v; want bob's b1 told why", p.Waiting)
	}
	a := state.Allocation{Owner: "bob", GPUs: []string{n.GPUs[0].UUID}, Share: &state.GPUShare{MemoryMiB: 1000}, CPUMilli: 1000, MemoryMiB: 1024}
	if err := refit(&n, &views[0].Ledger, "b1", &a, 0); err == nil || !strings.Contains(err.Error(), "one user per shared GPU") {
		t.Fatalf("refit of bob's fraction beside ada's = %v; want it refused", err)
	}
}

// TestRefitRefusesFractionOverTheGPU: the bind's re-check against a ledger
// that moved since the plan refuses a fraction that no longer fits the
// GPU's memory, one on a GPU now held whole, and a whole GPU on a shared
// one.
func TestRefitRefusesFractionOverTheGPU(t *testing.T) {
	n := shareNode(gpuNode("n", 2, "A100"), 0)
	shared, whole := n.GPUs[0].UUID, n.GPUs[1].UUID
	l := state.Ledger{Allocations: map[string]state.Allocation{
		"a1": {Owner: "ada", GPUs: []string{shared}, Share: &state.GPUShare{MemoryMiB: 70000, GPUMemoryMiB: 81920}},
	}}
	frac := func(u string, mib int64) *state.Allocation {
		return &state.Allocation{Owner: "ada", GPUs: []string{u}, Share: &state.GPUShare{MemoryMiB: mib}}
	}
	if err := refit(&n, &l, "a2", frac(shared, 12000), 0); err == nil || !strings.Contains(err.Error(), "11920 of 81920 MiB free") {
		t.Errorf("refit of 12000 MiB beside 70000 = %v; want refused", err)
	}
	if err := refit(&n, &l, "a2", frac(shared, 11920), 0); err != nil {
		t.Errorf("refit of 11920 MiB beside 70000 = %v; want it to fit exactly", err)
	}
	if err := refit(&n, &l, "a2", frac(whole, 100), 0); err == nil {
		t.Error("refit of a fraction of a GPU that is not shared: accepted")
	}
	if err := refit(&n, &l, "w", &state.Allocation{Owner: "bob", GPUs: []string{shared}}, 0); err == nil {
		t.Error("refit of a shared GPU whole: accepted")
	}
	// The node registered again with that GPU whole (no longer shared):
	// the fraction still holds it, so nobody gets it whole.
	unshared := gpuNode("n", 2, "A100")
	if err := refit(&unshared, &l, "w", &state.Allocation{Owner: "bob", GPUs: []string{shared}}, 0); err == nil || !strings.Contains(err.Error(), "held by session a1") {
		t.Errorf("refit of the GPU whole while a fraction of it is held = %v; want refused", err)
	}
	v := view(unshared)
	v.Ledger = l
	if p := NewPlan(snap([]NodeView{v}, req("w", "bob", 2, 0)), PlanOptions{}); len(p.Bound) != 0 {
		t.Errorf("plan bound %+v on a GPU a fraction holds", p.Bound[0].Parts)
	}
}

// TestFractionCountsAsItsShare: fair share and quotas count a fraction as
// its share of its GPU (memory, or compute percent where larger), not as a
// GPU.
func TestFractionCountsAsItsShare(t *testing.T) {
	for _, tc := range []struct {
		s    state.GPUShare
		want int64
	}{
		{state.GPUShare{MemoryMiB: 20480, GPUMemoryMiB: 81920}, 250},
		{state.GPUShare{MemoryMiB: 20480, ComputePercent: 50, GPUMemoryMiB: 81920}, 500},
		{state.GPUShare{MemoryMiB: 1, GPUMemoryMiB: 81920}, 1},
	} {
		if got := tc.s.MilliGPUs(); got != tc.want {
			t.Errorf("%v counts %d thousandths; want %d", tc.s, got, tc.want)
		}
	}
	// A user with a quota of 1 GPU holds three quarters of one in
	// fractions: another quarter fits, a whole GPU does not.
	n := shareNode(gpuNode("n", 2, "A100"), 0)
	v := view(n)
	v.Ledger.Allocations["a1"] = state.Allocation{Owner: "ada", GPUs: []string{n.GPUs[0].UUID}, Share: &state.GPUShare{MemoryMiB: 61440, GPUMemoryMiB: 81920}}
	one := int64(1)
	quota := map[string]state.Quota{"ada": {GPUs: &one}}
	s := snap([]NodeView{v}, req("w", "ada", 1, 0))
	s.UserQuotas = quota
	p := NewPlan(s, PlanOptions{})
	if len(p.Bound) != 0 || len(p.Waiting) != 1 || !strings.Contains(p.Waiting[0].Message, "0.75 GPUs held of 1 allowed") {
		t.Fatalf("bound %+v, waiting %+v; want w over the quota, counting 0.75 GPUs held", p.Bound, p.Waiting)
	}
	s = snap([]NodeView{v}, fracReq("a2", "ada", 20480))
	s.UserQuotas = quota
	if p := NewPlan(s, PlanOptions{}); len(p.Bound) != 1 {
		t.Fatalf("the last quarter waits: %+v", p.Waiting)
	}
}

// TestMixedDevicesNeverBreakExclusivity is the property: on random
// clusters of whole, MIG-split and shared GPUs, random queues of whole,
// MIG and fractional requests of a few owners, planned and bound pass
// after pass with random releases between, never break an invariant of
// devices (checkDevices), and the bind's refit accepts every choice the
// plan makes.
func TestMixedDevicesNeverBreakExclusivity(t *testing.T) {
	owners := []string{"ada", "bob", "cy"}
	for seed := range uint64(40) {
		rng := rand.New(rand.NewPCG(seed, 35))
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
		next := 0
		for range 6 {
			var queue []Pending
			for range 1 + rng.IntN(8) {
				next++
				id, owner := fmt.Sprintf("s%d", next), owners[rng.IntN(len(owners))]
				switch rng.IntN(3) {
				case 0:
					queue = append(queue, req(id, owner, 1+rng.IntN(2), 0))
				case 1:
					queue = append(queue, migReq(id, 1))
				default:
					queue = append(queue, fracReq(id, owner, int64(1+rng.IntN(8))*10240))
				}
			}
			p := NewPlan(snap(views, queue...), PlanOptions{})
			commitOn(t, views, p)
			checkDevices(t, views)
			for i := range views {
				for id := range views[i].Ledger.Allocations {
					if rng.IntN(3) == 0 {
						delete(views[i].Ledger.Allocations, id)
						views[i].LedgerRevision++
					}
				}
			}
		}
	}
}
