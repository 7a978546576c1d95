package placer

import (
	"fmt"
	"math/rand"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

func TestPlanBinpackAndSpread(t *testing.T) {
	nodes := []NodeView{
		holding(view(gpuNode("busy", 8, "A100")), "x", "bob", 6),
		view(gpuNode("idle", 8, "A100")),
	}
	for _, tc := range []struct {
		strategy Strategy
		want     string
	}{{Binpack, "busy"}, {Spread, "idle"}} {
		p := NewPlan(snap(nodes, req("s1", "ada", 2, 0)), PlanOptions{Strategy: tc.strategy})
		if len(p.Bound) != 1 || p.Bound[0].Parts[0].Node != tc.want {
			t.Fatalf("%s: plan %+v, want s1 on %s", tc.strategy, p.Bound, tc.want)
		}
		if _, ok := p.Bound[0].Parts[0].Scores[string(tc.strategy)]; !ok {
			t.Errorf("%s: binding scores %v do not name the strategy", tc.strategy, p.Bound[0].Parts[0].Scores)
		}
	}
}

func TestPlanKeepsWholeMachinesFree(t *testing.T) {
	// Binpack: four 2-GPU sessions fill one machine, leaving the other
	// whole for the 8-GPU session behind them.
	nodes := []NodeView{view(gpuNode("a", 8, "A100")), view(gpuNode("b", 8, "A100"))}
	var pending []Pending
	for i := 0; i < 4; i++ {
		pending = append(pending, req(fmt.Sprintf("small%d", i), "ada", 2, time.Duration(10-i)*time.Minute))
	}
	pending = append(pending, req("big", "bob", 8, 0))
	p := NewPlan(snap(nodes, pending...), PlanOptions{})
	if len(p.Bound) != 5 {
		t.Fatalf("bound %d sessions, want 5; waiting: %+v", len(p.Bound), p.Waiting)
	}
}

func TestPlanGangIsAllOrNothing(t *testing.T) {
	nodes := []NodeView{view(gpuNode("a", 8, "A100")), view(gpuNode("b", 8, "A100")), holding(view(gpuNode("c", 8, "A100")), "x", "bob", 4)}
	gang := req("ray", "ada", 8, 0)
	gang.Entry.Kind = state.KindNotebook
	gang.Entry.Workers = 2
	p := NewPlan(snap(nodes, gang), PlanOptions{})
	if len(p.Bound) != 0 || len(p.Waiting) != 1 {
		t.Fatalf("a gang of 3×8 GPUs on 2 free machines was bound: %+v", p.Bound)
	}
	// With a third free machine it binds, head first, each part on its own node.
	nodes[2] = view(gpuNode("c", 8, "A100"))
	p = NewPlan(snap(nodes, gang), PlanOptions{})
	if len(p.Bound) != 1 {
		t.Fatalf("gang not bound: %+v", p.Waiting)
	}
	parts := p.Bound[0].Parts
	seen := map[string]bool{}
	for i, pp := range parts {
		if seen[pp.Node] {
			t.Errorf("two parts on %s", pp.Node)
		}
		seen[pp.Node] = true
		wantRole := state.RoleWorker
		if i == 0 {
			wantRole = state.RoleHead
		}
		if pp.Role != wantRole || (i > 0 && pp.Worker != i) {
			t.Errorf("part %d: role %s worker %d", i, pp.Role, pp.Worker)
		}
	}
	if len(parts[0].Ports) != 4 || len(parts[1].Ports) != 2 {
		t.Errorf("ports: head %v (want jupyter+3 ray), worker %v (want 2)", parts[0].Ports, parts[1].Ports)
	}
}

func TestPlanReasons(t *testing.T) {
	nodes := []NodeView{holding(view(gpuNode("a", 8, "NVIDIA A100-SXM4-80GB")), "x", "bob", 4)}
	cordoned := view(gpuNode("c", 8, "NVIDIA A100-SXM4-80GB"))
	cordoned.Cordon = &state.Cordon{Node: "c"}
	big := req("big", "ada", 8, 0)
	big.Entry.Request.GPUModel = "*A100*"
	h100 := req("h100", "ada", 1, 0)
	h100.Entry.Request.GPUModel = "*H100*"
	huge := req("huge", "ada", 16, 0)
	for _, tc := range []struct {
		name    string
		nodes   []NodeView
		p       Pending
		reason  string
		message string
	}{
		{"capacity", nodes, big, "Capacity", "waiting for 8×A100: the best node has 4 free"},
		{"no such model", nodes, h100, "Unsatisfiable", "no node can ever hold 1×H100: the largest node has 0 matching GPUs"},
		{"too large", nodes, huge, "Unsatisfiable", "no node can ever hold 16×GPU"},
		{"cordoned", []NodeView{cordoned}, req("s", "ada", 1, 0), "Cordoned", "every node that could hold it is cordoned"},
		{"no nodes", nil, req("s", "ada", 1, 0), "Capacity", "no nodes are registered"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := NewPlan(snap(tc.nodes, tc.p), PlanOptions{})
			if len(p.Waiting) != 1 {
				t.Fatalf("waiting = %+v", p.Waiting)
			}
			w := p.Waiting[0]
			if w.Reason != tc.reason || !strings.Contains(w.Message, tc.message) {
				t.Errorf("got %s %q, want %s %q", w.Reason, w.Message, tc.reason, tc.message)
			}
		})
	}
}

func TestPlanQuota(t *testing.T) {
	gpus := int64(4)
	s := snap([]NodeView{holding(view(gpuNode("a", 8, "A100")), "held", "ada", 3)}, req("s1", "ada", 2, 0), req("s2", "bob", 2, 0))
	s.UserQuotas = map[string]state.Quota{"ada": {GPUs: &gpus}}
	p := NewPlan(s, PlanOptions{})
	if len(p.Bound) != 1 || p.Bound[0].Pending.Entry.Owner != "bob" {
		t.Fatalf("bound %+v, want only bob's", p.Bound)
	}
	w := p.Waiting[0]
	if w.Reason != "Quota" || !strings.Contains(w.Message, "3 GPUs held of 4 allowed; this needs 2 more") {
		t.Errorf("quota reason = %s %q", w.Reason, w.Message)
	}
	// Group quotas count every member's allocations.
	s = snap([]NodeView{view(gpuNode("a", 8, "A100"))}, req("s1", "ada", 2, 2*time.Minute), req("s2", "bob", 2, time.Minute))
	for i := range s.Pending {
		s.Pending[i].Entry.Groups = []string{"vision"}
	}
	two := int64(2)
	s.GroupQuotas = map[string]state.Quota{"vision": {GPUs: &two}}
	p = NewPlan(s, PlanOptions{})
	if len(p.Bound) != 1 || p.Waiting[0].Reason != "Quota" || !strings.Contains(p.Waiting[0].Message, "group vision") {
		t.Errorf("group quota: bound %d, waiting %+v", len(p.Bound), p.Waiting)
	}
}

func TestPlanOrder(t *testing.T) {
	one := []NodeView{view(gpuNode("a", 1, "A100"))}
	// Priority beats age.
	old := req("old", "ada", 1, time.Hour)
	urgent := req("urgent", "bob", 1, 0)
	urgent.Entry.Priority = 5
	if p := NewPlan(snap(one, old, urgent), PlanOptions{}); p.Bound[0].Pending.Entry.Session != "urgent" {
		t.Errorf("priority: bound %s", p.Bound[0].Pending.Entry.Session)
	}
	// Fair share beats age: ada holds a GPU already, bob holds none.
	nodes := []NodeView{holding(view(gpuNode("a", 2, "A100")), "x", "ada", 1)}
	p := NewPlan(snap(nodes, req("ada2", "ada", 1, time.Hour), req("bob1", "bob", 1, 0)), PlanOptions{})
	if p.Bound[0].Pending.Entry.Session != "bob1" {
		t.Errorf("fair share: bound %s, want bob1", p.Bound[0].Pending.Entry.Session)
	}
	if p.Waiting[0].Position != 1 || !strings.Contains(p.Waiting[0].Message, "best node has 0 free") {
		t.Errorf("waiting = %+v", p.Waiting[0])
	}
	// Age breaks ties between equal shares.
	p = NewPlan(snap(one, req("young", "ada", 1, 0), req("elder", "bob", 1, time.Minute)), PlanOptions{})
	if p.Bound[0].Pending.Entry.Session != "elder" {
		t.Errorf("age: bound %s", p.Bound[0].Pending.Entry.Session)
	}
}

func TestPlanDRFInterleavesOwners(t *testing.T) {
	// Two owners with 8 requests each, 8 GPUs: each gets 4.
	nodes := []NodeView{view(gpuNode("a", 8, "A100"))}
	var pending []Pending
	for i := 0; i < 8; i++ {
		pending = append(pending, req(fmt.Sprintf("ada%d", i), "ada", 1, time.Duration(100-i)*time.Second))
		pending = append(pending, req(fmt.Sprintf("bob%d", i), "bob", 1, time.Duration(50-i)*time.Second))
	}
	p := NewPlan(snap(nodes, pending...), PlanOptions{})
	got := map[string]int{}
	for _, d := range p.Bound {
		got[d.Pending.Entry.Owner]++
	}
	if got["ada"] != 4 || got["bob"] != 4 {
		t.Errorf("shares = %v, want 4 each", got)
	}
}

func TestPlanBackfillAndReservation(t *testing.T) {
	// One node with 4 of 8 GPUs held. An 8-GPU request waits; a 1-GPU request
	// behind it backfills while the big one is young (under ReserveAfter/8:
	// size-aware aging)...
	nodes := []NodeView{holding(view(gpuNode("a", 8, "A100")), "x", "carol", 4)}
	big := req("big", "ada", 8, 5*time.Minute)
	small := req("small", "bob", 1, 0)
	p := NewPlan(snap(nodes, big, small), PlanOptions{ReserveAfter: time.Hour})
	if len(p.Bound) != 1 || p.Bound[0].Pending.Entry.Session != "small" {
		t.Fatalf("young big request: want small to backfill, got %+v", p.Bound)
	}
	// ...but once the big one has waited past ReserveAfter it holds the
	// node, and the small one waits behind it with a reason.
	p = NewPlan(snap(nodes, big, small), PlanOptions{ReserveAfter: 5 * time.Minute})
	if len(p.Bound) != 0 {
		t.Fatalf("aged big request did not hold the node: bound %+v", p.Bound)
	}
	if p.Reserved["a"] != "big" {
		t.Errorf("reserved = %v", p.Reserved)
	}
	if w := p.Waiting[1]; w.Pending.Entry.Session != "small" || !strings.Contains(w.Message, "held for another waiting request") {
		t.Errorf("small waits with %+v", w)
	}
}

func TestPlanIsDeterministic(t *testing.T) {
	rng := rand.New(rand.NewSource(7))
	s := randomSnapshot(rng, 40, 300)
	a := NewPlan(s, PlanOptions{ReserveAfter: 30 * time.Minute})
	b := NewPlan(s, PlanOptions{ReserveAfter: 30 * time.Minute})
	if !reflect.DeepEqual(a, b) {
		t.Fatal("two plans of one snapshot differ")
	}
}

// randomSnapshot builds a random but consistent cluster and queue.
func randomSnapshot(rng *rand.Rand, nodes, pending int) *Snapshot {
	models := []string{"NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L4"}
	s := &Snapshot{Now: t0, UserQuotas: map[string]state.Quota{}, GroupQuotas: map[string]state.Quota{}}
	for i := 0; i < nodes; i++ {
		n := gpuNode(fmt.Sprintf("n%03d", i), []int{0, 1, 2, 4, 8, 8, 8}[rng.Intn(7)], models[rng.Intn(len(models))])
		n.CPUMilli = int64(16000 + rng.Intn(4)*16000)
		n.MemoryMiB = int64(65536 * (1 + rng.Intn(4)))
		if rng.Intn(5) == 0 {
			n.Labels = map[string]string{"zone": "b"}
		}
		if len(n.GPUs) > 0 && rng.Intn(6) == 0 {
			n.GPUs[0].MIGEnabled = true
			n.GPUs[0].MIGDevices = []state.MIGDevice{{UUID: n.GPUs[0].UUID + "-mig0", Profile: "1g.10gb", MemoryMiB: 9856}, {UUID: n.GPUs[0].UUID + "-mig1", Profile: "1g.10gb", MemoryMiB: 9856}}
		}
		if len(n.GPUs) > 1 && rng.Intn(10) == 0 {
			n.GPUs[1].Healthy = false
		}
		v := view(n)
		v.LedgerRevision = int64(rng.Intn(100))
		// Existing allocations: take a random prefix of healthy whole GPUs.
		held := 0
		if len(n.GPUs) > 0 {
			held = rng.Intn(len(n.GPUs) + 1)
		}
		var devs []string
		for _, g := range n.GPUs[:held] {
			if g.Healthy && !g.MIGEnabled {
				devs = append(devs, g.UUID)
			}
		}
		if len(devs) > 0 {
			v.Ledger.Allocations["old"+n.Name] = state.Allocation{Owner: "zed", Role: state.RoleSingle, GPUs: devs, CPUMilli: 2000, MemoryMiB: 4096, Ports: []int{40000}}
		}
		if rng.Intn(15) == 0 {
			v.Cordon = &state.Cordon{Node: n.Name}
		}
		s.Nodes = append(s.Nodes, v)
	}
	owners := []string{"ada", "bob", "cy", "dee"}
	for i := 0; i < pending; i++ {
		p := req(fmt.Sprintf("s%04d", i), owners[rng.Intn(len(owners))], []int{0, 1, 1, 2, 4, 8}[rng.Intn(6)], time.Duration(rng.Intn(3600))*time.Second)
		p.Revision = int64(1000 + i)
		p.Entry.Priority = rng.Intn(3)
		p.Entry.Request.CPUMilli = int64(500 * (1 + rng.Intn(16)))
		p.Entry.Request.MemoryMiB = int64(1024 * (1 + rng.Intn(64)))
		switch rng.Intn(12) {
		case 0:
			p.Entry.Request.GPUModel = "*H100*"
		case 1:
			p.Entry.Request.MIGProfile = "1g.10gb"
			p.Entry.Request.GPUs = 1
		case 2:
			p.Entry.Request.NodeSelector = map[string]string{"zone": "b"}
		case 3:
			p.Entry.Kind = state.KindNotebook
			p.Entry.Workers = 1 + rng.Intn(2)
		}
		s.Pending = append(s.Pending, p)
	}
	three := int64(3)
	s.UserQuotas["dee"] = state.Quota{GPUs: &three}
	return s
}

// TestPlanProperties checks the invariants over random clusters and queues:
// never two sessions on one device, never a node over its CPU or memory or
// port range, every bound part fits its request, gangs on distinct nodes, no
// placement on a cordoned node, and (without reservations) no waiting
// single-node session that some node could still take.
func TestPlanProperties(t *testing.T) {
	rounds := 300
	if testing.Short() {
		rounds = 40
	}
	for seed := int64(0); seed < int64(rounds); seed++ {
		rng := rand.New(rand.NewSource(seed))
		s := randomSnapshot(rng, 1+rng.Intn(30), rng.Intn(200))
		opt := PlanOptions{Strategy: []Strategy{Binpack, Spread}[rng.Intn(2)]}
		p := NewPlan(s, opt)
		if err := checkPlan(s, p); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		if len(p.Bound)+len(p.Waiting) != len(s.Pending) {
			t.Fatalf("seed %d: %d bound + %d waiting != %d pending", seed, len(p.Bound), len(p.Waiting), len(s.Pending))
		}
	}
}

func checkPlan(s *Snapshot, p *Plan) error {
	nodes := map[string]*NodeView{}
	for i := range s.Nodes {
		nodes[s.Nodes[i].Node.Name] = &s.Nodes[i]
	}
	owner := map[string]string{}
	cpu := map[string]int64{}
	mem := map[string]int64{}
	ports := map[string]map[int]bool{}
	for name, v := range nodes {
		c, m := v.Ledger.Used()
		cpu[name], mem[name] = c, m
		ports[name] = map[int]bool{}
		for id, a := range v.Ledger.Allocations {
			for _, g := range a.GPUs {
				owner[g] = id
			}
			for _, pt := range a.Ports {
				ports[name][pt] = true
			}
		}
	}
	for _, d := range p.Bound {
		e := d.Pending.Entry
		reqs := e.Parts()
		if len(d.Parts) != len(reqs) {
			return fmt.Errorf("%s: %d parts for %d requests", e.Session, len(d.Parts), len(reqs))
		}
		used := map[string]bool{}
		for i, pp := range d.Parts {
			v := nodes[pp.Node]
			r := reqs[i]
			if used[pp.Node] {
				return fmt.Errorf("%s: two parts on %s", e.Session, pp.Node)
			}
			used[pp.Node] = true
			if v.Cordon != nil {
				return fmt.Errorf("%s placed on cordoned %s", e.Session, pp.Node)
			}
			if len(pp.Devices) != r.GPUs {
				return fmt.Errorf("%s: %d devices for %d GPUs", e.Session, len(pp.Devices), r.GPUs)
			}
			for _, u := range pp.Devices {
				if prev, taken := owner[u]; taken {
					return fmt.Errorf("device %s given to %s and %s", u, prev, e.Session)
				}
				owner[u] = e.Session
				if !nodeDeviceMatches(v, u, &r) {
					return fmt.Errorf("%s: device %s on %s does not match %+v", e.Session, u, pp.Node, r)
				}
			}
			for k, want := range r.NodeSelector {
				if v.Node.Labels[k] != want {
					return fmt.Errorf("%s on %s without label %s", e.Session, pp.Node, k)
				}
			}
			cpu[pp.Node] += pp.CPUMilli
			mem[pp.Node] += pp.MemoryMiB
			if cpu[pp.Node] > v.Node.CPUMilli || mem[pp.Node] > v.Node.MemoryMiB {
				return fmt.Errorf("node %s over CPU or memory", pp.Node)
			}
			if len(pp.Ports) != e.Ports(pp.Role) {
				return fmt.Errorf("%s: %d ports for role %s", e.Session, len(pp.Ports), pp.Role)
			}
			for _, pt := range pp.Ports {
				if ports[pp.Node][pt] || pt < v.Node.Ports.First || pt > v.Node.Ports.Last {
					return fmt.Errorf("port %d on %s reused or out of range", pt, pp.Node)
				}
				ports[pp.Node][pt] = true
			}
		}
	}
	// Work conservation: rebuild the nodes after the plan and check that no
	// waiting single-node, non-quota session fits anywhere.
	after := map[string]*nodeState{}
	for name, v := range nodes {
		vv := *v
		vv.Ledger = state.Ledger{Node: name, Allocations: map[string]state.Allocation{}}
		for id, a := range v.Ledger.Allocations {
			vv.Ledger.Allocations[id] = a
		}
		for _, d := range p.Bound {
			for _, pp := range d.Parts {
				if pp.Node == name {
					vv.Ledger.Allocations[d.Pending.Entry.Session] = state.Allocation{GPUs: pp.Devices, CPUMilli: pp.CPUMilli, MemoryMiB: pp.MemoryMiB, Ports: pp.Ports}
				}
			}
		}
		after[name] = newNodeState(&vv)
	}
	for _, w := range p.Waiting {
		e := w.Pending.Entry
		if w.Reason == "Quota" || e.Workers > 0 || len(p.Reserved) > 0 {
			continue
		}
		pt := &part{req: &e.Request, role: state.RoleSingle, ports: e.Ports(state.RoleSingle), id: e.Session}
		for name, n := range after {
			if feasible(pt, n) == nil {
				return fmt.Errorf("%s waits (%s: %s) but fits on %s", e.Session, w.Reason, w.Message, name)
			}
		}
	}
	return nil
}

func nodeDeviceMatches(v *NodeView, uuid string, r *state.Resources) bool {
	for _, g := range v.Node.GPUs {
		devs := []device{{uuid: g.UUID, model: g.Model, memoryMiB: g.MemoryMiB, healthy: g.Healthy}}
		if g.MIGEnabled {
			devs = nil
			for _, m := range g.MIGDevices {
				devs = append(devs, device{uuid: m.UUID, model: g.Model, memoryMiB: m.MemoryMiB, mig: m.Profile, healthy: g.Healthy})
			}
		}
		for i := range devs {
			if devs[i].uuid == uuid {
				return deviceMatches(&devs[i], r)
			}
		}
	}
	return false
}

// TestPlanMultiNodeJob: a multi-node job is a gang like a Ray session's
// (all or nothing, each part on its own node, rank 0 the head), whose
// parts take the job's ports: MASTER_PORT and the peer ports for rank 0,
// the peer ports for the others.
func TestPlanMultiNodeJob(t *testing.T) {
	s := state.Session{ID: "mn-job", Owner: "ada", Kind: state.KindBatch, Nodes: 3, Created: t0,
		Resources: state.Resources{GPUs: 8, CPUMilli: 1000, MemoryMiB: 1024}}
	e := state.NewQueueEntry(s, t0)
	job := Pending{Revision: 1, Entry: &e}
	nodes := []NodeView{view(gpuNode("a", 8, "A100")), view(gpuNode("b", 8, "A100")), holding(view(gpuNode("c", 8, "A100")), "x", "bob", 1)}
	if p := NewPlan(snap(nodes, job), PlanOptions{}); len(p.Bound) != 0 {
		t.Fatalf("a 3-machine job was bound on 2 free machines: %+v", p.Bound)
	}
	nodes[2] = view(gpuNode("c", 8, "A100"))
	p := NewPlan(snap(nodes, job), PlanOptions{})
	if len(p.Bound) != 1 {
		t.Fatalf("job not bound: %+v", p.Waiting)
	}
	seen := map[string]bool{}
	for i, pp := range p.Bound[0].Parts {
		wantRole, wantPorts := state.RoleWorker, state.JobPeerPorts
		if i == 0 {
			wantRole, wantPorts = state.RoleHead, 1+state.JobPeerPorts
		}
		if pp.Role != wantRole || (i > 0 && pp.Worker != i) || len(pp.Ports) != wantPorts || len(pp.Devices) != 8 || seen[pp.Node] {
			t.Errorf("rank %d: node %s role %s worker %d, %d ports, %d GPUs; want its own node, %s, %d ports, 8 GPUs",
				i, pp.Node, pp.Role, pp.Worker, len(pp.Ports), len(pp.Devices), wantRole, wantPorts)
		}
		seen[pp.Node] = true
	}
}

// TestPlanCacheChangesNoPlan: planning with a PlanCache gives the plan
// planning without one gives, with the cache cold, warm, and after the
// first plan's binds changed some ledgers (at new revisions) and not
// others.
func TestPlanCacheChangesNoPlan(t *testing.T) {
	rounds := 150
	if testing.Short() {
		rounds = 30
	}
	same := func(seed int64, what string, want, got *Plan) {
		t.Helper()
		if !reflect.DeepEqual(want.Bound, got.Bound) || !reflect.DeepEqual(want.Waiting, got.Waiting) || !reflect.DeepEqual(want.Reserved, got.Reserved) {
			t.Fatalf("seed %d, %s: the plan with a cache differs: %d bound, %d waiting; without: %d bound, %d waiting",
				seed, what, len(got.Bound), len(got.Waiting), len(want.Bound), len(want.Waiting))
		}
	}
	for seed := int64(0); seed < int64(rounds); seed++ {
		rng := rand.New(rand.NewSource(seed))
		s := randomSnapshot(rng, 1+rng.Intn(30), rng.Intn(200))
		for i := range s.Nodes {
			// As from etcd: a revision names one content.
			s.Nodes[i].NodeRevision, s.Nodes[i].LedgerRevision = int64(i+1), int64(1000+i)
		}
		opt := PlanOptions{Strategy: []Strategy{Binpack, Spread}[rng.Intn(2)]}
		want := NewPlan(s, opt)
		cache := NewPlanCache()
		for _, what := range []string{"cold", "warm"} {
			c := *s
			c.Cache = cache
			same(seed, what, want, NewPlan(&c, opt))
		}
		next := filledSnapshot(s, want)
		wantNext := NewPlan(next, opt)
		next.Cache = cache
		same(seed, "after binds", wantNext, NewPlan(next, opt))
	}
}
