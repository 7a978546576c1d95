package nodeagent_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// TestMultiNodeJobParts: a batch job on two machines (Session.Nodes 2),
// each part run by its machine's agent, each agent reporting only its
// part (parts/<node>/<id>), the status written by the merger
// (state.MergeParts). Under StopAll a failed worker ends the job with its
// exit code and the head's agent stops the head; under Continue the job
// outlives the failed worker and ends with rank 0's exit.
func TestMultiNodeJobParts(t *testing.T) {
	cli := etcdtest.New(t)
	fakes := map[string]*runtime.Fake{}
	for _, n := range []string{"sk-a", "sk-b"} {
		fakes[n] = newFake()
		cfg := testConfig(t, cli, fakes[n])
		cfg.Node = n
		runAgent(t, cfg)
	}
	waitFor(t, "both machines registered", 20*time.Second, func() (bool, string) {
		r, _ := cli.Get(context.Background(), keys.Nodes(), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return r != nil && r.Count == 2, ""
	})
	job := func(id, onFailure string) []state.Binding {
		return bindParts(t, cli, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"train"}, Nodes: 2, OnPartFailure: onFailure},
			[]state.Binding{
				{Node: "sk-a", Role: state.RoleHead, CPUMilli: 100, MemoryMiB: 64, Ports: mnPorts(61100, true)},
				{Node: "sk-b", Role: state.RoleWorker, Worker: 1, HeadNode: "sk-a", CPUMilli: 100, MemoryMiB: 64, Ports: mnPorts(61110, false)},
			})
	}
	partsLeft := func(id string) func() (bool, string) {
		return func() (bool, string) {
			var left []string
			for _, n := range []string{"sk-a", "sk-b"} {
				for _, key := range []string{keys.Binding(n, id), keys.Part(n, id)} {
					if r, _ := cli.Get(context.Background(), key); r == nil || len(r.Kvs) > 0 {
						left = append(left, key)
					}
				}
			}
			return len(left) == 0, fmt.Sprint(left)
		}
	}

	t.Run("StopAll", func(t *testing.T) {
		bs := job("skgang1", "")
		waitPhase(t, cli, "skgang1", state.PhaseRunning, 20*time.Second)
		if err := fakes["sk-b"].Finish(nodeagent.ContainerID(bs[1]), 5, "worker died\n"); err != nil {
			t.Fatal(err)
		}
		st := waitPhase(t, cli, "skgang1", state.PhaseFailed, 20*time.Second)
		if st.ExitCode == nil || *st.ExitCode != 5 {
			t.Errorf("exit code = %v, want the failed worker's 5", st.ExitCode)
		}
		waitFor(t, "both parts released and their part keys deleted", 20*time.Second, partsLeft("skgang1"))
		if _, err := fakes["sk-a"].Status(context.Background(), nodeagent.ContainerID(bs[0])); err == nil {
			t.Error("the head's container still exists after the job ended")
		}
	})

	t.Run("Continue", func(t *testing.T) {
		bs := job("skgang2", state.PartFailureContinue)
		waitPhase(t, cli, "skgang2", state.PhaseRunning, 20*time.Second)
		if err := fakes["sk-b"].Finish(nodeagent.ContainerID(bs[1]), 5, "worker died\n"); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the worker's end reported", 20*time.Second, func() (bool, string) {
			p, _, err := state.Get[state.PartStatus](context.Background(), cli, keys.Part("sk-b", "skgang2"))
			return err == nil && p.Phase == state.PhaseFailed, string(p.Phase)
		})
		if st, _, _ := state.Get[state.Status](context.Background(), cli, keys.Status("skgang2")); st.Phase != state.PhaseRunning {
			t.Fatalf("under Continue a failed worker moved the job to %s", st.Phase)
		}
		if err := fakes["sk-a"].Finish(nodeagent.ContainerID(bs[0]), 0, "done\n"); err != nil {
			t.Fatal(err)
		}
		st := waitPhase(t, cli, "skgang2", state.PhaseSucceeded, 20*time.Second)
		if st.ExitCode == nil || *st.ExitCode != 0 {
			t.Errorf("exit code = %v, want rank 0's 0", st.ExitCode)
		}
		waitFor(t, "both parts released and their part keys deleted", 20*time.Second, partsLeft("skgang2"))
	})
}
