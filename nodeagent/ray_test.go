package nodeagent_test

import (
	"context"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentRunsRayWorkerAgainstItsHead: a worker binding on this node
// joins the head found in etcd (the head's binding and node record), and
// writes no status: the head owns it.
func TestAgentRunsRayWorkerAgainstItsHead(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	ctx := context.Background()
	runAgent(t, testConfig(t, cli, rt))
	w := bindWorker(t, cli, state.Session{ID: "ray1", Owner: "ada", Kind: state.KindNotebook, Ray: &state.Ray{Workers: 1}})
	var spec []string
	waitFor(t, "the worker container", 10*time.Second, func() (bool, string) {
		s, ok := rt.Spec(nodeagent.ContainerID(w))
		spec = s.Args
		return ok, ""
	})
	want := []string{"ray", "start", "--address=10.0.0.7:40002", "--block", "--num-gpus=0", "--node-manager-port=40100", "--object-manager-port=40101"}
	if !slices.Equal(spec, want) {
		t.Fatalf("worker args %q; want %q", spec, want)
	}
	if s, _ := rt.Spec(nodeagent.ContainerID(w)); s.Env["JUPYTER_TOKEN"] != "" {
		t.Error("a Ray worker got a Jupyter token")
	}
	if st, _, _ := state.Get[state.Status](ctx, cli, keys.Status("ray1")); st.Phase != state.PhaseBound {
		t.Errorf("the worker wrote the session's status: %+v", st)
	}
}

// TestRayWorkerEndsWithItsHead: a batch gang ends when its head's command
// exits (the head's agent writes the final status); the worker on this
// node is then stopped and released, not left holding its GPUs. (Found by
// TestMultiMachineE2E: the worker stayed bound until retention.)
func TestRayWorkerEndsWithItsHead(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	ctx := context.Background()
	runAgent(t, testConfig(t, cli, rt))
	w := bindWorker(t, cli, state.Session{ID: "gang1", Owner: "ada", Kind: state.KindBatch, Command: []string{"train"}, Ray: &state.Ray{Workers: 1}})
	waitFor(t, "the worker container", 10*time.Second, func() (bool, string) {
		_, ok := rt.Spec(nodeagent.ContainerID(w))
		return ok, ""
	})
	// The head's agent ends the session: its command exited 0.
	st, _, err := state.Get[state.Status](ctx, cli, keys.Status("gang1"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	st.Phase, st.Reason, st.Finished = state.PhaseSucceeded, "Exited", &now
	if _, err := state.Put(ctx, cli, keys.Status("gang1"), st); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the worker's release and its container's removal", 10*time.Second, func() (bool, string) {
		_, exists := rt.Spec(nodeagent.ContainerID(w))
		return released(t, cli, "gang1") && !exists, ""
	})
	if after, _, _ := state.Get[state.Status](ctx, cli, keys.Status("gang1")); after.Phase != state.PhaseSucceeded {
		t.Errorf("the worker rewrote the final status: %+v", after)
	}
}

// bindWorker binds session s's Ray worker to this node, with its head on
// gpu-00 (10.0.0.7) as the head's node and the placer leave it.
func bindWorker(t *testing.T, cli *clientv3.Client, s state.Session) state.Binding {
	t.Helper()
	ctx := context.Background()
	if _, err := state.Put(ctx, cli, keys.Node("gpu-00"), state.Node{Name: "gpu-00", Address: "10.0.0.7"}); err != nil {
		t.Fatal(err)
	}
	head := state.Binding{Session: s.ID, Node: "gpu-00", Role: state.RoleHead, Ports: []int{40001, 40002, 40003, 40004}}
	if _, err := state.Put(ctx, cli, keys.Binding("gpu-00", s.ID), head); err != nil {
		t.Fatal(err)
	}
	return bind(t, cli, s, state.Binding{Role: state.RoleWorker, Worker: 1, HeadNode: "gpu-00", Ports: []int{40100, 40101}})
}
