package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// fillNode writes node's ledger: one running session of owner on its
// first gpus GPUs, ending at the latest at ends (its max runtime).
func (h *harness) fillNode(node, id, owner string, gpus int, ends time.Time) {
	h.t.Helper()
	a := state.Allocation{Kind: state.KindBatch, Owner: owner, Role: state.RoleSingle, CPUMilli: 1000, MemoryMiB: 1024, Ends: ends}
	for i := range gpus {
		a.GPUs = append(a.GPUs, fmt.Sprintf("GPU-%s-%d", node, i))
	}
	if _, err := state.Put(context.Background(), h.cli, h.keys.Ledger(node), state.Ledger{Node: node, Allocations: map[string]state.Allocation{id: a}}); err != nil {
		h.t.Fatal(err)
	}
}

// TestQueueViewPlansWithOwnersRunTimes: gpu-1 runs carol's 8-GPU session
// for two more hours at most, gpu-2 dave's 7-GPU one for one more hour.
// bob asks for 1 GPU declaring a max runtime of 72 h, as each of his last
// four 1-GPU runs did, which ran 10 minutes each (runtimes/bob); then
// ada, past her hold delay, for 8. Ada's request holds gpu-2, which
// drains first. With run-time estimates the placers expect bob's session
// to end in 10 minutes, well before gpu-2 drains, so it backfills the
// held node, and the held request's reason says gpu-2's room is expected
// "by its sessions' max runtimes and their owners' recent run times":
// the queue view of an API given the same setting says the same. An API
// without it (today's view before the change, or the setting off) knows
// only bob's 72 hours, which would not backfill gpu-2: bob, a newcomer,
// claims its free GPU and starts at once (placer/claim.go), and ada's
// request holds gpu-1 instead, its room expected by max runtimes alone. A real placer with estimates then binds bob's session on gpu-2
// and writes ada's reason word for word as the view said it (the
// status adds her position).
func TestQueueViewPlansWithOwnersRunTimes(t *testing.T) {
	plan := placer.PlanOptions{ReserveAfter: 80 * time.Millisecond} // 8 GPUs: ada may hold after 10 ms
	h := newHarness(t, harnessOpts{runtimeEstimates: true, plan: plan})
	h.addNode("gpu-1", "A100", 8)
	h.addNode("gpu-2", "A100", 8)
	now := time.Now().UTC()
	drains := now.Add(time.Hour).Truncate(time.Minute)
	h.fillNode("gpu-1", "s-carol", "carol", 8, now.Add(2*time.Hour))
	h.fillNode("gpu-2", "s-dave", "dave", 7, drains)
	rec := state.RuntimeRecord{Owner: "bob", Updated: now}
	for i := range state.EstimateOver {
		rec.Add(state.RuntimeSample{Session: fmt.Sprintf("s-bob-%d", i), QueueRevision: 1, GPUs: 1, Seconds: 600,
			Declared: int64(72 * time.Hour / time.Second), Ended: now.Add(time.Duration(i-state.EstimateOver) * time.Hour)})
	}
	if est := rec.Estimate(1); est != 10*time.Minute {
		t.Fatalf("bob's record estimates %v for 1 GPU, want 10m", est)
	}
	if _, err := state.Put(context.Background(), h.cli, h.keys.Runtimes("bob"), rec); err != nil {
		t.Fatal(err)
	}

	one := notebook()
	one["kind"] = "batch"
	one["command"] = []string{"python", "sweep.py"}
	one["limits"] = map[string]any{"maxRuntime": "72h"}
	bob := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.token("bob"), one), http.StatusCreated))
	eight := notebook()
	eight["resources"] = map[string]any{"gpus": 8, "cpuMilli": 4000, "memoryMiB": 16384}
	ada := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.token("ada"), eight), http.StatusCreated))
	time.Sleep(plan.ReserveAfter) // both past their hold delays

	root := h.token("root", "admin")
	held := func(node string, at time.Time, how string) string {
		return fmt.Sprintf("node %s (0 of 8 GPUs free, the rest draining as its sessions end, room expected by %s UTC by %s)", node, at.Format("15:04"), how)
	}
	withEstimates := held("gpu-2", drains, "its sessions' max runtimes and their owners' recent run times")
	byBounds := held("gpu-1", now.Add(2*time.Hour).Truncate(time.Minute), "its sessions' max runtimes")
	// view waits for the view's entries of bob and ada, once ada's reason
	// says what to: the API's caches of the queue and of runtimes/ catch
	// up on their own watches. A view that never plans with bob's run
	// times times out here.
	view := func(h *harness, what string) (bobs, adas api.QueueEntry) {
		t.Helper()
		h.waitFor("ada's reason to say "+what, func() bool {
			q := decode[api.QueueView](t, want(t, h.do("GET", "/api/v1/queue", root, nil), http.StatusOK))
			for _, e := range q.Items {
				switch e.Session {
				case bob.ID:
					bobs = e
				case ada.ID:
					adas = e
				}
			}
			return strings.Contains(adas.Message, what)
		})
		return bobs, adas
	}

	bobs, adas := view(h, withEstimates)
	if bobs.Reason != "Placing" || !strings.Contains(adas.Message, "held for it") {
		t.Errorf("with estimates: bob's %q (%s), ada's %q (%s); want bob's placed and ada's holding gpu-2", bobs.Reason, bobs.Message, adas.Reason, adas.Message)
	}
	off := startHarness(t, h.cli, harnessOpts{plan: plan})
	bobsOff, adasOff := view(off, byBounds)
	if bobsOff.Reason != "Placing" || strings.Contains(adasOff.Message, "recent run times") {
		t.Errorf("without estimates: bob's %q, ada's %q; want bob placed on gpu-2 and ada's room on gpu-1 expected by max runtimes alone", bobsOff.Reason, adasOff.Message)
	}

	// A real placer with estimates does what the view said.
	runPlacer(t, h.cli, placer.Config{Keys: h.keys, Plan: plan, RuntimeEstimates: true})
	h.waitFor("the placer to bind bob's session and give ada's reason", func() bool {
		l, _, err := state.Get[state.Ledger](context.Background(), h.cli, h.keys.Ledger("gpu-2"))
		if err != nil {
			return false
		}
		if a, ok := l.Allocations[bob.ID]; !ok || a.Expects == nil {
			return false
		}
		st, _, err := state.Get[state.Status](context.Background(), h.cli, h.keys.Status(ada.ID))
		// The view gives her position apart; the status adds it.
		return err == nil && strings.HasPrefix(st.Message, adas.Message+"; ")
	})
	if _, _, err := state.Get[state.QueueEntry](context.Background(), h.cli, h.keys.Pending(ada.ID)); err != nil {
		t.Fatalf("ada's request: %v, want it still queued", err)
	}
}
