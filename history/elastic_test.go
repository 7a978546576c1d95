package history_test

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// elasticStatus is an elastic job's status of 1-2 GPUs at size.
func elasticStatus(id string, p state.Phase, size int) state.Status {
	st := status(id, p)
	st.Elastic = &state.Elastic{Min: 1, Max: 2, Size: size}
	return st
}

// elasticNodesStatus is the status of an elastic job of 1-3 machines,
// bound on nodes (parts of one GPU each).
func elasticNodesStatus(id string, p state.Phase, nodes ...string) state.Status {
	st := status(id, p)
	st.Nodes = nodes
	st.Elastic = &state.Elastic{MinNodes: 1, MaxNodes: 3, Nodes: len(nodes), Size: len(nodes)}
	return st
}

// TestCheckerPassesAnElasticResize: an elastic job grows as Voyager
// resizes, a restart: bound at 1 GPU, released (Pending, Resized), queued
// again, bound at 2 on another node. No rule is broken; the same history
// with the release after the second bind is the broken case of
// TestCheckerFindsEachBrokenRule.
func TestCheckerPassesAnElasticResize(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys("/elastic")
	start := write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Node("n2"), node("n2")},
		put{k.Status("s1"), status("s1", state.PhasePending)}, put{k.Pending("s1"), state.QueueEntry{Session: "s1"}})
	one := alloc(100, nil, "GPU-n1-0")
	write(t, cli, put{k.Pending("s1"), nil}, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": one})}, put{k.Binding("n1", "s1"), bnd("s1", one)},
		put{k.Status("s1"), elasticStatus("s1", state.PhaseBound, 1)})
	write(t, cli, put{k.Status("s1"), elasticStatus("s1", state.PhaseRunning, 1)})
	write(t, cli, put{k.Status("s1"), elasticStatus("s1", state.PhaseStopping, 1)})
	retry := time.Now().UTC()
	waiting := elasticStatus("s1", state.PhasePending, 1)
	waiting.Reason, waiting.RetryAt = state.ReasonResized, &retry
	write(t, cli, put{k.Ledger("n1"), nil}, put{k.Binding("n1", "s1"), nil}, put{k.Status("s1"), waiting})
	write(t, cli, put{k.Pending("s1"), state.QueueEntry{Session: "s1"}}, put{k.Status("s1"), elasticStatus("s1", state.PhasePending, 1)})
	two := alloc(100, nil, "GPU-n2-0", "GPU-n2-1")
	write(t, cli, put{k.Pending("s1"), nil}, put{k.Ledger("n2"), ledger("n2", map[string]state.Allocation{"s1": two})}, put{k.Binding("n2", "s1"), bnd("s1", two)},
		put{k.Status("s1"), elasticStatus("s1", state.PhaseBound, 2)})
	end := write(t, cli, put{k.Status("s1"), elasticStatus("s1", state.PhaseRunning, 2)})
	res, err := history.Watch(ctx, cli, k, history.Options{Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	if res.Count != 0 {
		t.Errorf("a legal resize broke rules: %v", res.Violations)
	}
}

// TestCheckerPassesAnElasticNodesResize: an elastic job over a range of
// machines grows from one node to two as Voyager resizes it, a restart:
// its one part released, then two parts bound in one transaction. No
// rule is broken; binding the second part before the release is the
// broken case of TestCheckerFindsEachBrokenRule.
func TestCheckerPassesAnElasticNodesResize(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys("/elasticnodes")
	start := write(t, cli, put{k.Node("n1"), node("n1")}, put{k.Node("n2"), node("n2")},
		put{k.Status("s1"), status("s1", state.PhasePending)}, put{k.Pending("s1"), state.QueueEntry{Session: "s1"}})
	head := alloc(100, nil, "GPU-n1-0")
	head.Role = state.RoleHead
	write(t, cli, put{k.Pending("s1"), nil}, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": head})}, put{k.Binding("n1", "s1"), bnd("s1", head)},
		put{k.Status("s1"), elasticNodesStatus("s1", state.PhaseBound, "n1")})
	write(t, cli, put{k.Status("s1"), elasticNodesStatus("s1", state.PhaseRunning, "n1")})
	retry := time.Now().UTC()
	waiting := elasticNodesStatus("s1", state.PhasePending, "n1")
	waiting.Reason, waiting.RetryAt = state.ReasonResized, &retry
	write(t, cli, put{k.Ledger("n1"), nil}, put{k.Binding("n1", "s1"), nil}, put{k.Status("s1"), waiting})
	write(t, cli, put{k.Pending("s1"), state.QueueEntry{Session: "s1"}}, put{k.Status("s1"), elasticNodesStatus("s1", state.PhasePending)})
	worker := alloc(100, nil, "GPU-n2-0")
	worker.Role = state.RoleWorker
	write(t, cli, put{k.Pending("s1"), nil},
		put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": head})}, put{k.Binding("n1", "s1"), bnd("s1", head)},
		put{k.Ledger("n2"), ledger("n2", map[string]state.Allocation{"s1": worker})}, put{k.Binding("n2", "s1"), bnd("s1", worker)},
		put{k.Status("s1"), elasticNodesStatus("s1", state.PhaseBound, "n1", "n2")})
	end := write(t, cli, put{k.Status("s1"), elasticNodesStatus("s1", state.PhaseRunning, "n1", "n2")})
	res, err := history.Watch(ctx, cli, k, history.Options{Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	if res.Count != 0 {
		t.Errorf("a legal resize broke rules: %v", res.Violations)
	}
}
