package nodeagent_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentKeepsContainersThroughEtcdOutage: etcd goes away for longer than
// the lease; the agent loses its lease but stops nothing; etcd comes back
// with the same data and the agent registers again and adopts, starting
// nothing twice.
func TestAgentKeepsContainersThroughEtcdOutage(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	dir, addr := c.Dir, strings.TrimPrefix(c.Server.Endpoint(), "http://")
	cli := c.Client(t)
	rt := newFake()
	a, _ := runAgent(t, testConfig(t, cli, rt))
	b := bind(t, cli, state.Session{ID: "survivor", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}}, state.Binding{})
	waitPhase(t, cli, "survivor", state.PhaseRunning, 10*time.Second)

	c.Server.Close()
	waitFor(t, "the agent to give up its lease", 20*time.Second, func() (bool, string) {
		return a.Registrations() == 1 && leaseLost(a), ""
	})
	in, err := rt.Status(context.Background(), nodeagent.ContainerID(b))
	if err != nil || in.State != runtime.StateRunning {
		t.Fatalf("with etcd down: %+v, %v; want the container running", in, err)
	}

	// etcd back over the same data and address: the lease is long gone, so
	// the node key was deleted; the agent registers anew and adopts.
	etcdtest.Start(t, etcdtest.Options{Dir: dir, ClientAddr: addr})
	waitFor(t, "a second registration", 30*time.Second, func() (bool, string) {
		return a.Registrations() >= 2, ""
	})
	waitPhase(t, cli, "survivor", state.PhaseRunning, 10*time.Second)
	in, err = rt.Status(context.Background(), nodeagent.ContainerID(b))
	if err != nil || in.State != runtime.StateRunning || rt.Starts() != 1 {
		t.Fatalf("after the outage: %+v, %v, %d starts; want the same container, started once", in, err, rt.Starts())
	}
}

func leaseLost(a *nodeagent.Agent) bool { return !a.Registered() }
