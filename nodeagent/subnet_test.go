package nodeagent_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// claims returns every subnet claim in etcd: subnet → node.
func claims(t *testing.T, cli *clientv3.Client) map[string]string {
	t.Helper()
	resp, err := cli.Get(context.Background(), keys.SubnetsDir(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, kv := range resp.Kvs {
		c, err := state.Decode[state.SubnetClaim](kv.Value)
		if err != nil {
			t.Fatal(err)
		}
		if string(kv.Key) != keys.Subnet(c.Node) {
			t.Errorf("claim of %s under %s, want %s", c.Node, kv.Key, keys.Subnet(c.Node))
		}
		out[c.Subnet] = c.Node
	}
	return out
}

// TestClaimSubnetGivesEachNodeItsOwn: agents whose derived default
// subnets collide (one seed) each get a subnet of their own, also when
// they start at once; an agent keeps its subnet across restarts, an
// explicit subnet that overlaps another node's is refused naming that
// node, and a registered node's subnet (an agent without a claim) is
// avoided.
func TestClaimSubnetGivesEachNodeItsOwn(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	claim := func(node, seed, explicit string) string {
		t.Helper()
		s, err := nodeagent.ClaimSubnet(ctx, cli, keys, nodeagent.SubnetRequest{Node: node, Seed: seed, Explicit: explicit}, now)
		if err != nil {
			t.Fatalf("claim for %s: %v", node, err)
		}
		return s
	}
	const seed = "same-seed"
	a := claim("gpu-a", seed, "")
	if a != runtime.DefaultSubnet(seed) {
		t.Errorf("first claim %s, want the derived default %s", a, runtime.DefaultSubnet(seed))
	}
	b := claim("gpu-b", seed, "")
	if b == a {
		t.Fatalf("gpu-a and gpu-b both took %s", a)
	}
	if again := claim("gpu-a", "another-seed", ""); again != a {
		t.Errorf("gpu-a restarted with %s, want its claim %s", again, a)
	}

	// Eight agents with one seed start at once: eight subnets.
	var wg sync.WaitGroup
	got := make([]string, 8)
	errs := make([]error, 8)
	for i := range got {
		wg.Go(func() {
			got[i], errs[i] = nodeagent.ClaimSubnet(ctx, cli, keys, nodeagent.SubnetRequest{Node: fmt.Sprintf("gpu-%d", i), Seed: seed}, now)
		})
	}
	wg.Wait()
	seen := map[string]string{a: "gpu-a", b: "gpu-b"}
	for i, s := range got {
		if errs[i] != nil {
			t.Fatalf("claim for gpu-%d: %v", i, errs[i])
		}
		if other, ok := seen[s]; ok {
			t.Errorf("gpu-%d and %s both took %s", i, other, s)
		}
		seen[s] = fmt.Sprintf("gpu-%d", i)
	}
	if c := claims(t, cli); len(c) != 10 {
		t.Errorf("%d claims for 10 nodes: %v", len(c), c)
	}

	// Explicit subnets: gpu-a's, or one that holds every claim, is
	// refused, naming a node that holds it.
	for s, holder := range map[string]string{a: "of node gpu-a", "10.0.0.0/8": "of node gpu-"} {
		_, err := nodeagent.ClaimSubnet(ctx, cli, keys, nodeagent.SubnetRequest{Node: "gpu-c", Seed: seed, Explicit: s}, now)
		if err == nil || !strings.Contains(err.Error(), holder) || !strings.Contains(err.Error(), "VOYAGER_AGENT_NETWORK_SUBNET") {
			t.Errorf("explicit %s: %v, want a refusal naming a node (%q) and the setting", s, err, holder)
		}
	}
	if c := claim("gpu-c", seed, "10.120.0.0/24"); c != "10.120.0.0/24" {
		t.Errorf("explicit 10.120.0.0/24 claimed as %s", c)
	}
	if c := claim("gpu-c", seed, ""); c != "10.120.0.0/24" {
		t.Errorf("gpu-c without a setting took %s, want its claim 10.120.0.0/24", c)
	}
	claim("gpu-c", seed, "10.120.1.0/24")
	if c := claims(t, cli); c["10.120.1.0/24"] != "gpu-c" || c["10.120.0.0/24"] != "" {
		t.Errorf("gpu-c moved to 10.120.1.0/24 but the claims are %v", c)
	}

	// A node whose bridge already carries a subnet (an agent of a version
	// without claims, restarted) keeps it where no other node's overlaps.
	cur, err := nodeagent.ClaimSubnet(ctx, cli, keys, nodeagent.SubnetRequest{Node: "gpu-e", Seed: seed, Current: "10.121.0.0/24", Busy: true}, now)
	if err != nil || cur != "10.121.0.0/24" {
		t.Errorf("gpu-e with its bridge on a free 10.121.0.0/24: %s, %v; want it claimed", cur, err)
	}
	// Its bridge's subnet overlaps gpu-a's claim: with containers on the
	// bridge it is kept, unclaimed; without, the node moves.
	kept, err := nodeagent.ClaimSubnet(ctx, cli, keys, nodeagent.SubnetRequest{Node: "gpu-f", Seed: "f-seed", Current: a, Busy: true}, now)
	if kept != a || !errors.Is(err, nodeagent.ErrSubnetKept) || !strings.Contains(err.Error(), "gpu-a") {
		t.Errorf("gpu-f with busy bridge on gpu-a's %s: %s, %v; want it kept, unclaimed, naming gpu-a", a, kept, err)
	}
	if c := claims(t, cli); slices.Contains(slices.Collect(maps.Values(c)), "gpu-f") {
		t.Errorf("gpu-f kept %s but claimed: %v", a, c)
	}
	if moved := claim("gpu-f", "f-seed", ""); moved == a {
		t.Errorf("gpu-f without a bridge took gpu-a's %s", a)
	}
	moved, err := nodeagent.ClaimSubnet(ctx, cli, keys, nodeagent.SubnetRequest{Node: "gpu-g", Seed: "g-seed", Current: a}, now)
	if err != nil || moved == a {
		t.Errorf("gpu-g with an idle bridge on gpu-a's %s: %s, %v; want another subnet", a, moved, err)
	}

	// An agent that registered a subnet without claiming it.
	old := state.Node{Name: "gpu-old", Address: "10.0.0.9", Subnet: runtime.DefaultSubnet("old-seed"), GPUs: []state.GPU{}}
	if _, err := state.Put(ctx, cli, keys.Node("gpu-old"), old); err != nil {
		t.Fatal(err)
	}
	if d := claim("gpu-d", "old-seed", ""); d == old.Subnet {
		t.Errorf("gpu-d took %s, which gpu-old registered", d)
	}
}
