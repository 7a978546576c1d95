package api_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// holdGPUs writes what a placer and agent would have: a ledger on node
// giving each session one GPU in order, the sessions' specs (maxRuntime 0:
// none) and Running statuses started at started.
func (h *harness) holdGPUs(node string, started time.Time, sessions map[string]struct {
	owner      string
	gpu        int
	maxRuntime time.Duration
	activity   *state.Activity
}) {
	h.t.Helper()
	l := state.Ledger{Node: node, Allocations: map[string]state.Allocation{}}
	var ops []clientv3.Op
	enc := func(v any) string {
		b, err := state.Encode(v)
		if err != nil {
			h.t.Fatal(err)
		}
		return b
	}
	for id, s := range sessions {
		uuid := "GPU-" + node + "-" + string(rune('0'+s.gpu))
		l.Allocations[id] = state.Allocation{Kind: state.KindNotebook, Owner: s.owner, Role: state.RoleSingle, GPUs: []string{uuid}, CPUMilli: 1000, MemoryMiB: 1024}
		spec := state.Session{ID: id, Owner: s.owner, Kind: state.KindNotebook, Resources: state.Resources{GPUs: 1}, Limits: state.Limits{MaxRuntime: state.Duration(s.maxRuntime)}, Created: started}
		st := state.Status{Session: id, Phase: state.PhaseRunning, Nodes: []string{node}, Created: started, Updated: started, Started: &started, Activity: s.activity}
		ops = append(ops, clientv3.OpPut(h.keys.Session(id), enc(spec)), clientv3.OpPut(h.keys.Status(id), enc(st)))
	}
	ops = append(ops, clientv3.OpPut(h.keys.Ledger(node), enc(l)))
	if _, err := h.cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
		h.t.Fatal(err)
	}
}

// TestNodeDevices: ?devices=true lists every GPU with its holder and its
// sampled use; another user's holder is anonymous, an admin sees all.
func TestNodeDevices(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.addNode("n1", "A100", 3)
	started := time.Now().UTC().Add(-30 * time.Minute)
	h.holdGPUs("n1", started, map[string]struct {
		owner      string
		gpu        int
		maxRuntime time.Duration
		activity   *state.Activity
	}{
		"sa": {"ada", 0, 0, &state.Activity{GPUs: []state.GPUActivity{{UUID: "GPU-n1-0", UtilizationPercent: 37, MemoryUsedMiB: 2048, Unused: true, Simulated: true}}}},
		"sb": {"bob", 1, 0, nil},
	})
	devices := func(tok string) []api.GPUDevice {
		var n api.NodeList
		h.waitFor("n1 held twice", func() bool {
			n = decode[api.NodeList](t, want(t, h.do("GET", "/api/v1/nodes?devices=true", tok, nil), 200))
			return len(n.Items) == 1 && n.Items[0].GPUs.Used == 2 && n.Items[0].GPUs.Unused == 1
		})
		return n.Items[0].Devices
	}
	d := devices(h.token("ada"))
	if len(d) != 3 {
		t.Fatalf("devices %+v, want 3", d)
	}
	if g := d[0]; g.Session != "sa" || g.Owner != "ada" || !g.Sampled || g.UtilizationPercent != 37 || g.MemoryUsedMiB != 2048 || !g.Unused || !g.Simulated || g.Model != "A100" || g.MemoryMiB != 81920 {
		t.Errorf("ada's own GPU: %+v", g)
	}
	if g := d[1]; g.Session != "" || g.Owner != "(another user)" || g.Sampled {
		t.Errorf("bob's GPU as ada sees it: %+v, want anonymous", g)
	}
	if g := d[2]; g.Session != "" || g.Owner != "" || !g.Healthy {
		t.Errorf("free GPU: %+v", g)
	}
	if d := devices(h.token("root", "admin")); d[1].Session != "sb" || d[1].Owner != "bob" {
		t.Errorf("admin sees bob's GPU as %+v", d[1])
	}
	if n := decode[api.NodeList](t, want(t, h.do("GET", "/api/v1/nodes", h.token("ada"), nil), 200)); n.Items[0].Devices != nil {
		t.Errorf("devices without ?devices=true: %+v", n.Items[0].Devices)
	}
}

// TestUnhealthyGPUSaysWhy: a GPU the agent offers as unhealthy is not in
// the node's total or free, is counted as unhealthy, and both the node's
// problems and its device say the agent's problem.
func TestUnhealthyGPUSaysWhy(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	const problem = "no CDI device nvidia.com/gpu=GPU-n1-1 in /etc/cdi: run nvidia-ctk cdi generate"
	n := state.Node{Name: "n1", Address: "10.0.0.1", CPUMilli: 64000, MemoryMiB: 512 * 1024, Ports: state.PortRange{First: 40000, Last: 40999}, Registered: time.Now().UTC(), GPUs: []state.GPU{
		{Index: 0, UUID: "GPU-n1-0", Model: "H100", MemoryMiB: 81559, Healthy: true},
		{Index: 1, UUID: "GPU-n1-1", Model: "H100", MemoryMiB: 81559, Problem: problem},
	}}
	if _, err := state.Put(context.Background(), h.cli, h.keys.Node("n1"), n); err != nil {
		t.Fatal(err)
	}
	var l api.NodeList
	h.waitFor("n1 in the API's view", func() bool {
		l = decode[api.NodeList](t, want(t, h.do("GET", "/api/v1/nodes?devices=true", h.token("ada"), nil), 200))
		return len(l.Items) == 1
	})
	if g := l.Items[0].GPUs; g.Total != 1 || g.Free != 1 || g.Unhealthy != 1 {
		t.Errorf("gpus %+v, want total 1, free 1, unhealthy 1", g)
	}
	if d := l.Items[0].Devices; len(d) != 2 || d[1].Healthy || d[1].Problem != problem || d[0].Problem != "" {
		t.Errorf("devices %+v, want GPU 1 unhealthy with the agent's problem", d)
	}
	if p := l.Items[0].Problems; len(p) != 1 || p[0] != "GPU 1 GPU-n1-1: "+problem {
		t.Errorf("problems %q, want GPU 1's", p)
	}
}

// TestQueueEstimate: the caller's own waiting session gets the earliest
// moment the sessions holding enough GPUs reach their max runtimes; one
// whose GPUs are held without a max runtime cannot be estimated; others'
// entries carry none.
func TestQueueEstimate(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.addNode("n1", "A100", 2)
	started := time.Now().UTC().Add(-30 * time.Minute).Truncate(time.Second)
	type held = struct {
		owner      string
		gpu        int
		maxRuntime time.Duration
		activity   *state.Activity
	}
	h.holdGPUs("n1", started, map[string]held{"sa": {"ada", 0, 2 * time.Hour, nil}, "sb": {"bob", 1, time.Hour, nil}})
	req := notebook()
	req["resources"] = map[string]any{"gpus": 1, "cpuMilli": 1000, "memoryMiB": 1024}
	one := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.token("ada"), req), 201))
	req["resources"] = map[string]any{"gpus": 2, "cpuMilli": 1000, "memoryMiB": 1024}
	two := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.token("ada"), req), 201))

	queue := func(tok string) []api.QueueEntry {
		var items []api.QueueEntry
		h.waitFor("both waiting", func() bool {
			items = decode[api.QueueView](t, want(t, h.do("GET", "/api/v1/queue", tok, nil), 200)).Items
			return len(items) == 2
		})
		return items
	}
	byID := func(items []api.QueueEntry) map[string]api.QueueEntry {
		out := map[string]api.QueueEntry{}
		for _, e := range items {
			out[e.Session] = e
		}
		return out
	}
	// The API's status cache may see the holders' statuses a moment after
	// their ledger: until then a holder counts as not started (its limit
	// from now), so wait for the estimates that the statuses give.
	at := func(e *api.QueueEstimate, want time.Time) bool { return e != nil && e.At != nil && e.At.Equal(want) }
	h.waitFor("1 GPU: bob's session reaches its 1h max runtime; 2 GPUs: both holders end", func() bool {
		q := byID(queue(h.token("ada")))
		return at(q[one.ID].Estimate, started.Add(time.Hour)) && at(q[two.ID].Estimate, started.Add(2*time.Hour))
	})
	for _, e := range queue(h.token("bob")) {
		if e.Estimate != nil {
			t.Errorf("bob sees an estimate on ada's entry: %+v", e.Estimate)
		}
	}

	// ada's own session now has no max runtime: the 2-GPU request cannot
	// be estimated, the 1-GPU one still can (bob's ends).
	h.holdGPUs("n1", started, map[string]held{"sa": {"ada", 0, 0, nil}, "sb": {"bob", 1, time.Hour, nil}})
	h.waitFor("estimate without a max runtime", func() bool {
		q := byID(queue(h.token("ada")))
		e := q[two.ID].Estimate
		return e != nil && e.At == nil && e.Message == "cannot be estimated: the GPUs it needs are held by sessions with no max runtime" &&
			q[one.ID].Estimate != nil && q[one.ID].Estimate.At != nil
	})
}
