package placer

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// nodesReq is a pending elastic job of lo to hi machines of g GPUs each,
// its queue entry as state.NewQueueEntry makes it.
func nodesReq(id, owner string, lo, hi, g int, age time.Duration) Pending {
	s := state.Session{ID: id, Owner: owner, Kind: state.KindBatch, Nodes: hi, Created: t0.Add(-age),
		Resources: state.Resources{GPUs: g, CPUMilli: 1000, MemoryMiB: 1024}, Elastic: &state.Elastic{MinNodes: lo, MaxNodes: hi}}
	q := state.NewQueueEntry(s, t0.Add(-age))
	return Pending{Revision: 1, Entry: &q}
}

// gangReq is a pending fixed multi-node job of n machines of g GPUs each.
func gangReq(id, owner string, n, g int, age time.Duration) Pending {
	s := state.Session{ID: id, Owner: owner, Kind: state.KindBatch, Nodes: n, Created: t0.Add(-age),
		Resources: state.Resources{GPUs: g, CPUMilli: 1000, MemoryMiB: 1024}}
	q := state.NewQueueEntry(s, t0.Add(-age))
	return Pending{Revision: 1, Entry: &q}
}

// partAt returns v with a part (role) of session id of owner holding its
// first k GPUs.
func partAt(v NodeView, id, owner string, role state.Role, k int) NodeView {
	v = holdingAt(v, id, owner, 0, k)
	a := v.Ledger.Allocations[id]
	a.Role = role
	v.Ledger.Allocations[id] = a
	return v
}

func twoGPUNode(name string) NodeView { return view(gpuNode(name, 2, "A100")) }

// boundNodes is how many parts id was bound with (0: not bound), checking
// the decision against what its entry says.
func boundNodes(t *testing.T, plan *Plan, id string) int {
	t.Helper()
	for _, d := range plan.Bound {
		if d.Pending.Entry.Session != id {
			continue
		}
		el := d.Pending.Entry.Elastic
		var nodes []string
		gpus := 0
		for i, pp := range d.Parts {
			nodes = append(nodes, pp.Node)
			gpus += len(pp.Devices)
			want := state.RoleWorker
			if i == 0 {
				want = state.RoleHead
			}
			if pp.Role != want || (i > 0 && pp.Worker != i) {
				t.Errorf("%s part %d: role %s worker %d, want %s", id, i, pp.Role, pp.Worker, want)
			}
		}
		if slices.Sort(nodes); len(slices.Compact(nodes)) != len(d.Parts) {
			t.Errorf("%s: two parts on one node: %v", id, nodes)
		}
		if el == nil || el.Nodes != len(d.Parts) || el.Size != gpus {
			t.Errorf("%s: entry says %+v, bound %d parts with %d GPUs", id, el, len(d.Parts), gpus)
		}
		if want := d.Pending.Entry.Ports(state.RoleHead); len(d.Parts[0].Ports) != want {
			t.Errorf("%s: rank 0 has %d ports, want %d (MASTER_PORT and its peer ports)", id, len(d.Parts[0].Ports), want)
		}
		return len(d.Parts)
	}
	return 0
}

// TestElasticNodesStartOnTheMostMachines: a queued elastic job over a
// range of machines is bound on the most machines from its cap down to
// its minimum that fair share, its quotas and the free nodes allow, one
// part on each, rank 0 the head even alone; at its minimum or not at all
// otherwise.
func TestElasticNodesStartOnTheMostMachines(t *testing.T) {
	four := func() []NodeView {
		return []NodeView{twoGPUNode("n1"), twoGPUNode("n2"), twoGPUNode("n3"), twoGPUNode("n4")}
	}
	for _, tc := range []struct {
		name  string
		nodes []NodeView
		queue []Pending
		want  map[string]int // parts
	}{
		{"free machines, no one else: its maximum", four(), []Pending{nodesReq("a", "alice", 1, 3, 2, time.Minute)}, map[string]int{"a": 3}},
		{"others hold all but one machine: one, its minimum", []NodeView{twoGPUNode("n1"), partAt(twoGPUNode("n2"), "b1", "bob", state.RoleSingle, 2),
			partAt(twoGPUNode("n3"), "b2", "bob", state.RoleSingle, 2)}, []Pending{nodesReq("a", "alice", 1, 3, 2, time.Minute)}, map[string]int{"a": 1}},
		{"another owner waits for two machines: its fair half", four(),
			[]Pending{nodesReq("a", "alice", 1, 4, 2, 2*time.Minute), req("c1", "carol", 2, time.Minute), req("c2", "carol", 2, time.Minute/2)},
			map[string]int{"a": 2, "c1": 1, "c2": 1}},
		{"its cap after a resize", four(), []Pending{func() Pending {
			p := nodesReq("a", "alice", 1, 4, 2, time.Minute)
			p.Entry.Elastic.Nodes, p.Entry.Workers = 2, 1 // as NewQueueEntry of a spec resized to 2
			return p
		}()}, map[string]int{"a": 2}},
		{"its owner's quota of 4 GPUs: two machines", four(), []Pending{nodesReq("a", "quota4", 1, 4, 2, time.Minute)}, map[string]int{"a": 2}},
		{"minimum 2, one free machine: it waits", []NodeView{twoGPUNode("n1"), partAt(twoGPUNode("n2"), "b1", "bob", state.RoleSingle, 2)},
			[]Pending{nodesReq("a", "alice", 2, 3, 2, time.Minute)}, map[string]int{"a": 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := snap(tc.nodes, tc.queue...)
			four := int64(4)
			s.UserQuotas = map[string]state.Quota{"quota4": {GPUs: &four}}
			cached := *tc.queue[0].Entry
			plan := NewPlan(s, PlanOptions{})
			for id, want := range tc.want {
				if id[0] == 'c' {
					if !slices.ContainsFunc(plan.Bound, func(d Decision) bool { return d.Pending.Entry.Session == id }) {
						t.Errorf("%s waits, want it bound (waiting: %+v)", id, plan.Waiting)
					}
					continue
				}
				if got := boundNodes(t, plan, id); got != want {
					t.Errorf("%s bound on %d machines, want %d (waiting: %+v)", id, got, want, plan.Waiting)
				}
			}
			if e := tc.queue[0].Entry; e.Workers != cached.Workers || e.Elastic.Size != 0 {
				t.Errorf("sizing changed the cached entry: %+v %+v", e, e.Elastic)
			}
		})
	}
}

// TestPlanElasticNodes decides grows and shrinks, by whole machines, of
// running elastic jobs over a range of machines.
func TestPlanElasticNodes(t *testing.T) {
	job := func(lo, hi int, ready bool) map[string]ElasticJob {
		return map[string]ElasticJob{"a": {Session: "a", Min: lo, Max: hi, Ready: ready, Nodes: true,
			Part: state.Resources{GPUs: 2, CPUMilli: 1000, MemoryMiB: 1024}}}
	}
	// a on n1 (head) and on n2..nk (workers).
	holdsA := func(k int, rest ...NodeView) []NodeView {
		out := []NodeView{partAt(twoGPUNode("n1"), "a", "alice", state.RoleHead, 2)}
		for i := 2; i <= k; i++ {
			out = append(out, partAt(twoGPUNode("n"+string(rune('0'+i))), "a", "alice", state.RoleWorker, 2))
		}
		return append(out, rest...)
	}
	bob := func(name string) NodeView { return partAt(twoGPUNode(name), "b-"+name, "bob", state.RoleSingle, 2) }
	freeing := map[string]map[string]bool{"a waiter that fits once others stop needs no shrink": {"b-n4": true}}
	for _, tc := range []struct {
		name  string
		nodes []NodeView
		queue []Pending
		jobs  map[string]ElasticJob
		want  *Resize // nil: no resize of a
	}{
		{"idle machines, nothing waits: grows to its maximum", holdsA(1, twoGPUNode("n2"), twoGPUNode("n3")), nil, job(1, 3, true),
			&Resize{Session: "a", From: 1, To: 3, Ledgers: []string{"n1", "n2", "n3"}}},
		{"one idle machine beside others': grows onto it", holdsA(1, twoGPUNode("n2"), bob("n3")), nil, job(1, 3, true),
			&Resize{Session: "a", From: 1, To: 2, Ledgers: []string{"n1", "n2"}}},
		{"a machine with one GPU free holds no part: no grow", holdsA(1, partAt(twoGPUNode("n2"), "b", "bob", state.RoleSingle, 1)), nil, job(1, 3, true), nil},
		{"its owner's quota of 4 GPUs: grows to 2", func() []NodeView {
			v := holdsA(1, twoGPUNode("n2"), twoGPUNode("n3"))
			a := v[0].Ledger.Allocations["a"]
			a.Owner = "quota4"
			v[0].Ledger.Allocations["a"] = a
			return v
		}(), nil, job(1, 3, true), &Resize{Session: "a", From: 1, To: 2, Ledgers: []string{"n1", "n2"}}},
		{"at its maximum: no grow", holdsA(3, twoGPUNode("n4")), nil, job(1, 3, true), nil},
		{"rate limited: no grow", holdsA(1, twoGPUNode("n2")), nil, job(1, 3, false), nil},
		{"another owner's fixed job waits: one machine fewer", holdsA(3), []Pending{req("c", "carol", 2, time.Minute)}, job(1, 3, true),
			&Resize{Session: "a", From: 3, To: 2, For: "c", Ledgers: []string{"n1", "n2", "n3"}}},
		{"a multi-node waiter of two machines: two fewer", holdsA(3), []Pending{gangReq("c", "carol", 2, 2, time.Minute)}, job(1, 3, true),
			&Resize{Session: "a", From: 3, To: 1, For: "c", Ledgers: []string{"n1", "n2", "n3"}}},
		{"never below its minimum", holdsA(3), []Pending{gangReq("c", "carol", 2, 2, time.Minute)}, job(2, 3, true), nil},
		{"its own owner's waiting job is not owed its machines, and blocks a grow", holdsA(1, twoGPUNode("n2"), bob("n3")),
			[]Pending{req("c", "alice", 2, time.Minute), req("c2", "alice", 2, time.Minute)}, job(1, 3, true), nil},
		{"its own owner's waiting job is not owed its machines", holdsA(3), []Pending{req("c", "alice", 2, time.Minute)}, job(1, 3, true), nil},
		{"a waiter whose owner holds more is not owed", holdsA(2, bob("n3"), bob("n4"), bob("n5")), []Pending{req("c", "bob", 2, time.Minute)}, job(1, 3, true), nil},
		{"a higher priority is owed whatever it holds", holdsA(2, bob("n3"), bob("n4"), bob("n5")), []Pending{func() Pending {
			p := req("c", "bob", 2, time.Minute)
			p.Entry.Priority = 10
			return p
		}()}, job(1, 3, true), &Resize{Session: "a", From: 2, To: 1, For: "c", Ledgers: []string{"n1", "n2"}}},
		{"rate limited shrink: deferred, still owed", holdsA(3), []Pending{req("c", "carol", 2, time.Minute)}, job(1, 3, false),
			&Resize{Session: "a", From: 3, To: 2, For: "c", Deferred: true, Ledgers: []string{"n1", "n2", "n3"}}},
		{"a resize already under way is not decided again", holdsA(3), []Pending{req("c", "carol", 2, time.Minute)},
			map[string]ElasticJob{"a": {Session: "a", Min: 1, Max: 3, Ready: true, Nodes: true, Target: 2, Part: state.Resources{GPUs: 2}}}, nil},
		{"a waiter that fits once others stop needs no shrink", holdsA(3, bob("n4")), []Pending{req("c", "carol", 2, time.Minute)}, job(1, 3, true), nil},
		{"the same waiter, nothing stopping: a shrink", holdsA(3, bob("n4")), []Pending{req("c", "carol", 2, time.Minute)}, job(1, 3, true),
			&Resize{Session: "a", From: 3, To: 2, For: "c", Ledgers: []string{"n1", "n2", "n3"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := snap(tc.nodes, tc.queue...)
			four := int64(4)
			s.UserQuotas = map[string]state.Quota{"quota4": {GPUs: &four}}
			rs := PlanElastic(s, NewPlan(s, PlanOptions{}), tc.jobs, ElasticOptions{Freeing: freeing[tc.name]})
			got, ok := resizeOf(rs, "a")
			switch {
			case tc.want == nil && ok:
				t.Fatalf("resized: %+v", got)
			case tc.want == nil:
			case !ok:
				t.Fatalf("no resize, want %+v", *tc.want)
			case got.From != tc.want.From || got.To != tc.want.To || got.For != tc.want.For || got.Deferred != tc.want.Deferred || !got.Nodes || got.Node != "n1":
				t.Fatalf("got %+v, want %+v", got, *tc.want)
			case !slices.Equal(got.Ledgers, tc.want.Ledgers):
				t.Fatalf("read ledgers %v, want %v", got.Ledgers, tc.want.Ledgers)
			case !strings.Contains(got.Why, "nodes"):
				t.Fatalf("no explanation in machines: %+v", got)
			}
		})
	}
}

// TestPlanElasticBothRanges: a pass with an elastic job of each kind
// decides each by its own unit; a waiter one serves is not served twice.
func TestPlanElasticBothRanges(t *testing.T) {
	gpuJob := holdingAt(view(gpuNode("g1", 4, "A100")), "g", "gail", 0, 4)
	nodes := []NodeView{gpuJob, partAt(twoGPUNode("n1"), "a", "alice", state.RoleHead, 2), partAt(twoGPUNode("n2"), "a", "alice", state.RoleWorker, 2)}
	s := snap(nodes, req("c", "carol", 2, time.Minute))
	jobs := map[string]ElasticJob{
		"g": {Session: "g", Min: 1, Max: 4, Ready: true},
		"a": {Session: "a", Min: 1, Max: 2, Ready: true, Nodes: true, Part: state.Resources{GPUs: 2, CPUMilli: 1000, MemoryMiB: 1024}},
	}
	rs := PlanElastic(s, NewPlan(s, PlanOptions{}), jobs, ElasticOptions{})
	if len(rs) != 1 || rs[0].For != "c" {
		t.Fatalf("resizes %+v; want one shrink for c", rs)
	}
	if r := rs[0]; r.Session == "g" && (r.Nodes || r.To != 2) || r.Session == "a" && (!r.Nodes || r.To != 1) {
		t.Fatalf("resize %+v counts in the wrong unit", r)
	}
}

// BenchmarkPlanElasticNodes is one lifecycle pass's elastic planning over
// ranges of machines at cluster scale: 1,000 nodes of 8 GPUs, 250 elastic
// jobs of 1-8 machines of 8 GPUs each on 4 (every node full), and 2,000
// fixed requests of 1 to 8 GPUs waiting (shrinks to decide).
func BenchmarkPlanElasticNodes(b *testing.B) {
	const nodes, jobsN, waiting = 1000, 250, 2000
	var views []NodeView
	jobs := map[string]ElasticJob{}
	for i := 0; i < nodes; i++ {
		id := "e" + strconv.Itoa(i/4)
		role := state.RoleWorker
		if i%4 == 0 {
			role = state.RoleHead
		}
		views = append(views, partAt(view(gpuNode("n"+strconv.Itoa(i), 8, "A100")), id, "u"+strconv.Itoa(i/4%50), role, 8))
		jobs[id] = ElasticJob{Session: id, Min: 1, Max: 8, Ready: true, Nodes: true, Part: state.Resources{GPUs: 8, CPUMilli: 1000, MemoryMiB: 1024}}
	}
	if len(jobs) != jobsN {
		b.Fatalf("%d jobs", len(jobs))
	}
	var queue []Pending
	for i := 0; i < waiting; i++ {
		queue = append(queue, req("w"+strconv.Itoa(i), "w"+strconv.Itoa(i%30), 1+i%8, time.Duration(i)*time.Second))
	}
	s := snap(views, queue...)
	plan := NewPlan(s, PlanOptions{})
	n := 0
	for b.Loop() {
		n = len(PlanElastic(s, plan, jobs, ElasticOptions{}))
	}
	b.ReportMetric(float64(n), "resizes/op")
}

// TestBoundMessageOfAMultiNodeJob: a multi-node job's bound status says
// its nodes and rank 0's, not Ray workers; a Ray gang's says its workers.
func TestBoundMessageOfAMultiNodeJob(t *testing.T) {
	parts := []PartPlan{{Node: "n1", Devices: []string{"a", "b"}}, {Node: "n2", Devices: []string{"c", "d"}}}
	job := nodesReq("j", "ada", 1, 3, 2, 0)
	ray := req("r", "ada", 2, 0)
	ray.Entry.Workers = 1
	for _, c := range []struct {
		p    Pending
		want string
	}{
		{job, "bound to 2 nodes, rank 0 on n1, each with 2 GPUs"},
		{ray, "bound to n1 with 2 GPUs and 1 Ray workers"},
	} {
		if got := boundMessage(Decision{Pending: &c.p, Parts: parts}); got != c.want {
			t.Errorf("%s: %q, want %q", c.p.Entry.Session, got, c.want)
		}
	}
}
