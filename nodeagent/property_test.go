package nodeagent_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentPropertyContainersMatchBindings drives the agent through a random
// mix of binds, binding deletions (as for a lost node), stops and agent
// restarts, then checks the invariants: once quiet, the containers are
// exactly the bindings (no orphan, none missing: every session bound and
// neither unbound nor stopped has its binding, unless the agent ended its
// attempt as fenced), and no more containers were ever started than
// bindings were made (no duplicate).
func TestAgentPropertyContainersMatchBindings(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 42))
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	_, stop := runAgent(t, cfg)
	ctx := context.Background()
	var live []string
	made := 0
	for step := range 40 {
		switch op := rng.IntN(6); {
		case op <= 2 || len(live) == 0:
			id := fmt.Sprintf("p%02d", step)
			bind(t, cli, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}}, state.Binding{})
			live = append(live, id)
			made++
		case op == 3:
			i := rng.IntN(len(live))
			if _, err := cli.Delete(ctx, keys.Binding(node, live[i])); err != nil {
				t.Fatal(err)
			}
			live = slices.Delete(live, i, i+1)
		case op == 4:
			i := rng.IntN(len(live))
			s, _, err := state.Get[state.Session](ctx, cli, keys.Session(live[i]))
			if err != nil {
				t.Fatal(err)
			}
			s.Desired = state.DesiredStopped
			if _, err := state.Put(ctx, cli, keys.Session(live[i]), s); err != nil {
				t.Fatal(err)
			}
			live = slices.Delete(live, i, i+1)
		default:
			stop()
			_, stop = runAgent(t, cfg)
		}
	}
	waitFor(t, "containers to match bindings", 30*time.Second, func() (bool, string) {
		resp, err := cli.Get(ctx, keys.Bindings(node), clientv3.WithPrefix())
		if err != nil {
			return false, err.Error()
		}
		var want []string
		for _, kv := range resp.Kvs {
			b, err := state.Decode[state.Binding](kv.Value)
			if err != nil {
				t.Fatal(err)
			}
			want = append(want, nodeagent.ContainerID(b))
		}
		infos, _ := rt.List(ctx, nil)
		var got []string
		for _, in := range infos {
			got = append(got, in.ID)
		}
		slices.Sort(want)
		// A restart between an attempt's recorded launch and its
		// container's creation leaves a launch with no container: the
		// agent ends that attempt as fenced (it cannot tell whether it
		// ran; the status says Lost, reason Fenced) and releases it,
		// never starts it again in place.
		var expect, fenced []string
		for _, id := range live {
			st, _, err := state.Get[state.Status](ctx, cli, keys.Status(id))
			if err != nil {
				return false, err.Error()
			}
			if st.Reason == state.ReasonFenced {
				fenced = append(fenced, id)
				continue
			}
			expect = append(expect, id)
		}
		return slices.Equal(got, want) && len(want) == len(expect),
			fmt.Sprintf("containers %v, bindings %v, live %v (of them ended as fenced: %v)", got, want, live, fenced)
	})
	if rt.Starts() > made {
		t.Fatalf("%d containers started for %d bindings", rt.Starts(), made)
	}
}
