package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// TestTeamStandingShowsReclaim: on one 8-GPU node team nlp (guarantee 2)
// holds 6 GPUs, 4 of them borrowed; team vision (guarantee 4) holds
// nothing and waits for 4, and one of nlp's sessions (4 GPUs) is warned
// that vision reclaims them. GET /api/v1/teams says where each stands —
// vision's fair share 4 (its guarantee; nlp's 4: its 2 and the 2 left),
// owed 4, reclaiming 1 session of 4 GPUs; nlp holding 6, 4 borrowed, 1
// session of 4 GPUs being reclaimed — and /metrics exports the same
// numbers per team.
func TestTeamStandingShowsReclaim(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.addNode("gpu-1", "A100", 8)
	root := h.token("root", "admin")
	want(t, h.do("PUT", "/api/v1/teams/vision", root, map[string]any{"groups": []string{"cv"}, "guarantee": map[string]any{"gpus": 4}}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/teams/nlp", root, map[string]any{"groups": []string{"text"}, "guarantee": map[string]any{"gpus": 2}}), http.StatusOK)
	gpus := func(first, n int) []string {
		var out []string
		for i := first; i < first+n; i++ {
			out = append(out, "GPU-gpu-1-"+string(rune('0'+i)))
		}
		return out
	}
	ctx := context.Background()
	if _, err := state.Put(ctx, h.cli, h.keys.Ledger("gpu-1"), state.Ledger{Node: "gpu-1", Allocations: map[string]state.Allocation{
		"n1": {Owner: "bob", Team: "nlp", Role: state.RoleSingle, Preemptible: true, GPUs: gpus(0, 4), CPUMilli: 1000, MemoryMiB: 1024},
		"n2": {Owner: "bob", Team: "nlp", Role: state.RoleSingle, Preemptible: true, GPUs: gpus(4, 2), CPUMilli: 1000, MemoryMiB: 1024},
	}}); err != nil {
		t.Fatal(err)
	}
	four := notebook()
	four["resources"] = map[string]any{"gpus": 4, "cpuMilli": 4000, "memoryMiB": 16384}
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.groupToken("ada", []string{"cv"}), four), http.StatusCreated))
	now := time.Now().UTC()
	if _, err := state.Put(ctx, h.cli, h.keys.Warning("n1"), state.Warning{Session: "n1", Reason: state.ReasonPreempted, By: v.ID, Reclaim: "vision",
		Node: "gpu-1", Issued: now, StopAt: now.Add(2 * time.Minute), Message: "preempted: team vision reclaims its guarantee"}); err != nil {
		t.Fatal(err)
	}
	var st map[string]api.TeamStandingView
	h.waitFor("the standing with the reclaim", func() bool {
		list := decode[api.TeamList](t, want(t, h.do("GET", "/api/v1/teams", h.groupToken("bob", []string{"text"}), nil), http.StatusOK))
		st = map[string]api.TeamStandingView{}
		for _, s := range list.Standing {
			st[s.Team] = s
		}
		return st["nlp"].ReclaimedSessions == 1 && st["vision"].WaitingGPUs == 4
	})
	if s := st["vision"]; s.GuaranteeGPUs != 4 || s.FairShareGPUs != 4 || s.HeldGPUs != 0 || s.OwedGPUs != 4 || s.ReclaimingSessions != 1 || s.ReclaimingGPUs != 4 {
		t.Errorf("vision %+v, want guarantee 4, fair share 4, held 0, owed 4, reclaiming 1 session of 4 GPUs", s)
	}
	if s := st["nlp"]; s.GuaranteeGPUs != 2 || s.FairShareGPUs != 4 || s.HeldGPUs != 6 || s.BorrowedGPUs != 4 || s.ReclaimedGPUs != 4 {
		t.Errorf("nlp %+v, want guarantee 2, fair share 4, held 6, 4 borrowed, 4 GPUs reclaimed", s)
	}
	m := gather(t, h.api)
	for _, line := range []string{`voyager_team_fair_share_gpus{team="vision"} 4`, `voyager_team_fair_share_gpus{team="nlp"} 4`,
		`voyager_team_held_gpus{team="nlp"} 6`, `voyager_team_borrowed_gpus{team="nlp"} 4`, `voyager_team_owed_gpus{team="vision"} 4`,
		`voyager_team_reclaimed_gpus{team="nlp"} 4`, `voyager_team_reclaimed_gpus{team="vision"} 0`, `voyager_team_guarantee_gpus{team="vision"} 4`} {
		if !strings.Contains(m, line+"\n") {
			t.Errorf("metrics lack %s", line)
		}
	}
}
