package history_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// put is one key's value in a history step; nil deletes the key.
type put struct {
	key string
	v   any
}

// write commits one step (one transaction, one revision) and returns its revision.
func write(t *testing.T, cli *clientv3.Client, ps ...put) int64 {
	t.Helper()
	ops := make([]clientv3.Op, 0, len(ps))
	for _, p := range ps {
		if p.v == nil {
			ops = append(ops, clientv3.OpDelete(p.key))
			continue
		}
		v, err := state.Encode(p.v)
		if err != nil {
			t.Fatal(err)
		}
		ops = append(ops, clientv3.OpPut(p.key, v))
	}
	r, err := cli.Txn(context.Background()).Then(ops...).Commit()
	if err != nil {
		t.Fatal(err)
	}
	return r.Header.Revision
}

func node(name string) state.Node {
	return state.Node{Name: name, CPUMilli: 4000, MemoryMiB: 8192, Ports: state.PortRange{First: 40000, Last: 40009},
		GPUs: []state.GPU{{UUID: "GPU-" + name + "-0"}, {UUID: "GPU-" + name + "-1"}}}
}

func alloc(cpu int64, ports []int, gpus ...string) state.Allocation {
	return state.Allocation{Owner: "ada", Role: state.RoleSingle, GPUs: gpus, CPUMilli: cpu, MemoryMiB: 1024, Ports: ports}
}

// bnd is the binding of session id that allocation a is the ledger's side of.
func bnd(id string, a state.Allocation) state.Binding {
	return state.Binding{Session: id, GPUs: a.GPUs, Ports: a.Ports}
}

// sharedNode is node(name) with 80 GiB GPUs, GPU 0 shared.
func sharedNode(name string) state.Node {
	n := node(name)
	for i := range n.GPUs {
		n.GPUs[i].MemoryMiB = 81920
	}
	n.GPUs[0].Shared = true
	return n
}

// frac is owner's fraction of mib MiB of an 80 GiB GPU.
func frac(owner string, mib int64, gpu string) state.Allocation {
	a := alloc(1, nil, gpu)
	a.Owner = owner
	a.Share = &state.GPUShare{MemoryMiB: mib, GPUMemoryMiB: 81920}
	return a
}

func ledger(name string, as map[string]state.Allocation) state.Ledger {
	return state.Ledger{Node: name, Allocations: as}
}

func status(id string, p state.Phase) state.Status { return state.Status{Session: id, Phase: p} }

// TestCheckerFindsEachBrokenRule writes histories into a real etcd, each
// made to break one rule at one revision, and checks that Watch reports
// that rule at that revision and key, and nothing else.
func TestCheckerFindsEachBrokenRule(t *testing.T) {
	cli := etcdtest.New(t)
	for i, tc := range []struct {
		name string
		// steps writes the history and returns the breaking revision.
		steps func(t *testing.T, k state.Keys) int64
		rule  string
		key   func(k state.Keys) string
		// stuck is the bound of the time-bound rules; 0: the default.
		stuck time.Duration
	}{
		{"one GPU in two allocations on two nodes", func(t *testing.T, k state.Keys) int64 {
			// Two nodes that report one GPU UUID (a misconfigured inventory).
			n2 := node("n2")
			n2.GPUs[0].UUID = "GPU-n1-0"
			write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Node("n2"), n2})
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(100, nil, "GPU-n1-0")})}, put{k.Binding("n1", "s1"), bnd("s1", alloc(100, nil, "GPU-n1-0"))})
			return write(t, cli, put{k.Ledger("n2"), ledger("n2", map[string]state.Allocation{"s2": alloc(100, nil, "GPU-n1-0")})}, put{k.Binding("n2", "s2"), bnd("s2", alloc(100, nil, "GPU-n1-0"))})
		}, history.RuleGPUShared, func(k state.Keys) string { return k.Ledger("n2") }, 0},
		{"one GPU twice in one ledger", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(100, nil, "GPU-n1-0")})}, put{k.Binding("n1", "s1"), bnd("s1", alloc(100, nil, "GPU-n1-0"))})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(100, nil, "GPU-n1-0"), "s2": alloc(100, nil, "GPU-n1-1", "GPU-n1-0")})}, put{k.Binding("n1", "s2"), bnd("s2", alloc(100, nil, "GPU-n1-1", "GPU-n1-0"))})
		}, history.RuleGPUShared, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"a GPU held whole and one of its MIG devices after the node registered again split", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(100, nil, "GPU-n1-0")})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1", GPUs: []string{"GPU-n1-0"}}})
			split := node("n1")
			split.GPUs[0].MIGEnabled = true
			split.GPUs[0].MIGDevices = []state.MIGDevice{{UUID: "MIG-n1-0a", Profile: "1g.10gb"}, {UUID: "MIG-n1-0b", Profile: "1g.10gb"}}
			write(t, cli, put{k.Node("n1"), split})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(100, nil, "GPU-n1-0"), "s2": alloc(100, nil, "MIG-n1-0a")})}, put{k.Binding("n1", "s2"), state.Binding{Session: "s2", GPUs: []string{"MIG-n1-0a"}}})
		}, history.RuleGPUShared, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"a MIG device's GPU held whole after the node registered again unsplit", func(t *testing.T, k state.Keys) int64 {
			split := node("n1")
			split.GPUs[0].MIGEnabled = true
			split.GPUs[0].MIGDevices = []state.MIGDevice{{UUID: "MIG-n1-0a", Profile: "1g.10gb"}, {UUID: "MIG-n1-0b", Profile: "1g.10gb"}}
			write(t, cli, put{k.Node("n1"), split})
			part := alloc(100, nil, "MIG-n1-0a")
			part.Parents = map[string]string{"MIG-n1-0a": "GPU-n1-0"}
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": part})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1", GPUs: []string{"MIG-n1-0a"}}})
			write(t, cli, put{k.Node("n1"), node("n1")})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": part, "s2": alloc(100, nil, "GPU-n1-0")})}, put{k.Binding("n1", "s2"), state.Binding{Session: "s2", GPUs: []string{"GPU-n1-0"}}})
		}, history.RuleGPUShared, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"a binding that names other devices than its allocation", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(100, []int{40001}, "GPU-n1-0")})},
				put{k.Binding("n1", "s1"), bnd("s1", alloc(100, []int{40001}, "GPU-n1-1"))})
		}, history.RuleBindingDiffers, func(k state.Keys) string { return k.Binding("n1", "s1") }, 0},
		{"a binding that names other ports than its allocation", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(100, []int{40001}, "GPU-n1-0")})},
				put{k.Binding("n1", "s1"), bnd("s1", alloc(100, []int{40002}, "GPU-n1-0"))})
		}, history.RuleBindingDiffers, func(k state.Keys) string { return k.Binding("n1", "s1") }, 0},
		{"an allocated GPU gone from the node's inventory", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(100, nil, "GPU-n1-0")})}, put{k.Binding("n1", "s1"), bnd("s1", alloc(100, nil, "GPU-n1-0"))})
			fewer := node("n1")
			fewer.GPUs = fewer.GPUs[1:]
			return write(t, cli, put{k.Node("n1"), fewer})
		}, history.RuleDeviceUnknown, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"a re-queued multi-node session that kept a part", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Node("n2"), node("n2")},
				put{k.Status("s1"), status("s1", state.PhasePending)}, put{k.Pending("s1"), state.QueueEntry{Session: "s1"}})
			a1, a2 := alloc(100, nil, "GPU-n1-0"), alloc(100, nil, "GPU-n2-0")
			write(t, cli, put{k.Pending("s1"), nil}, put{k.Status("s1"), status("s1", state.PhaseBound)},
				put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": a1})}, put{k.Binding("n1", "s1"), bnd("s1", a1)},
				put{k.Ledger("n2"), ledger("n2", map[string]state.Allocation{"s1": a2})}, put{k.Binding("n2", "s1"), bnd("s1", a2)})
			// n1 is lost; the re-queue frees n1's part and forgets n2's.
			return write(t, cli, put{k.Ledger("n1"), nil}, put{k.Binding("n1", "s1"), nil},
				put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhasePending, Reason: "NodeLost", Attempt: 1}}, put{k.Pending("s1"), state.QueueEntry{Session: "s1", Attempt: 1}})
		}, history.RuleLeftBehind, func(k state.Keys) string { return k.Status("s1") }, 0},
		{"a session that ended keeps its binding past the bound", func(t *testing.T, k state.Keys) int64 {
			t0 := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
			a := alloc(100, nil, "GPU-n1-0")
			write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhasePending, Updated: t0}})
			write(t, cli, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseBound, Updated: t0}},
				put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": a})}, put{k.Binding("n1", "s1"), bnd("s1", a)})
			write(t, cli, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseSucceeded, Updated: t0.Add(time.Second)}})
			// Within the bound: an agent may still be stopping a part.
			write(t, cli, put{k.Status("s2"), state.Status{Session: "s2", Phase: state.PhasePending, Updated: t0.Add(50 * time.Second)}})
			return write(t, cli, put{k.Status("s2"), state.Status{Session: "s2", Phase: state.PhasePending, Updated: t0.Add(2 * time.Minute)}})
		}, history.RuleLeftBehind, func(k state.Keys) string { return k.Status("s1") }, time.Minute},
		{"a session Starting past the bound", func(t *testing.T, k state.Keys) int64 {
			t0 := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
			a := alloc(100, nil, "GPU-n1-0")
			write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhasePending, Updated: t0}})
			write(t, cli, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseBound, Updated: t0}},
				put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": a})}, put{k.Binding("n1", "s1"), bnd("s1", a)})
			write(t, cli, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseStarting, Message: "pulling", Updated: t0.Add(time.Second)}})
			// Messages within one phase are no progress.
			write(t, cli, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseStarting, Message: "pulling, 1 GiB", Updated: t0.Add(50 * time.Second)}})
			return write(t, cli, put{k.Status("s2"), state.Status{Session: "s2", Phase: state.PhasePending, Updated: t0.Add(2 * time.Minute)}})
		}, history.RuleStuck, func(k state.Keys) string { return k.Status("s1") }, time.Minute},
		{"a session left Running after its parts were released", func(t *testing.T, k state.Keys) int64 {
			t0 := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
			a := alloc(100, nil, "GPU-n1-0")
			write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhasePending, Updated: t0}})
			write(t, cli, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseBound, Updated: t0}},
				put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": a})}, put{k.Binding("n1", "s1"), bnd("s1", a)})
			write(t, cli, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseRunning, Updated: t0.Add(time.Second)}})
			// Running for long with its GPU is progress enough.
			write(t, cli, put{k.Status("s2"), state.Status{Session: "s2", Phase: state.PhasePending, Updated: t0.Add(5 * time.Minute)}})
			// The agent releases it (fenced, say), and its status is never ended.
			write(t, cli, put{k.Ledger("n1"), nil}, put{k.Binding("n1", "s1"), nil})
			write(t, cli, put{k.Status("s2"), state.Status{Session: "s2", Phase: state.PhasePending, Updated: t0.Add(5*time.Minute + 50*time.Second)}})
			return write(t, cli, put{k.Status("s2"), state.Status{Session: "s2", Phase: state.PhasePending, Updated: t0.Add(7 * time.Minute)}})
		}, history.RuleStuck, func(k state.Keys) string { return k.Status("s1") }, time.Minute},
		{"a container reported running after its binding went", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			a := alloc(1, nil)
			b := write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": a})}, put{k.Binding("n1", "s1"), bnd("s1", a)})
			write(t, cli, put{k.Part("n1", "s1"), state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseRunning, BindingRevision: b}})
			// Freed without the agent's release (which reports the end).
			return write(t, cli, put{k.Ledger("n1"), nil}, put{k.Binding("n1", "s1"), nil})
		}, history.RuleContainerUnbound, func(k state.Keys) string { return k.Part("n1", "s1") }, 0},
		{"a value that is not the JSON its key holds", func(t *testing.T, k state.Keys) int64 {
			return write(t, cli, put{k.Node("n1"), "not a node"})
		}, history.RuleUndecodable, func(k state.Keys) string { return k.Node("n1") }, 0},
		{"fractions of a shared GPU over its memory", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), sharedNode("n1")})
			two := map[string]state.Allocation{"s1": frac("ada", 40960, "GPU-n1-0"), "s2": frac("ada", 40960, "GPU-n1-0")}
			write(t, cli, put{k.Ledger("n1"), ledger("n1", two)}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1", GPUs: []string{"GPU-n1-0"}}}, put{k.Binding("n1", "s2"), state.Binding{Session: "s2", GPUs: []string{"GPU-n1-0"}}})
			two["s3"] = frac("ada", 1, "GPU-n1-0")
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", two)}, put{k.Binding("n1", "s3"), state.Binding{Session: "s3", GPUs: []string{"GPU-n1-0"}}})
		}, history.RuleGPUOverShared, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"a GPU held whole beside a fraction of it", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), sharedNode("n1")})
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": frac("ada", 1024, "GPU-n1-0")})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1", GPUs: []string{"GPU-n1-0"}}})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": frac("ada", 1024, "GPU-n1-0"), "s2": alloc(100, nil, "GPU-n1-0")})}, put{k.Binding("n1", "s2"), state.Binding{Session: "s2", GPUs: []string{"GPU-n1-0"}}})
		}, history.RuleGPUShared, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"a MIG device beside a fraction of its GPU after the node registered again split", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), sharedNode("n1")})
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": frac("ada", 1024, "GPU-n1-0")})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1", GPUs: []string{"GPU-n1-0"}}})
			split := sharedNode("n1")
			split.GPUs[0].Shared = false
			split.GPUs[0].MIGEnabled = true
			split.GPUs[0].MIGDevices = []state.MIGDevice{{UUID: "MIG-n1-0a", Profile: "1g.10gb"}}
			write(t, cli, put{k.Node("n1"), split})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": frac("ada", 1024, "GPU-n1-0"), "s2": alloc(100, nil, "MIG-n1-0a")})}, put{k.Binding("n1", "s2"), state.Binding{Session: "s2", GPUs: []string{"MIG-n1-0a"}}})
		}, history.RuleGPUShared, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"fractions of two owners on one shared GPU", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), sharedNode("n1")})
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": frac("ada", 1024, "GPU-n1-0")})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1", GPUs: []string{"GPU-n1-0"}}})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": frac("ada", 1024, "GPU-n1-0"), "s2": frac("bob", 1024, "GPU-n1-0")})}, put{k.Binding("n1", "s2"), state.Binding{Session: "s2", GPUs: []string{"GPU-n1-0"}}})
		}, history.RuleSharedOwners, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"node over its CPU", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(3000, nil), "s2": alloc(1001, nil)})},
				put{k.Binding("n1", "s1"), state.Binding{}}, put{k.Binding("n1", "s2"), state.Binding{}})
		}, history.RuleNodeOver, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"node over its memory", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			a := alloc(1, nil)
			a.MemoryMiB = 8193
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": a})}, put{k.Binding("n1", "s1"), state.Binding{}})
		}, history.RuleNodeOver, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"one port twice", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, []int{40001})})}, put{k.Binding("n1", "s1"), bnd("s1", alloc(1, []int{40001}))})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, []int{40001}), "s2": alloc(1, []int{40002, 40001})})}, put{k.Binding("n1", "s2"), bnd("s2", alloc(1, []int{40002, 40001}))})
		}, history.RuleNodeOver, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"a port outside the node's range", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, []int{40010})})}, put{k.Binding("n1", "s1"), bnd("s1", alloc(1, []int{40010}))})
		}, history.RuleNodeOver, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"a binding without an allocation", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			return write(t, cli, put{k.Binding("n1", "s1"), state.Binding{Session: "s1"}})
		}, history.RuleBindingNoAlloc, func(k state.Keys) string { return k.Binding("n1", "s1") }, 0},
		{"an allocation released without its binding", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, nil)})}, put{k.Binding("n1", "s1"), state.Binding{}})
			return write(t, cli, put{k.Ledger("n1"), nil})
		}, history.RuleBindingNoAlloc, func(k state.Keys) string { return k.Binding("n1", "s1") }, 0},
		{"an allocation without a binding", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, nil)})})
		}, history.RuleAllocNoBinding, func(k state.Keys) string { return k.Ledger("n1") }, 0},
		{"Stopping back to Running", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Status("s1"), status("s1", state.PhasePending)})
			write(t, cli, put{k.Status("s1"), status("s1", state.PhaseBound)})
			write(t, cli, put{k.Status("s1"), status("s1", state.PhaseStopping)})
			return write(t, cli, put{k.Status("s1"), status("s1", state.PhaseRunning)})
		}, history.RulePhaseEdge, func(k state.Keys) string { return k.Status("s1") }, 0},
		{"Pending straight to Running", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Status("s1"), status("s1", state.PhasePending)})
			return write(t, cli, put{k.Status("s1"), status("s1", state.PhaseRunning)})
		}, history.RulePhaseEdge, func(k state.Keys) string { return k.Status("s1") }, 0},
		{"a session born Running", func(t *testing.T, k state.Keys) int64 {
			return write(t, cli, put{k.Status("s1"), status("s1", state.PhaseRunning)})
		}, history.RulePhaseEdge, func(k state.Keys) string { return k.Status("s1") }, 0},
		{"a live session's status deleted", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Status("s1"), status("s1", state.PhasePending)})
			return write(t, cli, put{k.Status("s1"), nil})
		}, history.RulePhaseEdge, func(k state.Keys) string { return k.Status("s1") }, 0},
		{"a finished session re-queued", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Status("s1"), status("s1", state.PhasePending)})
			write(t, cli, put{k.Status("s1"), status("s1", state.PhaseBound)})
			write(t, cli, put{k.Status("s1"), status("s1", state.PhaseSucceeded)})
			return write(t, cli, put{k.Status("s1"), status("s1", state.PhasePending)}, put{k.Pending("s1"), state.QueueEntry{Session: "s1"}})
		}, history.RuleFinishedRequeued, func(k state.Keys) string { return k.Status("s1") }, 0},
		{"a queue entry for a finished session", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Status("s1"), status("s1", state.PhasePending)})
			write(t, cli, put{k.Status("s1"), status("s1", state.PhaseBound)})
			write(t, cli, put{k.Status("s1"), status("s1", state.PhaseFailed)})
			return write(t, cli, put{k.Pending("s1"), state.QueueEntry{Session: "s1"}})
		}, history.RuleFinishedRequeued, func(k state.Keys) string { return k.Pending("s1") }, 0},
		{"a queue entry for a running session", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Status("s1"), status("s1", state.PhasePending)})
			write(t, cli, put{k.Status("s1"), status("s1", state.PhaseBound)})
			return write(t, cli, put{k.Pending("s1"), state.QueueEntry{Session: "s1"}})
		}, history.RuleQueuedButNotPending, func(k state.Keys) string { return k.Pending("s1") }, 0},
		{"a job array over its cap", func(t *testing.T, k state.Keys) int64 {
			el := func(i int) []put {
				id := state.ElementID("a", i)
				return []put{{k.Session(id), state.Session{ID: id, Array: &state.ArrayMember{ID: "a", Index: i}}}, {k.Status(id), status(id, state.PhasePending)}}
			}
			write(t, cli, append([]put{{k.Array("a"), state.Array{ID: "a", Indices: "0-9", MaxRunning: 2}}}, append(el(0), el(1)...)...)...)
			// One ended: one more may exist (two unfinished, the cap).
			write(t, cli, put{k.Status("a-0"), status("a-0", state.PhaseStopped)})
			write(t, cli, el(2)...)
			return write(t, cli, el(3)...)
		}, history.RuleArrayOverCap, func(k state.Keys) string { return k.Array("a") }, 0},
		{"an unfinished job array deleted", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Array("a"), state.Array{ID: "a", Indices: "0-9", MaxRunning: 2}})
			return write(t, cli, put{k.Array("a"), nil})
		}, history.RuleArrayRetiredEarly, func(k state.Keys) string { return k.Array("a") }, 0},
		{"a finished job array deleted before its elements", func(t *testing.T, k state.Keys) int64 {
			done := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
			el := func(i int) []put {
				id := state.ElementID("a", i)
				return []put{{k.Session(id), state.Session{ID: id, Array: &state.ArrayMember{ID: "a", Index: i}}}, {k.Status(id), status(id, state.PhasePending)}}
			}
			write(t, cli, append([]put{{k.Array("a"), state.Array{ID: "a", Indices: "0-1", MaxRunning: 2, Next: 2}}}, append(el(0), el(1)...)...)...)
			write(t, cli, put{k.Status("a-0"), status("a-0", state.PhaseStopped)}, put{k.Status("a-1"), status("a-1", state.PhaseStopped)})
			write(t, cli, put{k.Array("a"), state.Array{ID: "a", Indices: "0-1", MaxRunning: 2, Next: 2, Finished: &done}})
			// Element 0 retired first is legal; the array before element 1 is not.
			write(t, cli, put{k.Session("a-0"), nil}, put{k.Status("a-0"), nil})
			return write(t, cli, put{k.Array("a"), nil})
		}, history.RuleArrayRetiredEarly, func(k state.Keys) string { return k.Array("a") }, 0},
		{"a part for a binding the node does not hold", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			b := write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, nil)})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1"}})
			write(t, cli, put{k.Part("n1", "s1"), state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseRunning, BindingRevision: b}})
			return write(t, cli, put{k.Part("n1", "s1"), state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseRunning, BindingRevision: b - 1}})
		}, history.RulePartUnbound, func(k state.Keys) string { return k.Part("n1", "s1") }, 0},
		{"a part written after its binding was released", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")})
			b := write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, nil)})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1"}})
			// The release's own report of the end is legal ...
			write(t, cli, put{k.Ledger("n1"), nil}, put{k.Binding("n1", "s1"), nil},
				put{k.Part("n1", "s1"), state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseSucceeded, BindingRevision: b}})
			// ... a later write for the gone binding is not.
			return write(t, cli, put{k.Part("n1", "s1"), state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseRunning, BindingRevision: b}})
		}, history.RulePartUnbound, func(k state.Keys) string { return k.Part("n1", "s1") }, 0},
		{"an attempt launched under a second binding", func(t *testing.T, k state.Keys) int64 {
			t1, t2 := time.Date(2026, 11, 29, 4, 0, 0, 0, time.UTC), time.Date(2026, 11, 29, 4, 0, 5, 0, time.UTC)
			q := write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Status("s1"), status("s1", state.PhasePending)})
			bound := state.Status{Session: "s1", Phase: state.PhaseBound, QueueRevision: q}
			b1 := write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, nil)})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1"}},
				put{k.Status("s1"), bound})
			write(t, cli, put{k.Part("n1", "s1"), state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseStarting, QueueRevision: q, BindingRevision: b1, Launched: &t1}})
			// Released with its end reported; then bound again for the
			// same queueing (no placer does that) and launched again.
			write(t, cli, put{k.Ledger("n1"), nil}, put{k.Binding("n1", "s1"), nil},
				put{k.Part("n1", "s1"), state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseSucceeded, QueueRevision: q, BindingRevision: b1, Launched: &t1}})
			write(t, cli, put{k.Part("n1", "s1"), nil}) // the merger is done with it
			b2 := write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, nil)})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1"}})
			return write(t, cli, put{k.Part("n1", "s1"), state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseStarting, QueueRevision: q, BindingRevision: b2, Launched: &t2}})
		}, history.RuleLaunchedTwice, func(k state.Keys) string { return k.Part("n1", "s1") }, 0},
		{"an attempt launched again after its container ran", func(t *testing.T, k state.Keys) int64 {
			t1, t2 := time.Date(2026, 11, 29, 4, 0, 0, 0, time.UTC), time.Date(2026, 11, 29, 4, 0, 5, 0, time.UTC)
			q := write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Status("s1"), status("s1", state.PhasePending)})
			b := write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, nil)})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1"}},
				put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseBound, QueueRevision: q}})
			part := state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseStarting, QueueRevision: q, BindingRevision: b, Launched: &t1}
			write(t, cli, put{k.Part("n1", "s1"), part})
			part.Phase, part.Started = state.PhaseRunning, &t1
			write(t, cli, put{k.Part("n1", "s1"), part})
			// Its container gone (fenced), the agent starts it again in
			// place: the attempt runs twice.
			part.Phase, part.Started, part.Launched = state.PhaseStarting, nil, &t2
			return write(t, cli, put{k.Part("n1", "s1"), part})
		}, history.RuleLaunchedTwice, func(k state.Keys) string { return k.Part("n1", "s1") }, 0},
		{"a launch for a queueing the status has left", func(t *testing.T, k state.Keys) int64 {
			t1 := time.Date(2026, 11, 29, 4, 0, 0, 0, time.UTC)
			q := write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Status("s1"), status("s1", state.PhasePending)})
			b := write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, nil)})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1"}},
				put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseBound, QueueRevision: q}})
			write(t, cli, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhaseStarting, QueueRevision: q + 1000}})
			return write(t, cli, put{k.Part("n1", "s1"), state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseStarting, QueueRevision: q, BindingRevision: b, Launched: &t1}})
		}, history.RuleLaunchedTwice, func(k state.Keys) string { return k.Part("n1", "s1") }, 0},
		{"an elastic job that shrinks in place: its new size announced while it still holds the old", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Status("s1"), status("s1", state.PhasePending)})
			two := alloc(100, nil, "GPU-n1-0", "GPU-n1-1")
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": two})}, put{k.Binding("n1", "s1"), bnd("s1", two)},
				put{k.Status("s1"), elasticStatus("s1", state.PhaseBound, 2)})
			return write(t, cli, put{k.Status("s1"), elasticStatus("s1", state.PhaseRunning, 1)})
		}, history.RuleElasticOverSize, func(k state.Keys) string { return k.Status("s1") }, 0},
		{"an elastic job that grows onto another node before releasing the first", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Node("n2"), node("n2")}, put{k.Status("s1"), status("s1", state.PhasePending)})
			one := alloc(100, nil, "GPU-n1-0")
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": one})}, put{k.Binding("n1", "s1"), bnd("s1", one)},
				put{k.Status("s1"), elasticStatus("s1", state.PhaseBound, 1)})
			two := alloc(100, nil, "GPU-n2-0", "GPU-n2-1")
			return write(t, cli, put{k.Ledger("n2"), ledger("n2", map[string]state.Allocation{"s1": two})}, put{k.Binding("n2", "s1"), bnd("s1", two)},
				put{k.Status("s1"), elasticStatus("s1", state.PhaseRunning, 2)})
		}, history.RuleElasticOverSize, func(k state.Keys) string { return k.Status("s1") }, 0},
		{"an elastic multi-node job that binds a second machine while its status says one", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Node("n2"), node("n2")}, put{k.Status("s1"), status("s1", state.PhasePending)})
			// CPU-only parts: only the count of machines can break.
			head, worker := alloc(100, nil), alloc(100, nil)
			head.Role, worker.Role = state.RoleHead, state.RoleWorker
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": head})}, put{k.Binding("n1", "s1"), bnd("s1", head)},
				put{k.Status("s1"), elasticNodesStatus("s1", state.PhaseBound, "n1")})
			return write(t, cli, put{k.Ledger("n2"), ledger("n2", map[string]state.Allocation{"s1": worker})}, put{k.Binding("n2", "s1"), bnd("s1", worker)})
		}, history.RuleElasticOverSize, func(k state.Keys) string { return k.Status("s1") }, 0},
		{"an elastic multi-node job whose parts hold more GPUs than its size", func(t *testing.T, k state.Keys) int64 {
			write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Status("s1"), status("s1", state.PhasePending)})
			head := alloc(100, nil, "GPU-n1-0")
			head.Role = state.RoleHead
			write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": head})}, put{k.Binding("n1", "s1"), bnd("s1", head)},
				put{k.Status("s1"), elasticNodesStatus("s1", state.PhaseBound, "n1")})
			head.GPUs = []string{"GPU-n1-0", "GPU-n1-1"}
			return write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": head})}, put{k.Binding("n1", "s1"), bnd("s1", head)})
		}, history.RuleElasticOverSize, func(k state.Keys) string { return k.Status("s1") }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := state.MustKeys(fmt.Sprintf("/case%d", i))
			start := write(t, cli, put{k.Profile("marker"), state.Profile{Name: "marker"}})
			at := tc.steps(t, k)
			write(t, cli, put{k.Profile("marker"), nil}) // a revision after the break, to read past it
			end := write(t, cli, put{k.Profile("marker"), state.Profile{Name: "end"}})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			res, err := history.Watch(ctx, cli, k, history.Options{Start: start, End: end, StuckAfter: tc.stuck})
			if err != nil {
				t.Fatal(err)
			}
			if res.Last < end {
				t.Fatalf("checked up to %d, want %d", res.Last, end)
			}
			if res.Count != len(res.Violations) || res.Count == 0 {
				t.Fatalf("violations %d (kept %d), want some", res.Count, len(res.Violations))
			}
			for _, v := range res.Violations {
				if v.Rule != tc.rule || v.Revision != at || v.Key != tc.key(k) {
					t.Errorf("violation %s; want rule %s at revision %d, key %s", v, tc.rule, at, tc.key(k))
				}
			}
		})
	}
}

// TestCheckerPassesALegalHistory runs one session through its life with
// the state package's own transactions: create, bind, start, a NodeLost
// re-queue, a second bind, a release. No rule is broken.
func TestCheckerPassesALegalHistory(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys("/legal")
	start := write(t, cli, put{k.Node("n1"), node("n1")})
	now := time.Now().UTC()
	s := state.Session{ID: "s1", Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredRunning, Created: now,
		Restart: state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 2}}
	if _, err := state.CreateSession(ctx, cli, k, s, now); err != nil {
		t.Fatal(err)
	}
	bindOnce := func(gpu string) int64 {
		pr, err := cli.Get(ctx, k.Pending("s1"))
		if err != nil || len(pr.Kvs) == 0 {
			t.Fatalf("pending: %v", err)
		}
		lr, err := cli.Get(ctx, k.Ledger("n1"))
		if err != nil {
			t.Fatal(err)
		}
		var lrev int64
		if len(lr.Kvs) > 0 {
			lrev = lr.Kvs[0].ModRevision
		}
		cmps, ops, err := state.BindOps(k, []state.LedgerWrite{{Node: "n1", ReadRevision: lrev, NodeRevision: start, Ledger: ledger("n1", map[string]state.Allocation{"s1": alloc(100, []int{40001}, gpu)})}},
			[]state.Placement{{Session: "s1", PendingRevision: pr.Kvs[0].ModRevision, Bindings: []state.Binding{{Session: "s1", Node: "n1", GPUs: []string{gpu}, Ports: []int{40001}, QueueRevision: pr.Kvs[0].ModRevision}},
				Status: state.Status{Session: "s1"}}})
		if err != nil {
			t.Fatal(err)
		}
		r, err := cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil || !r.Succeeded {
			t.Fatalf("bind: %v", err)
		}
		return r.Header.Revision
	}
	first := bindOnce("GPU-n1-0")
	// The agent launches the attempt, finds its container created and
	// never started, and launches it again (Launch with again: legal);
	// then it runs.
	b1, _, err := state.Get[state.Binding](ctx, cli, k.Binding("n1", "s1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.Launch(ctx, cli, k, b1, first, false, now); err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.Launch(ctx, cli, k, b1, first, true, now.Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	write(t, cli, put{k.Status("s1"), status("s1", state.PhaseRunning)})
	// The node is lost and the session re-queued, in one txn (as the placer does).
	write(t, cli, put{k.Binding("n1", "s1"), nil}, put{k.Ledger("n1"), nil}, put{k.Part("n1", "s1"), nil},
		put{k.Pending("s1"), state.NewQueueEntry(s, now)}, put{k.Status("s1"), state.Status{Session: "s1", Phase: state.PhasePending, Attempt: 1}})
	rev := bindOnce("GPU-n1-1")
	b2, _, err := state.Get[state.Binding](ctx, cli, k.Binding("n1", "s1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.Launch(ctx, cli, k, b2, rev, false, now.Add(2*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := state.Release(ctx, cli, k, "n1", "s1", rev, func(_ state.Session, p state.PartStatus) (state.Event, state.PartStatus, error) {
		return state.EventSucceed, p, nil
	}); err != nil {
		t.Fatal(err)
	}
	end := write(t, cli, put{k.Profile("end"), state.Profile{Name: "end"}})
	res, err := history.Watch(ctx, cli, k, history.Options{Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	if res.Count != 0 {
		t.Errorf("a legal history broke rules: %v", res.Violations)
	}
	if res.Binds != 2 {
		t.Errorf("counted %d binds, want 2", res.Binds)
	}
	if res.Revisions < 6 {
		t.Errorf("applied %d revisions, want every one of the history", res.Revisions)
	}
}

// TestCheckerToleratesCompactionBehindItsStart: history before the start
// revision is compacted; a check from there works, one from before it says
// the history is gone.
func TestCheckerToleratesCompactionBehindItsStart(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys("/compact")
	for i := 0; i < 5; i++ {
		write(t, cli, put{k.Status("old"), status("old", state.PhasePending)})
	}
	start := write(t, cli, put{k.Node("n1"), node("n1")})
	if _, err := cli.Compact(ctx, start); err != nil {
		t.Fatal(err)
	}
	at := write(t, cli, put{k.Binding("n1", "s1"), state.Binding{}})
	res, err := history.Watch(ctx, cli, k, history.Options{Start: start, End: at})
	if err != nil {
		t.Fatalf("check from the compaction revision: %v", err)
	}
	if res.Count != 1 || res.Violations[0].Rule != history.RuleBindingNoAlloc || res.Violations[0].Revision != at {
		t.Errorf("violations %v, want the binding without allocation at %d", res.Violations, at)
	}
	if _, err := history.Watch(ctx, cli, k, history.Options{Start: start - 2, End: at}); !errors.Is(err, history.ErrCompacted) {
		t.Errorf("check from a compacted revision = %v, want ErrCompacted", err)
	}
}

// TestCheckerFollowsLive starts at the current revision, as `voyager
// check` does against a live cluster, and sees a break written after.
func TestCheckerFollowsLive(t *testing.T) {
	cli := etcdtest.New(t)
	k := state.MustKeys("/live")
	write(t, cli, put{k.Node("n1"), node("n1")})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	found := make(chan history.Violation, 1)
	done := make(chan error, 1)
	started := make(chan int64, 1)
	go func() {
		_, err := history.Watch(ctx, cli, k, history.Options{
			OnRevision: func(rev, _ int64) {
				select {
				case started <- rev:
				default:
				}
			},
			OnViolation: func(v history.Violation) {
				select {
				case found <- v:
				default:
				}
			},
		})
		done <- err
	}()
	// Progress notifications come only on request in a live follow; write
	// until the checker has applied something, then break a rule.
	for {
		write(t, cli, put{k.Profile("tick"), state.Profile{Name: "tick"}})
		select {
		case <-started:
		case <-time.After(50 * time.Millisecond):
			continue
		}
		break
	}
	at := write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s9": alloc(1, nil)})})
	select {
	case v := <-found:
		if v.Rule != history.RuleAllocNoBinding || v.Revision != at {
			t.Errorf("violation %s, want allocation-without-binding at %d", v, at)
		}
	case <-ctx.Done():
		t.Fatal("the live checker saw nothing")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Watch after cancel = %v, want nil", err)
	}
}

// TestCheckerReadsPreviousValues: the phase rule reads the previous status
// etcd reports with the change; one that differs from the model's means a
// revision was missed, itself a violation.
func TestCheckerReadsPreviousValues(t *testing.T) {
	k := state.MustKeys("/prev")
	enc := func(p state.Phase) []byte {
		v, err := state.Encode(status("s1", p))
		if err != nil {
			t.Fatal(err)
		}
		return []byte(v)
	}
	c := history.New(k)
	if vs := c.Apply(1, []history.Change{{Key: k.Status("s1"), Value: enc(state.PhasePending)}}); len(vs) != 0 {
		t.Fatalf("create: %v", vs)
	}
	vs := c.Apply(3, []history.Change{{Key: k.Status("s1"), Value: enc(state.PhaseRunning), Prev: enc(state.PhaseBound)}})
	if len(vs) != 1 || vs[0].Rule != history.RuleGap || vs[0].Revision != 3 {
		t.Fatalf("violations %v, want one history-gap at 3 (Bound → Running is an edge; Pending → Bound was missed)", vs)
	}
	vs = c.Apply(4, []history.Change{{Key: k.Status("s1"), Value: enc(state.PhaseStarting), Prev: enc(state.PhaseRunning)}})
	if len(vs) != 1 || vs[0].Rule != history.RulePhaseEdge {
		t.Fatalf("violations %v, want phase-edge (Running → Starting)", vs)
	}
}

// TestCheckerReadsVersions: without previous values (Watch asks for none),
// a status's etcd versions must follow on from the model's; a put that
// skips a version, a create over a status the model holds (its delete
// missed) and an update of one it does not hold (its create missed) each
// break history-gap, and versions that follow on break nothing.
func TestCheckerReadsVersions(t *testing.T) {
	k := state.MustKeys("/versions")
	enc := func(id string, p state.Phase) []byte {
		v, err := state.Encode(status(id, p))
		if err != nil {
			t.Fatal(err)
		}
		return []byte(v)
	}
	c := history.New(k)
	if vs := c.Load(1, []history.Change{{Key: k.Status("s1"), Value: enc("s1", state.PhasePending), Version: 1}}); len(vs) != 0 {
		t.Fatalf("load: %v", vs)
	}
	for _, step := range []struct {
		rev     int64
		ch      history.Change
		gap     bool
		comment string
	}{
		{2, history.Change{Key: k.Status("s1"), Value: enc("s1", state.PhaseBound), Version: 2}, false, "version 2 follows the listed 1"},
		{4, history.Change{Key: k.Status("s1"), Value: enc("s1", state.PhaseStarting), Version: 4}, true, "version 4 after 2: one revision missed"},
		{5, history.Change{Key: k.Status("s1"), Value: enc("s1", state.PhaseRunning), Version: 5}, false, "5 follows 4"},
		{6, history.Change{Key: k.Status("s1"), Value: enc("s1", state.PhaseRunning), Version: 1}, true, "created over a held status: its delete missed"},
		{7, history.Change{Key: k.Status("s2"), Value: enc("s2", state.PhasePending), Version: 3}, true, "updated, never created: its create missed"},
		{8, history.Change{Key: k.Status("s3"), Value: enc("s3", state.PhasePending), Version: 1}, false, "a create"},
		{9, history.Change{Key: k.Status("s3")}, false, "a delete of a Pending status"},
		{10, history.Change{Key: k.Status("s3"), Value: enc("s3", state.PhasePending), Version: 1}, false, "created again after its delete"},
	} {
		vs := c.Apply(step.rev, []history.Change{step.ch})
		gaps := 0
		for _, v := range vs {
			if v.Rule == history.RuleGap {
				gaps++
			}
		}
		if step.gap && (gaps != 1 || vs[0].Revision != step.rev) || !step.gap && gaps != 0 {
			t.Errorf("revision %d (%s): violations %v, want a history-gap: %v", step.rev, step.comment, vs, step.gap)
		}
	}
}

// TestCheckerLaunchOutlivesItsStatus: a part's binding outlives its
// session's status (its agent was cut off while retention retired the
// ended session), the merger deletes the stale part, and the agent's
// release writes the part's end, carrying the launch it recorded: that is
// no new launch (the soak found the checker calling it one).
func TestCheckerLaunchOutlivesItsStatus(t *testing.T) {
	cli := etcdtest.New(t)
	k := state.MustKeys("/outlives")
	t1 := time.Date(2026, 11, 29, 4, 0, 0, 0, time.UTC)
	start := write(t, cli, put{k.Node("n1"), node("n1")})
	q := write(t, cli, put{k.Status("s1"), status("s1", state.PhasePending)})
	st := func(p state.Phase) state.Status { return state.Status{Session: "s1", Phase: p, QueueRevision: q} }
	b := write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": alloc(1, nil)})}, put{k.Binding("n1", "s1"), state.Binding{Session: "s1"}},
		put{k.Status("s1"), st(state.PhaseBound)})
	part := state.PartStatus{Session: "s1", Node: "n1", Phase: state.PhaseStarting, QueueRevision: q, BindingRevision: b, Launched: &t1}
	write(t, cli, put{k.Part("n1", "s1"), part})
	write(t, cli, put{k.Status("s1"), st(state.PhaseStarting)})
	part.Phase, part.Started = state.PhaseRunning, &t1
	write(t, cli, put{k.Part("n1", "s1"), part})
	write(t, cli, put{k.Status("s1"), st(state.PhaseRunning)})
	write(t, cli, put{k.Status("s1"), st(state.PhaseSucceeded)})
	write(t, cli, put{k.Status("s1"), nil})     // retention
	write(t, cli, put{k.Part("n1", "s1"), nil}) // the merger: stale
	part.Phase, part.Finished = state.PhaseSucceeded, &t1
	end := write(t, cli, put{k.Ledger("n1"), nil}, put{k.Binding("n1", "s1"), nil}, put{k.Part("n1", "s1"), part})
	res, err := history.Watch(context.Background(), cli, k, history.Options{Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	if res.Count != 0 {
		t.Errorf("a legal history broke rules: %v", res.Violations)
	}
}
