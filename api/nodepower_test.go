package api_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// TestNodeViewSaysWhichNodesMayPowerDown: GET /api/v1/nodes gives a node
// that runs nothing emptySince from etcd — the agent's release that
// deleted its ledger (state.Release writes emptied/<node>), or its
// registration where it never ran anything — and none to a node that
// holds a session; powerDown once the API's clock is PowerDownAfter past
// it. A second API on the same etcd (a restart) gives the same times.
func TestNodeViewSaysWhichNodesMayPowerDown(t *testing.T) {
	var offset atomic.Int64 // the API's clock runs this far ahead
	clock := func() time.Time { return time.Now().Add(time.Duration(offset.Load())) }
	h := newHarness(t, harnessOpts{powerDownAfter: 30 * time.Minute, now: clock})
	ctx := context.Background()
	for _, n := range []string{"used", "released", "idle"} {
		h.addNode(n, "A100", 2)
	}
	// "used" holds a session; "released" held one until its agent released it.
	for _, n := range []string{"used", "released"} {
		l := state.Ledger{Node: n, Allocations: map[string]state.Allocation{"s-" + n: {Owner: "ada", Role: state.RoleSingle, GPUs: []string{"GPU-" + n + "-0"}}}}
		if _, err := state.Put(ctx, h.cli, h.keys.Ledger(n), l); err != nil {
			t.Fatal(err)
		}
	}
	rev, err := state.Put(ctx, h.cli, h.keys.Binding("released", "s-released"), state.Binding{Session: "s-released", Node: "released"})
	if err != nil {
		t.Fatal(err)
	}
	if err := state.Release(ctx, h.cli, h.keys, "released", "s-released", rev, nil); err != nil {
		t.Fatal(err)
	}
	rec, _, err := state.Get[state.Emptied](ctx, h.cli, h.keys.Emptied("released"))
	if err != nil {
		t.Fatalf("the release wrote no emptied record: %v", err)
	}
	admin := h.token("root", "admin")
	view := func(h *harness) map[string]api.NodeSummary {
		out := map[string]api.NodeSummary{}
		for _, n := range decode[api.NodeList](t, want(t, h.do("GET", "/api/v1/nodes", admin, nil), 200)).Items {
			out[n.Name] = n
		}
		return out
	}
	caughtUp := func(h *harness) bool {
		v := view(h)
		return v["used"].EmptySince == nil && v["released"].EmptySince != nil && v["released"].EmptySince.Equal(rec.Since)
	}
	h.waitFor("the ledger and the release in the API's caches", func() bool { return caughtUp(h) })
	nodes := view(h)
	if n := nodes["used"]; n.EmptySince != nil || n.PowerDown {
		t.Errorf("a node holding a session: emptySince %v, powerDown %v", n.EmptySince, n.PowerDown)
	}
	if n := nodes["released"]; !n.EmptySince.Equal(rec.Since) || n.PowerDown {
		t.Errorf("released node: emptySince %v powerDown %v, want the release's %v and not yet", n.EmptySince, n.PowerDown, rec.Since)
	}
	if n := nodes["idle"]; n.EmptySince == nil || n.PowerDown || time.Since(*n.EmptySince) > time.Minute {
		t.Errorf("a node that never ran anything: emptySince %v powerDown %v, want its registration and not yet", n.EmptySince, n.PowerDown)
	}
	// 40 minutes on: both empty nodes may power down; the used one not.
	offset.Store(int64(40 * time.Minute)) // within the tokens' hour
	nodes = view(h)
	for _, name := range []string{"released", "idle"} {
		if n := nodes[name]; !n.PowerDown || n.EmptyFor == "" || n.PowerDownAfter != "30m0s" {
			t.Errorf("%s 40 minutes later: %+v, want powerDown", name, n.NodePower)
		}
	}
	if nodes["used"].PowerDown {
		t.Error("a node holding a session may power down")
	}
	// A restarted API reads the same from etcd.
	h2 := startHarness(t, h.cli, harnessOpts{powerDownAfter: 30 * time.Minute, now: clock})
	h2.waitFor("the restarted API's caches", func() bool { return caughtUp(h2) })
	again := view(h2)
	for _, name := range []string{"released", "idle", "used"} {
		a, b := nodes[name].EmptySince, again[name].EmptySince
		if (a == nil) != (b == nil) || (a != nil && !a.Equal(*b)) || again[name].PowerDown != nodes[name].PowerDown {
			t.Errorf("%s after a restart: emptySince %v powerDown %v, before %v %v", name, b, again[name].PowerDown, a, nodes[name].PowerDown)
		}
	}
	// The released node takes a session again: no longer empty.
	l := state.Ledger{Node: "released", Allocations: map[string]state.Allocation{"s2": {Owner: "ada", Role: state.RoleSingle, GPUs: []string{"GPU-released-1"}}}}
	if _, err := state.Put(ctx, h.cli, h.keys.Ledger("released"), l); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the released node in use again", func() bool { n := view(h)["released"]; return n.EmptySince == nil && !n.PowerDown })
}
