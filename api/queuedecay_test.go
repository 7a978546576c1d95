package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// TestQueueViewPlansWithDecayedUsage: teams vision and nlp hold nothing
// and are guaranteed nothing; nlp used 40 GPU-hours yesterday, vision
// none. On a node of 2 GPUs, bob (nlp) asked for 2 GPUs before ada
// (vision) did. With a half-life the placers order vision first (nlp's
// decayed usage adds to its share), and so does the queue view of an API
// given the same half-life: ada's request is the one placed, bob's waits
// first in line. An API without the half-life (today's view before the
// change) shows the opposite, which a real placer run with the half-life
// then contradicts: it binds ada's session and leaves bob's waiting.
func TestQueueViewPlansWithDecayedUsage(t *testing.T) {
	const halfLife = 24 * time.Hour
	h := newHarness(t, harnessOpts{usageHalfLife: halfLife})
	h.addNode("gpu-1", "A100", 2)
	root := h.token("root", "admin")
	want(t, h.do("PUT", "/api/v1/teams/vision", root, map[string]any{"groups": []string{"cv"}}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/teams/nlp", root, map[string]any{"groups": []string{"text"}}), http.StatusOK)
	day := time.Now().UTC().Add(-30 * time.Hour)
	h.accrue("old-nlp", "carol", "nlp", 4, day, day.Add(10*time.Hour))

	two := notebook()
	two["resources"] = map[string]any{"gpus": 2, "cpuMilli": 4000, "memoryMiB": 16384}
	bob := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.groupToken("bob", []string{"text"}), two), http.StatusCreated))
	ada := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.groupToken("ada", []string{"cv"}), two), http.StatusCreated))
	if bob.Team != "nlp" || ada.Team != "vision" {
		t.Fatalf("teams: bob %q, ada %q", bob.Team, ada.Team)
	}
	// order is the sessions in the view's order, with their positions,
	// once the view holds both and puts first first: the API's caches of
	// the queue and of gpuhours/ catch up on their own watches, so an
	// early view may not have seen nlp's usage yet. A view that never
	// plans with it times out here.
	order := func(h *harness, first string) []api.QueueEntry {
		var q api.QueueView
		h.waitFor("both requests in the queue view, "+first+" first", func() bool {
			q = decode[api.QueueView](t, want(t, h.do("GET", "/api/v1/queue", root, nil), http.StatusOK))
			return len(q.Items) == 2 && q.Items[0].Session == first
		})
		return q.Items
	}
	check := func(name string, items []api.QueueEntry, first, second string) {
		t.Helper()
		if items[0].Session != first || items[0].Position != 0 || items[0].Reason != "Placing" ||
			items[1].Session != second || items[1].Position != 1 || items[1].Reason != "Capacity" {
			t.Errorf("%s: queue view %+v, want %s placed (position 0) and %s waiting first in line", name, items, first, second)
		}
	}
	check("with the half-life", order(h, ada.ID), ada.ID, bob.ID)
	check("without the half-life", order(startHarness(t, h.cli, harnessOpts{}), bob.ID), bob.ID, ada.ID)

	// A real placer with the same half-life binds what the view said,
	// even when its list of gpuhours/ comes a second after the queue's:
	// it plans no pass before it has the usage.
	late := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if r, ok := req.(*etcdserverpb.RangeRequest); ok && strings.HasPrefix(string(r.Key), h.keys.GPUHoursDir()) {
			time.Sleep(time.Second)
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	pcli, err := clientv3.New(clientv3.Config{Endpoints: h.cli.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(late)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pcli.Close() })
	runPlacer(t, pcli, placer.Config{Keys: h.keys, UsageHalfLife: halfLife})
	h.waitFor("the placer's bind", func() bool {
		st, _, err := state.Get[state.Status](context.Background(), h.cli, h.keys.Status(ada.ID))
		if err == nil && st.Phase == state.PhaseBound {
			return true
		}
		st, _, err = state.Get[state.Status](context.Background(), h.cli, h.keys.Status(bob.ID))
		if err == nil && st.Phase == state.PhaseBound {
			t.Fatalf("the placer bound bob's session, not ada's: the view did not plan as it does")
		}
		return false
	})
	if _, _, err := state.Get[state.QueueEntry](context.Background(), h.cli, h.keys.Pending(bob.ID)); err != nil {
		t.Fatalf("bob's request: %v, want it still queued", err)
	}
}
