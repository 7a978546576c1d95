package nodeagent_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

func newFake() *runtime.Fake { return runtime.NewFake(nil, "busybox", "custom:1") }

func TestAgentRegistersSimulatedNodeUnderLease(t *testing.T) {
	cli := etcdtest.New(t)
	cfg := testConfig(t, cli, newFake())
	_, stop := runAgent(t, cfg)
	var n state.Node
	waitFor(t, "the node record", 10*time.Second, func() (bool, string) {
		var err error
		n, _, err = state.Get[state.Node](context.Background(), cli, keys.Node(node))
		return err == nil, ""
	})
	if !n.Simulated || len(n.GPUs) != 2 || n.Address != "127.0.0.1" || n.Ports != cfg.Ports {
		t.Fatalf("node record %+v", n)
	}
	resp, _ := cli.Get(context.Background(), keys.Node(node))
	if resp.Kvs[0].Lease == 0 {
		t.Fatal("the node record is not attached to a lease")
	}
	// An agent that stops renewing loses its node within the TTL.
	stop()
	waitFor(t, "the node record to expire", 2*cfg.LeaseTTL, func() (bool, string) { return gone(t, cli, keys.Node(node)), "" })
}

func TestAgentRunsNotebookUntilStopped(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	runAgent(t, cfg)
	jport := listen(t) // stands in for Jupyter answering on its port
	gpus := []string{cfg.GPUs[1].UUID}
	b := bind(t, cli, state.Session{ID: "nb1", Owner: "ada", Kind: state.KindNotebook, Env: map[string]string{"WANDB_MODE": "offline"}},
		state.Binding{GPUs: gpus, CPUMilli: 1000, MemoryMiB: 512, Ports: []int{jport}})
	st := waitPhase(t, cli, "nb1", state.PhaseRunning, 10*time.Second)
	id := nodeagent.ContainerID(b)
	spec, ok := rt.Spec(id)
	if !ok {
		t.Fatalf("no container %s", id)
	}
	token := spec.Env["JUPYTER_TOKEN"]
	if len(token) < 32 || slices.ContainsFunc(spec.Args, func(a string) bool { return strings.Contains(a, token) }) {
		t.Fatalf("token %q: want a random token in the environment and not in %v", token, spec.Args)
	}
	if want := nodeagent.JupyterArgs(jport); !slices.Equal(spec.Args, want) {
		t.Errorf("args %v; want %v", spec.Args, want)
	}
	// The status, which operators read, has the URL without its token;
	// the token is under secrets/ (node's part), for the API alone.
	if st.URLs["jupyter"] != "http://127.0.0.1:"+itoa(jport)+"/" || st.Started == nil || st.Bound == nil {
		t.Errorf("Running status %+v", st)
	}
	if u := secretURL(t, cli, "nb1", "jupyter"); u != "http://127.0.0.1:"+itoa(jport)+"/?token="+token {
		t.Errorf("secret Jupyter URL %q", u)
	}
	if spec.Env["WANDB_MODE"] != "offline" || spec.Labels[nodeagent.LabelOwner] != "ada" || spec.Labels[nodeagent.LabelSession] != "nb1" ||
		!slices.Equal(spec.CDIDevices, []string{"nvidia.com/gpu=" + gpus[0]}) || spec.MemoryBytes != 512<<20 || spec.CPUMilli != 1000 ||
		len(spec.Mounts) != 3 || spec.Mounts[0].Target != nodeagent.HomePath || !strings.HasSuffix(spec.Mounts[0].Source, "/home/ada") ||
		spec.Mounts[1].Target != nodeagent.TopologyPath || !spec.Mounts[1].ReadOnly || spec.Env["VOYAGER_GPU_TOPOLOGY"] != nodeagent.TopologyPath ||
		spec.Mounts[2].Target != nodeagent.NCCLTopoPath || !spec.Mounts[2].ReadOnly || spec.Env["NCCL_TOPO_FILE"] != nodeagent.NCCLTopoPath {
		t.Errorf("container spec %+v", spec)
	}

	// Stop: the owner flips desired; the agent stops, releases, removes.
	s, _, _ := state.Get[state.Session](context.Background(), cli, keys.Session("nb1"))
	s.Desired = state.DesiredStopped
	state.Put(context.Background(), cli, keys.Session("nb1"), s)
	st = waitPhase(t, cli, "nb1", state.PhaseStopped, 10*time.Second)
	if st.ExitCode == nil || *st.ExitCode != 143 || st.Finished == nil {
		t.Errorf("Stopped status %+v", st)
	}
	if !gone(t, cli, keys.Binding(node, "nb1")) || !gone(t, cli, keys.Ledger(node)) {
		t.Error("binding or ledger allocation left after stop")
	}
	waitFor(t, "the container to be removed", 5*time.Second, func() (bool, string) {
		_, ok := rt.Spec(id)
		return !ok, ""
	})
}

func TestAgentReportsBatchExit(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	runAgent(t, testConfig(t, cli, rt))
	for _, tc := range []struct {
		id    string
		code  int
		phase state.Phase
	}{{"ok1", 0, state.PhaseSucceeded}, {"bad1", 3, state.PhaseFailed}} {
		b := bind(t, cli, state.Session{ID: tc.id, Owner: "ada", Kind: state.KindBatch, Image: "custom:1", Command: []string{"python", "train.py"}},
			state.Binding{CPUMilli: 500, MemoryMiB: 256})
		waitPhase(t, cli, tc.id, state.PhaseRunning, 10*time.Second)
		id := nodeagent.ContainerID(b)
		if spec, _ := rt.Spec(id); !slices.Equal(spec.Args, []string{"python", "train.py"}) || spec.Image != "custom:1" {
			t.Fatalf("batch spec %+v", spec)
		}
		if err := rt.Finish(id, tc.code, "epoch 1\nepoch 2: loss 0.1\n"); err != nil {
			t.Fatal(err)
		}
		st := waitPhase(t, cli, tc.id, tc.phase, 10*time.Second)
		// The output stays in the log: a status never carries it.
		if st.ExitCode == nil || *st.ExitCode != tc.code || strings.Contains(st.Message, "epoch") {
			t.Errorf("%s: final status %+v; want exit code %d and no output", tc.id, st, tc.code)
		}
		if !gone(t, cli, keys.Binding(node, tc.id)) {
			t.Errorf("%s: binding left", tc.id)
		}
	}
}

func TestAgentStopsContainerWhoseBindingIsDeleted(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	runAgent(t, testConfig(t, cli, rt))
	b := bind(t, cli, state.Session{ID: "lost1", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}}, state.Binding{})
	waitPhase(t, cli, "lost1", state.PhaseRunning, 10*time.Second)
	// As the placer does for a lost node: the binding goes, the status is
	// the placer's to write.
	cli.Delete(context.Background(), keys.Binding(node, "lost1"))
	st, _, _ := state.Get[state.Status](context.Background(), cli, keys.Status("lost1"))
	st.Phase = state.PhaseLost
	state.Put(context.Background(), cli, keys.Status("lost1"), st)
	waitFor(t, "the container to be removed", 10*time.Second, func() (bool, string) {
		_, ok := rt.Spec(nodeagent.ContainerID(b))
		return !ok, ""
	})
	if st, _, _ := state.Get[state.Status](context.Background(), cli, keys.Status("lost1")); st.Phase != state.PhaseLost {
		t.Errorf("the agent overwrote the placer's status: %+v", st)
	}
}

func TestAgentAdoptsAfterRestartAndRemovesOrphans(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	_, stop := runAgent(t, cfg)
	for _, id := range []string{"a1", "a2", "a3"} {
		bind(t, cli, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}}, state.Binding{})
		waitPhase(t, cli, id, state.PhaseRunning, 10*time.Second)
	}
	stop() // the agent dies; its containers live on
	if n := rt.Starts(); n != 3 {
		t.Fatalf("%d starts; want 3", n)
	}
	// While it was down, a3's binding went away, and a container of this
	// node appeared that no binding names.
	cli.Delete(context.Background(), keys.Binding(node, "a3"))
	rt.Start(context.Background(), runtime.Spec{ID: "stray", Image: "busybox", Labels: map[string]string{nodeagent.LabelNode: node}})

	runAgent(t, cfg)
	waitFor(t, "a3 and the stray container removed", 10*time.Second, func() (bool, string) {
		infos, _ := rt.List(context.Background(), nil)
		var ids []string
		for _, in := range infos {
			ids = append(ids, in.Labels[nodeagent.LabelSession])
		}
		return slices.Equal(ids, []string{"a1", "a2"}), strings.Join(ids, ",")
	})
	if n := rt.Starts(); n != 4 { // 3 sessions + the stray one; none again
		t.Fatalf("%d starts after restart; want 4 (no duplicates)", n)
	}
	for _, id := range []string{"a1", "a2"} {
		if st := waitPhase(t, cli, id, state.PhaseRunning, time.Second); st.Phase != state.PhaseRunning {
			t.Errorf("%s: %s", id, st.Phase)
		}
	}
}

// TestAgentFencesWhenItsLeaseIsRevoked: a lease gone (here revoked, as
// etcd expires one) means the placers may re-queue the node's sessions, so
// the agent fences: its container is stopped and removed. It registers
// again; no placer ran and the binding is still there, but the attempt
// had launched: it is never started again, and ends Lost (no restart
// policy) with reason Fenced.
func TestAgentFencesWhenItsLeaseIsRevoked(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	a, _ := runAgent(t, testConfig(t, cli, rt))
	bind(t, cli, state.Session{ID: "keep", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}}, state.Binding{})
	waitPhase(t, cli, "keep", state.PhaseRunning, 10*time.Second)
	resp, _ := cli.Get(context.Background(), keys.Node(node))
	if _, err := cli.Revoke(context.Background(), clientv3LeaseID(resp.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	id := "keep-q" + itoa64(bindingOf(t, cli, "keep").QueueRevision)
	waitFor(t, "a fence and a second registration", 15*time.Second, func() (bool, string) {
		return a.Fences() == 1 && a.Registrations() >= 2 && !gone(t, cli, keys.Node(node)), ""
	})
	st := waitPhase(t, cli, "keep", state.PhaseLost, 15*time.Second)
	if st.Reason != state.ReasonFenced || !strings.Contains(st.Message, "node lease lost") {
		t.Errorf("status %s %s %q; want Lost, Fenced, saying the lease was lost", st.Phase, st.Reason, st.Message)
	}
	if _, err := rt.Status(context.Background(), id); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("container %s after the fence: %v; want it gone", id, err)
	}
	if rt.Starts() != 1 {
		t.Fatalf("%d starts; want 1: the attempt never starts again", rt.Starts())
	}
}

func TestAgentFailsSessionWhoseImageIsMissing(t *testing.T) {
	cli := etcdtest.New(t)
	runAgent(t, testConfig(t, cli, newFake()))
	bind(t, cli, state.Session{ID: "noimg", Owner: "ada", Kind: state.KindBatch, Image: "nowhere:1", Command: []string{"true"}}, state.Binding{})
	st := waitPhase(t, cli, "noimg", state.PhaseFailed, 10*time.Second)
	if st.Reason != "StartFailed" || !strings.Contains(st.Message, "nowhere:1") {
		t.Errorf("status %+v", st)
	}
	if !gone(t, cli, keys.Binding(node, "noimg")) {
		t.Error("binding left")
	}
}

// TestReleasedSessionIsNotStartedAgain: a job that ends is released (its
// binding deleted) by its worker, which then returns; the reconcile that
// follows may still see the binding in a watch cache that lags the
// release. It must not start the job again.
func TestReleasedSessionIsNotStartedAgain(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	rt.Exit = func(runtime.Spec) (int, bool) { return 0, true } // every job ends at once
	runAgent(t, testConfig(t, cli, rt))
	const n = 30
	for i := range n {
		bind(t, cli, state.Session{ID: fmt.Sprintf("quick-%02d", i), Owner: "ada", Kind: state.KindBatch, Command: []string{"true"}},
			state.Binding{CPUMilli: 10, MemoryMiB: 8})
	}
	for i := range n {
		waitPhase(t, cli, fmt.Sprintf("quick-%02d", i), state.PhaseSucceeded, 20*time.Second)
	}
	waitFor(t, "the node's ledger to empty", 10*time.Second, func() (bool, string) { return gone(t, cli, keys.Ledger(node)), "" })
	if got := rt.Starts(); got != n {
		t.Fatalf("%d starts for %d jobs: a released job ran again", got, n)
	}
}
