package nodeagent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentStartsWithItsNodesCopyOfSecrets: a session whose spec holds
// its environment values out (secretEnv) runs with the values of its
// node's copy (boundsecrets/<node>/<id>), and the release deletes that
// copy with the binding.
func TestAgentStartsWithItsNodesCopyOfSecrets(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	runAgent(t, cfg)
	ctx := context.Background()
	b := bind(t, cli, state.Session{ID: "sec1", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep"},
		Env: map[string]string{"API_KEY": "sk-1"}}, state.Binding{CPUMilli: 500, MemoryMiB: 256})
	spec, _, err := state.Get[state.Session](ctx, cli, keys.Session("sec1"))
	if err != nil || !spec.SecretEnv || spec.Env["API_KEY"] != "" {
		t.Fatalf("spec %+v %v; want the value held out", spec.Env, err)
	}
	waitPhase(t, cli, "sec1", state.PhaseRunning, 10*time.Second)
	cs, ok := rt.Spec(nodeagent.ContainerID(b))
	if !ok || cs.Env["API_KEY"] != "sk-1" {
		t.Fatalf("container env %v; want API_KEY from the node's copy", cs.Env)
	}
	if gone(t, cli, keys.BoundSecrets(cfg.Node, "sec1")) {
		t.Fatal("no copy of the secrets on the node")
	}
	spec.Desired = state.DesiredStopped
	if _, err := state.Put(ctx, cli, keys.Session("sec1"), spec); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the release to delete the node's copy", 10*time.Second, func() (bool, string) {
		return gone(t, cli, keys.BoundSecrets(cfg.Node, "sec1")), "copy still there"
	})
}

// TestAgentRefusesToStartWithoutSecrets: a session whose spec says its
// values are held out, bound without a copy for the node, fails to start
// with that reason instead of running with empty values.
func TestAgentRefusesToStartWithoutSecrets(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	runAgent(t, cfg)
	ctx := context.Background()
	now := time.Now().UTC()
	s := state.Session{ID: "sec2", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep"}, Created: now, Desired: state.DesiredRunning,
		Env: map[string]string{"API_KEY": "sk-2"}}
	if _, err := state.CreateSession(ctx, cli, keys, s, now); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, keys.SpecSecrets("sec2")); err != nil {
		t.Fatal(err)
	}
	b := bind(t, cli, s, state.Binding{CPUMilli: 500, MemoryMiB: 256})
	st := waitPhase(t, cli, "sec2", state.PhaseFailed, 10*time.Second)
	if !strings.Contains(st.Message, "no copy of the session's secrets on this node") {
		t.Errorf("failed with %q; want the missing secrets named", st.Message)
	}
	if _, ok := rt.Spec(nodeagent.ContainerID(b)); ok {
		t.Error("a container was made without the session's secrets")
	}
}
