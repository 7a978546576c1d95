package nodeagent

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// TestClaimSubnetLosesARaceSafely: another agent claims the subnet this
// one chose between its read and its transaction; the transaction refuses
// the claim, and the agent reads again and takes another subnet.
func TestClaimSubnetLosesARaceSafely(t *testing.T) {
	cli := etcdtest.Start(t, etcdtest.Options{}).Client(t)
	ctx := context.Background()
	keys := state.MustKeys("/voyager")
	now := time.Date(2026, 11, 30, 6, 0, 0, 0, time.UTC)
	const seed = "raced"
	first := runtime.DefaultSubnet(seed)
	raced := false
	afterSubnetRead = func() {
		if raced {
			return
		}
		raced = true
		if _, err := state.Put(ctx, cli, keys.Subnet("gpu-fast"), state.SubnetClaim{Node: "gpu-fast", Subnet: first, Claimed: now}); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(func() { afterSubnetRead = nil })
	got, err := ClaimSubnet(ctx, cli, keys, SubnetRequest{Node: "gpu-slow", Seed: seed}, now)
	if err != nil {
		t.Fatal(err)
	}
	if got == first {
		t.Fatalf("gpu-slow took %s, which gpu-fast claimed while it decided", got)
	}
	c, _, err := state.Get[state.SubnetClaim](ctx, cli, keys.Subnet("gpu-fast"))
	if err != nil || c.Subnet != first {
		t.Errorf("gpu-fast's claim on %s: %+v, %v", first, c, err)
	}
}
