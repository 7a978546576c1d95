package placer

import (
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// running adds session id, of kind and priority, holding GPUs first..first+n-1 of v.
func running(v NodeView, id string, kind state.SessionKind, prio int, preemptible bool, first, n int) NodeView {
	a := state.Allocation{Kind: kind, Owner: "bob", Priority: prio, Preemptible: preemptible, Role: state.RoleSingle, CPUMilli: 1000, MemoryMiB: 1024}
	for i := first; i < first+n; i++ {
		a.GPUs = append(a.GPUs, v.Node.GPUs[i].UUID)
	}
	v.Ledger.Allocations[id] = a
	return v
}

func urgent(id string, gpus, prio int) Pending {
	p := req(id, "ada", gpus, 0)
	p.Entry.Priority = prio
	return p
}

func preempt(s *Snapshot, opt PreemptOptions) []Preemption {
	return PlanPreemption(s, NewPlan(s, PlanOptions{}), opt)
}

func victimIDs(p Preemption) []string {
	var ids []string
	for _, v := range p.Victims {
		ids = append(ids, v.Session)
	}
	return ids
}

func TestPreemptionPicksFewestVictims(t *testing.T) {
	// Node a: four 2-GPU jobs; node b: one 4-GPU job and two 2-GPU jobs.
	// A 4-GPU request is served by stopping the single 4-GPU job on b.
	a := view(gpuNode("a", 8, "A100"))
	for i := 0; i < 4; i++ {
		a = running(a, fmt.Sprintf("a%d", i), state.KindBatch, 0, true, 2*i, 2)
	}
	b := view(gpuNode("b", 8, "A100"))
	b = running(b, "b-big", state.KindBatch, 0, true, 0, 4)
	b = running(b, "b-s1", state.KindBatch, 0, true, 4, 2)
	b = running(b, "b-s2", state.KindBatch, 0, true, 6, 2)
	ps := preempt(snap([]NodeView{a, b}, urgent("vip", 4, 10)), PreemptOptions{})
	if len(ps) != 1 {
		t.Fatalf("got %d preemptions, want 1: %+v", len(ps), ps)
	}
	if ps[0].Node != "b" || !reflect.DeepEqual(victimIDs(ps[0]), []string{"b-big"}) {
		t.Fatalf("preemption on %s of %v, want b-big alone on b", ps[0].Node, victimIDs(ps[0]))
	}
}

func TestPreemptionDropsUnneededVictims(t *testing.T) {
	// 6 GPUs needed, 2 free: the largest-first pass takes the 4-GPU job;
	// nothing else is needed, so the 2-GPU job is spared.
	a := view(gpuNode("a", 8, "A100"))
	a = running(a, "two", state.KindBatch, 0, true, 0, 2)
	a = running(a, "four", state.KindBatch, 0, true, 2, 4)
	ps := preempt(snap([]NodeView{a}, urgent("vip", 6, 10)), PreemptOptions{})
	if len(ps) != 1 || !reflect.DeepEqual(victimIDs(ps[0]), []string{"four"}) {
		t.Fatalf("preemptions %+v, want [four]", ps)
	}
	// 8 needed: both go.
	ps = preempt(snap([]NodeView{a}, urgent("vip", 8, 10)), PreemptOptions{})
	if len(ps) != 1 || !reflect.DeepEqual(victimIDs(ps[0]), []string{"four", "two"}) {
		t.Fatalf("preemptions %+v, want [four two]", ps)
	}
}

func TestPreemptionRules(t *testing.T) {
	full := func(kind state.SessionKind, prio int, preemptible bool) NodeView {
		return running(view(gpuNode("a", 8, "A100")), "victim", kind, prio, preemptible, 0, 8)
	}
	for _, tc := range []struct {
		name string
		node NodeView
		opt  PreemptOptions
		want bool
	}{
		{"lower-priority preemptible batch", full(state.KindBatch, 0, true), PreemptOptions{}, true},
		{"not preemptible", full(state.KindBatch, 0, false), PreemptOptions{}, false},
		{"same priority", full(state.KindBatch, 10, true), PreemptOptions{}, false},
		{"higher priority", full(state.KindBatch, 20, true), PreemptOptions{}, false},
		{"notebook by default", full(state.KindNotebook, 0, true), PreemptOptions{}, false},
		{"notebook when configured", full(state.KindNotebook, 0, true), PreemptOptions{Notebooks: true}, true},
		{"victim already warned", full(state.KindBatch, 0, true), PreemptOptions{Victims: map[string]bool{"victim": true}}, false},
		{"preemptor already preempting", full(state.KindBatch, 0, true), PreemptOptions{Preemptors: map[string]bool{"vip": true}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ps := preempt(snap([]NodeView{tc.node}, urgent("vip", 8, 10)), tc.opt)
			if got := len(ps) == 1; got != tc.want {
				t.Fatalf("preempted: %v, want %v (%+v)", got, tc.want, ps)
			}
		})
	}
}

func TestPreemptionNotWhenItFitsOrCannot(t *testing.T) {
	// Room is free: the plan binds it, nothing is preempted.
	a := running(view(gpuNode("a", 8, "A100")), "x", state.KindBatch, 0, true, 0, 4)
	if ps := preempt(snap([]NodeView{a}, urgent("vip", 4, 10)), PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("preempted %+v though 4 GPUs are free", ps)
	}
	// Stopping every allowed victim still leaves too little: nobody is stopped.
	b := running(view(gpuNode("b", 8, "A100")), "keep", state.KindBatch, 50, true, 0, 4)
	b = running(b, "low", state.KindBatch, 0, true, 4, 4)
	if ps := preempt(snap([]NodeView{b}, urgent("vip", 8, 10)), PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("preempted %+v though the result cannot fit", ps)
	}
	// A wrong model is not helped by preemption.
	c := running(view(gpuNode("c", 8, "V100")), "low", state.KindBatch, 0, true, 0, 8)
	u := urgent("vip", 8, 10)
	u.Entry.Request.GPUModel = "*A100*"
	if ps := preempt(snap([]NodeView{c}, u), PreemptOptions{}); len(ps) != 0 {
		t.Fatalf("preempted %+v for a model the node lacks", ps)
	}
}

func TestPreemptionHeldNodeGoesToItsPreemptor(t *testing.T) {
	// The victims of vip's preemption are stopping on a; meanwhile 4 GPUs
	// became free there. A lower-priority request must not take them.
	a := running(view(gpuNode("a", 8, "A100")), "victim", state.KindBatch, 0, true, 0, 4)
	s := snap([]NodeView{a}, urgent("vip", 8, 10), urgent("small", 4, 5))
	s.Held = map[string]string{"a": "vip"}
	p := NewPlan(s, PlanOptions{})
	if len(p.Bound) != 0 {
		t.Fatalf("bound %+v on a node held for vip", p.Bound)
	}
	if p.Reserved["a"] != "vip" {
		t.Fatalf("reserved %v, want a held for vip", p.Reserved)
	}
	// Two preemptors in one pass never pick the same node or victims.
	b := view(gpuNode("b", 8, "A100"))
	for i := 0; i < 4; i++ {
		b = running(b, fmt.Sprintf("b%d", i), state.KindBatch, 0, true, 2*i, 2)
	}
	c := running(view(gpuNode("c", 8, "A100")), "c0", state.KindBatch, 0, true, 0, 8)
	ps := preempt(snap([]NodeView{b, c}, urgent("p1", 8, 10), urgent("p2", 8, 10)), PreemptOptions{})
	if len(ps) != 2 || ps[0].Node == ps[1].Node {
		t.Fatalf("preemptions %+v, want two on different nodes", ps)
	}
	if ps[0].Node != "c" || len(ps[0].Victims) != 1 {
		t.Errorf("first preemptor got %s with %v; the fewest victims are on c", ps[0].Node, victimIDs(ps[0]))
	}
}

func TestHeldNodeGoesToItsPreemptorPastItsShape(t *testing.T) {
	// a's victims have stopped: a is free and held for vip. An older
	// request of vip's very shape and priority comes first in the order
	// and finds no node (a is held); vip must still get a. A pass used to
	// answer vip from what its shape found a moment earlier.
	a := view(gpuNode("a", 8, "A100"))
	older := urgent("older", 8, 10)
	older.Entry.Created = older.Entry.Created.Add(-time.Hour)
	s := snap([]NodeView{a}, older, urgent("vip", 8, 10))
	s.Held = map[string]string{"a": "vip"}
	p := NewPlan(s, PlanOptions{})
	if len(p.Bound) != 1 || p.Bound[0].Pending.Entry.Session != "vip" || p.Bound[0].Parts[0].Node != "a" {
		t.Fatalf("bound %+v, want vip on a", p.Bound)
	}
}
