package placer

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// holdingAt returns v with session id of owner holding k GPUs from index
// from on.
func holdingAt(v NodeView, id, owner string, from, k int) NodeView {
	a := state.Allocation{Owner: owner, Kind: state.KindBatch, Role: state.RoleSingle, CPUMilli: 1000, MemoryMiB: 1024}
	for i := from; i < from+k; i++ {
		a.GPUs = append(a.GPUs, v.Node.GPUs[i].UUID)
	}
	v.Ledger.Allocations[id] = a
	v.LedgerRevision = 7
	return v
}

// elasticReq is a pending elastic job of min to max GPUs.
func elasticReq(id, owner string, lo, hi int, age time.Duration) Pending {
	p := req(id, owner, lo, age)
	p.Entry.Elastic = &state.Elastic{Min: lo, Max: hi}
	return p
}

func boundGPUs(t *testing.T, plan *Plan, id string) int {
	t.Helper()
	for _, d := range plan.Bound {
		if d.Pending.Entry.Session == id {
			if el := d.Pending.Entry.Elastic; el != nil && el.Size != len(d.Parts[0].Devices) {
				t.Errorf("%s: entry says size %d, bound %d GPUs", id, el.Size, len(d.Parts[0].Devices))
			}
			return len(d.Parts[0].Devices)
		}
	}
	return 0
}

// TestElasticStartsAtLargestFairSize: a queued elastic job is bound at the
// largest size from its cap to its minimum that fair share allows and a
// node holds now; at its minimum or not at all otherwise.
func TestElasticStartsAtLargestFairSize(t *testing.T) {
	n := func() NodeView { return view(gpuNode("n1", 8, "A100")) }
	for _, tc := range []struct {
		name  string
		nodes []NodeView
		queue []Pending
		want  map[string]int
	}{
		{"others hold 6 of 8: it starts at its minimum", []NodeView{holdingAt(n(), "b1", "bob", 0, 6)},
			[]Pending{elasticReq("a", "alice", 2, 8, time.Minute)}, map[string]int{"a": 2}},
		{"an empty node and no one else: its maximum", []NodeView{n()},
			[]Pending{elasticReq("a", "alice", 2, 8, time.Minute)}, map[string]int{"a": 8}},
		{"another owner waits for 8: its fair half", []NodeView{n(), view(gpuNode("n2", 8, "A100"))},
			[]Pending{elasticReq("a", "alice", 2, 8, 2*time.Minute), req("c", "carol", 8, time.Minute), req("c2", "carol", 8, time.Minute/2)},
			map[string]int{"a": 8, "c": 8}},
		{"fair share of a shared node: half", []NodeView{n()},
			[]Pending{elasticReq("a", "alice", 2, 8, 2*time.Minute), req("c", "carol", 4, time.Minute)},
			map[string]int{"a": 4, "c": 4}},
		{"its cap after a resize", []NodeView{n()},
			[]Pending{func() Pending { p := elasticReq("a", "alice", 2, 8, time.Minute); p.Entry.Elastic.Size = 3; return p }()},
			map[string]int{"a": 3}},
		{"its owner's quota of 3 GPUs: 3", []NodeView{n()},
			[]Pending{elasticReq("a", "quota3", 2, 8, time.Minute)}, map[string]int{"a": 3}},
		{"only 1 free, minimum 2: it waits", []NodeView{holdingAt(n(), "b1", "bob", 0, 7)},
			[]Pending{elasticReq("a", "alice", 2, 8, time.Minute)}, map[string]int{"a": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := snap(tc.nodes, tc.queue...)
			three := int64(3)
			s.UserQuotas = map[string]state.Quota{"quota3": {GPUs: &three}}
			plan := NewPlan(s, PlanOptions{})
			for id, want := range tc.want {
				if got := boundGPUs(t, plan, id); got != want {
					t.Errorf("%s bound with %d GPUs, want %d (waiting: %+v)", id, got, want, plan.Waiting)
				}
			}
		})
	}
}

// TestElasticSizingLeavesTheCacheAlone: the queue entry a snapshot shares
// with the cache is never changed by sizing.
func TestElasticSizingLeavesTheCacheAlone(t *testing.T) {
	p := elasticReq("a", "alice", 2, 8, time.Minute)
	NewPlan(snap([]NodeView{view(gpuNode("n1", 8, "A100"))}, p), PlanOptions{})
	if p.Entry.Request.GPUs != 2 || p.Entry.Elastic.Size != 0 {
		t.Fatalf("the cached entry changed: %+v %+v", p.Entry.Request, *p.Entry.Elastic)
	}
}

func resizeOf(rs []Resize, id string) (Resize, bool) {
	for _, r := range rs {
		if r.Session == id {
			return r, true
		}
	}
	return Resize{}, false
}

// TestPlanElastic decides grows and shrinks of running elastic jobs.
func TestPlanElastic(t *testing.T) {
	n := func() NodeView { return view(gpuNode("n1", 8, "A100")) }
	ready := map[string]ElasticJob{"a": {Session: "a", Min: 2, Max: 8, Ready: true}}
	// Sessions being stopped, by case (ElasticOptions.Freeing).
	freeing := map[string]map[string]bool{
		"GPUs being freed are not idle yet: no grow":          {"b": true},
		"a waiter that fits once others stop needs no shrink": {"b": true},
	}
	for _, tc := range []struct {
		name  string
		nodes []NodeView
		queue []Pending
		jobs  map[string]ElasticJob
		want  *Resize // nil: no resize of a
	}{
		{"idle GPUs, nothing waits: grows to its maximum", []NodeView{holdingAt(n(), "a", "alice", 0, 2)}, nil, ready,
			&Resize{Session: "a", From: 2, To: 8}},
		{"idle GPUs beside others: grows into them", []NodeView{holdingAt(holdingAt(n(), "a", "alice", 0, 2), "b", "bob", 2, 2)}, nil, ready,
			&Resize{Session: "a", From: 2, To: 6}},
		{"idle GPUs, its owner's quota of 5: grows to 5", []NodeView{holdingAt(n(), "a", "quota5", 0, 2)}, nil, ready,
			&Resize{Session: "a", From: 2, To: 5}},
		{"at its owner's quota: no grow", []NodeView{holdingAt(n(), "a", "quota5", 0, 5)}, nil, ready, nil},
		{"at its maximum: no grow", []NodeView{holdingAt(n(), "a", "alice", 0, 8)}, nil,
			map[string]ElasticJob{"a": {Session: "a", Min: 2, Max: 8, Ready: true}}, nil},
		{"rate limited: no grow", []NodeView{holdingAt(n(), "a", "alice", 0, 2)}, nil,
			map[string]ElasticJob{"a": {Session: "a", Min: 2, Max: 8}}, nil},
		{"another owner's fixed job waits: shrinks just enough", []NodeView{holdingAt(n(), "a", "alice", 0, 8)},
			[]Pending{req("c", "carol", 6, time.Minute)}, ready, &Resize{Session: "a", From: 8, To: 2, For: "c"}},
		{"a smaller waiter: a smaller shrink", []NodeView{holdingAt(n(), "a", "alice", 0, 8)},
			[]Pending{req("c", "carol", 3, time.Minute)}, ready, &Resize{Session: "a", From: 8, To: 5, For: "c"}},
		{"never below its minimum", []NodeView{holdingAt(n(), "a", "alice", 0, 8)},
			[]Pending{req("c", "carol", 7, time.Minute)}, ready, nil},
		{"its own owner's waiting job is not owed its GPUs, and blocks a grow", []NodeView{holdingAt(holdingAt(n(), "a", "alice", 0, 4), "b", "bob", 4, 2)},
			[]Pending{req("c", "alice", 4, time.Minute)}, ready, nil},
		{"a waiter whose owner holds more is not owed", []NodeView{holdingAt(n(), "a", "alice", 0, 4), holdingAt(view(gpuNode("n2", 8, "A100")), "b", "bob", 0, 8)},
			[]Pending{req("c", "bob", 6, time.Minute)}, map[string]ElasticJob{"a": {Session: "a", Min: 2, Max: 4, Ready: true}}, nil},
		{"a higher priority is owed whatever it holds", []NodeView{holdingAt(n(), "a", "alice", 0, 8), holdingAt(view(gpuNode("n2", 8, "A100")), "b", "bob", 0, 8)},
			[]Pending{func() Pending { p := req("c", "bob", 2, time.Minute); p.Entry.Priority = 10; return p }()}, ready,
			&Resize{Session: "a", From: 8, To: 6, For: "c"}},
		{"rate limited shrink: deferred, still owed", []NodeView{holdingAt(n(), "a", "alice", 0, 8)},
			[]Pending{req("c", "carol", 6, time.Minute)}, map[string]ElasticJob{"a": {Session: "a", Min: 2, Max: 8}},
			&Resize{Session: "a", From: 8, To: 2, For: "c", Deferred: true}},
		{"a resize already under way is not decided again", []NodeView{holdingAt(n(), "a", "alice", 0, 8)},
			[]Pending{req("c", "carol", 6, time.Minute)}, map[string]ElasticJob{"a": {Session: "a", Min: 2, Max: 8, Ready: true, Target: 2}}, nil},
		{"GPUs being freed are not idle yet: no grow", []NodeView{holdingAt(holdingAt(n(), "a", "alice", 0, 2), "b", "bob", 2, 6)}, nil, ready, nil},
		{"a waiter that fits once others stop needs no shrink", []NodeView{holdingAt(holdingAt(n(), "a", "alice", 0, 6), "b", "bob", 6, 2)},
			[]Pending{req("c", "carol", 2, time.Minute)}, ready, nil},
		{"the same waiter, nothing stopping: a shrink", []NodeView{holdingAt(holdingAt(n(), "a", "alice", 0, 6), "b", "bob", 6, 2)},
			[]Pending{req("c", "carol", 2, time.Minute)}, ready, &Resize{Session: "a", From: 6, To: 4, For: "c"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := snap(tc.nodes, tc.queue...)
			five := int64(5)
			s.UserQuotas = map[string]state.Quota{"quota5": {GPUs: &five}}
			rs := PlanElastic(s, NewPlan(s, PlanOptions{}), tc.jobs, ElasticOptions{Freeing: freeing[tc.name]})
			got, ok := resizeOf(rs, "a")
			switch {
			case tc.want == nil && ok:
				t.Fatalf("resized: %+v", got)
			case tc.want == nil:
			case !ok:
				t.Fatalf("no resize, want %+v", *tc.want)
			case got.From != tc.want.From || got.To != tc.want.To || got.For != tc.want.For || got.Deferred != tc.want.Deferred:
				t.Fatalf("got %+v, want %+v", got, *tc.want)
			case got.Why == "" || !strings.Contains(got.Why, "GPUs"):
				t.Fatalf("no explanation: %+v", got)
			}
		})
	}
}

// BenchmarkPlanElastic is one lifecycle pass's elastic planning at
// cluster scale: 1,000 nodes of 8 GPUs, each with an elastic job of 2-8
// GPUs holding 4 and another owner's 2-GPU job, and 2,000 fixed requests
// of 1 to 8 GPUs waiting (shrinks to decide), against NewPlan of the same
// snapshot (which sizes 200 queued elastic jobs too), and NewPlan with
// those 200 as fixed 2-GPU requests.
func BenchmarkPlanElastic(b *testing.B) {
	const nodes, waiting, queuedElastic = 1000, 2000, 200
	var views []NodeView
	jobs := map[string]ElasticJob{}
	for i := 0; i < nodes; i++ {
		name := "n" + strconv.Itoa(i)
		v := holdingAt(holdingAt(view(gpuNode(name, 8, "A100")), "e"+name, "u"+strconv.Itoa(i%50), 0, 4), "f"+name, "v"+strconv.Itoa(i%40), 4, 2)
		views = append(views, v)
		jobs["e"+name] = ElasticJob{Session: "e" + name, Min: 2, Max: 8, Ready: true}
	}
	var queue []Pending
	for i := 0; i < waiting; i++ {
		queue = append(queue, req("w"+strconv.Itoa(i), "w"+strconv.Itoa(i%30), 1+i%8, time.Duration(i)*time.Second))
	}
	for i := 0; i < queuedElastic; i++ {
		queue = append(queue, elasticReq("q"+strconv.Itoa(i), "q"+strconv.Itoa(i%20), 2, 8, time.Duration(i)*time.Second))
	}
	s := snap(views, queue...)
	fixed := make([]Pending, len(queue))
	for i, p := range queue {
		fixed[i] = p
		if p.Entry.Elastic != nil {
			fixed[i] = req(p.Entry.Session, p.Entry.Owner, 2, 0)
		}
	}
	b.Run("NewPlanFixed", func(b *testing.B) {
		sf := snap(views, fixed...)
		for b.Loop() {
			NewPlan(sf, PlanOptions{})
		}
	})
	b.Run("NewPlan", func(b *testing.B) {
		for b.Loop() {
			NewPlan(s, PlanOptions{})
		}
	})
	plan := NewPlan(s, PlanOptions{})
	b.Run("PlanElastic", func(b *testing.B) {
		n := 0
		for b.Loop() {
			n = len(PlanElastic(s, plan, jobs, ElasticOptions{}))
		}
		b.ReportMetric(float64(n), "resizes/op")
	})
}
