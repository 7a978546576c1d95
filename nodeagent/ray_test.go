package nodeagent_test

import (
	"context"
	"slices"
	"testing"
	"time"

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
	// The head's side, as the head's node and the placer left it.
	if _, err := state.Put(ctx, cli, keys.Node("gpu-00"), state.Node{Name: "gpu-00", Address: "10.0.0.7"}); err != nil {
		t.Fatal(err)
	}
	head := state.Binding{Session: "ray1", Node: "gpu-00", Role: state.RoleHead, Ports: []int{40001, 40002, 40003, 40004}}
	if _, err := state.Put(ctx, cli, keys.Binding("gpu-00", "ray1"), head); err != nil {
		t.Fatal(err)
	}
	w := bind(t, cli, state.Session{ID: "ray1", Owner: "ada", Kind: state.KindNotebook, Ray: &state.Ray{Workers: 1}},
		state.Binding{Role: state.RoleWorker, Worker: 1, HeadNode: "gpu-00", Ports: []int{40100, 40101}})
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
