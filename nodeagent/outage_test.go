package nodeagent_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentFencesThroughEtcdOutage: etcd goes away for longer than the
// lease. The agent cannot renew it and fences: the session's container is
// stopped and removed (the placers would re-queue it once the lease
// expires). etcd comes back with the same data and no placer has run, so
// the binding is still there: the agent registers anew and starts the
// session again, once, never beside its old copy.
func TestAgentFencesThroughEtcdOutage(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	dir, addr := c.Dir, strings.TrimPrefix(c.Server.Endpoint(), "http://")
	cli := c.Client(t)
	rt := newFake()
	a, _ := runAgent(t, testConfig(t, cli, rt))
	b := bind(t, cli, state.Session{ID: "survivor", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}}, state.Binding{})
	waitPhase(t, cli, "survivor", state.PhaseRunning, 10*time.Second)

	c.Server.Close()
	waitFor(t, "the agent to fence", 20*time.Second, func() (bool, string) {
		return a.Fences() == 1 && !a.Registered(), ""
	})
	if in, err := rt.Status(context.Background(), nodeagent.ContainerID(b)); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("with etcd down past the fence deadline: %+v, %v; want the container gone", in, err)
	}

	etcdtest.Start(t, etcdtest.Options{Dir: dir, ClientAddr: addr})
	waitFor(t, "a second registration and the session started again", 30*time.Second, func() (bool, string) {
		in, err := rt.Status(context.Background(), nodeagent.ContainerID(b))
		return a.Registrations() >= 2 && err == nil && in.State == runtime.StateRunning, ""
	})
	waitPhase(t, cli, "survivor", state.PhaseRunning, 10*time.Second)
	if rt.Starts() != 2 {
		t.Fatalf("%d starts; want 2: the first, and one after the fence", rt.Starts())
	}
}
