package api_test

import (
	"context"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// accrue records an ended attempt of a session of owner in team, as the
// usage accountant does, with its session and status in etcd.
func (h *harness) accrue(id, owner, team string, gpus int, from, to time.Time) {
	h.t.Helper()
	ctx := context.Background()
	if _, err := state.Put(ctx, h.cli, h.keys.Status(id), state.Status{Session: id, Phase: state.PhaseSucceeded, Bound: &from, Finished: &to, QueueRevision: 1}); err != nil {
		h.t.Fatal(err)
	}
	ok, err := state.Accrue(ctx, h.cli, h.keys, state.Accrual{Session: id, Owner: owner, Team: team, QueueRevision: 1, GPUs: gpus, Bound: from, Ended: to}, nil, to)
	if err != nil || !ok {
		h.t.Fatalf("accrue %s: %v %v", id, ok, err)
	}
}

// TestBudgetsRefuseQueueAndWarn: a team's budget counts the teams below
// it and refuses a create once spent, with the numbers and when it
// resets; a per-user budget with the "queue" action admits the create at
// the lowest priority; past 80 % the create is admitted with a Warning.
// The usage report shows the same numbers, the running attempts' time up
// to now included; users read only their own.
func TestBudgetsRefuseQueueAndWarn(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.addNode("gpu-1", "A100", 8)
	root := h.token("root", "admin")
	want(t, h.do("PUT", "/api/v1/teams/research", root, map[string]any{"guarantee": map[string]any{"gpus": 4}, "budget": map[string]any{"gpuHours": 10}}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/teams/vision", root, map[string]any{"parent": "research", "groups": []string{"cv"},
		"budget": map[string]any{"userGpuHours": 5, "action": "queue"}}), http.StatusOK)
	now := time.Now().UTC()
	month, next := api.PeriodStart(state.PeriodMonth, now)
	at := func(hours float64) time.Time { return month.Add(time.Duration(hours * float64(time.Hour))) }
	ada, bob := h.groupToken("ada", []string{"cv"}), h.groupToken("bob", []string{"cv"})

	h.accrue("s-a1", "ada", "vision", 2, at(0), at(2.5))                   // 5 GPU-h: ada's own budget spent
	h.accrue("s-b1", "bob", "vision", 1, at(0), at(2.5))                   // 2.5: half of bob's
	h.accrue("s-old", "bob", "vision", 8, month.Add(-10*time.Hour), month) // last month: not counted
	r := want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated)
	if s := decode[api.SessionView](t, r); s.Priority != -100 || s.Team != "vision" {
		t.Errorf("ada over her queue budget: priority %d team %q, want -100 in vision", s.Priority, s.Team)
	}
	if w := r.header.Get("Warning"); !strings.Contains(w, "ada in team vision has used 5.00 of its 5 GPU-hours this month (100%)") || !strings.Contains(w, "lowest priority (-100)") {
		t.Errorf("ada's warning %q", w)
	}
	r = want(t, h.do("POST", "/api/v1/sessions", bob, notebook()), http.StatusCreated)
	if w := r.header.Get("Warning"); w != "" {
		t.Errorf("bob at 75%% of research's budget was warned: %q", w)
	}
	h.accrue("s-c1", "cyd", "research", 1, at(1), at(2)) // research with vision: 8.5 of 10
	r = want(t, h.do("POST", "/api/v1/sessions", bob, notebook()), http.StatusCreated)
	if s := decode[api.SessionView](t, r); s.Priority != 0 {
		t.Errorf("bob's priority %d, want 0 (a warning changes nothing)", s.Priority)
	}
	if w := r.header.Get("Warning"); !strings.Contains(w, "team research (above team vision) has used 8.50 of its 10 GPU-hours this month (85%)") {
		t.Errorf("bob's warning at 85%%: %q", w)
	}
	h.accrue("s-c2", "cyd", "research", 2, at(2), at(3)) // 10.5 of 10
	p := want(t, h.do("POST", "/api/v1/sessions", bob, notebook()), http.StatusUnprocessableEntity).problem(t)
	wantMsg := "team research (above team vision) has used 10.50 of its 10 GPU-hours this month (105%); the budget resets at " + next.Format(time.RFC3339)
	if p.Title != "Over budget" || len(p.Errors) != 1 || p.Errors[0].Field != "team" || !strings.HasPrefix(p.Errors[0].Message, wantMsg) {
		t.Errorf("bob over research's budget: %s %+v\nwant %q", p.Title, p.Errors, wantMsg)
	}

	// A running attempt counts up to now.
	bound := now.Add(-30 * time.Minute)
	if bound.Before(month) {
		bound = month
	}
	live := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.groupToken("dan", nil), notebook()), http.StatusCreated))
	h.putStatus(state.Status{Session: live.ID, Phase: state.PhaseRunning, Bound: &bound, QueueRevision: 5})
	h.waitFor("the running status in the cache", func() bool {
		rep := decode[api.UsageReport](t, want(t, h.do("GET", "/api/v1/usage?user=dan", root, nil), http.StatusOK))
		return len(rep.Rows) == 1
	})
	rep := decode[api.UsageReport](t, want(t, h.do("GET", "/api/v1/usage?by=team,user", root, nil), http.StatusOK))
	got := map[string]float64{}
	for _, row := range rep.Rows {
		got[row.Team+"/"+row.User] = row.GPUHours
	}
	liveHours := time.Since(bound).Hours()
	for k, v := range map[string]float64{"vision/ada": 5, "vision/bob": 2.5, "research/cyd": 3, "-/dan": liveHours} {
		if math.Abs(got[k]-v) > 0.02 {
			t.Errorf("usage %s = %.4f GPU-h, want %.4f (rows %+v)", k, got[k], v, rep.Rows)
		}
	}
	if len(got) != 4 || !rep.From.Equal(month) || !rep.To.Equal(next) {
		t.Errorf("report %v to %v, rows %v", rep.From, rep.To, got)
	}
	// ada reads her own only; by day; the research subtree.
	mine := decode[api.UsageReport](t, want(t, h.do("GET", "/api/v1/usage?by=user,day", ada, nil), http.StatusOK))
	if len(mine.Rows) != 1 || mine.Rows[0].User != "ada" || mine.Rows[0].Day != state.DayOf(month) || mine.Rows[0].GPUSeconds != 5*3600 {
		t.Errorf("ada's own usage: %+v", mine.Rows)
	}
	want(t, h.do("GET", "/api/v1/usage?user=bob", ada, nil), http.StatusForbidden)
	sub := decode[api.UsageReport](t, want(t, h.do("GET", "/api/v1/usage?by=team&team=vision", root, nil), http.StatusOK))
	if len(sub.Rows) != 1 || sub.Rows[0].Team != "vision" || sub.Rows[0].GPUHours != 7.5 {
		t.Errorf("vision's usage: %+v", sub.Rows)
	}
	last := decode[api.UsageReport](t, want(t, h.do("GET", "/api/v1/usage?by=team&from="+state.DayOf(month.AddDate(0, 0, -1))+"&to="+state.DayOf(month), root, nil), http.StatusOK))
	if len(last.Rows) != 1 || last.Total.GPUHours != 80 {
		t.Errorf("the last day of last month: %+v", last)
	}
	// The team gauges.
	if _, err := state.Put(context.Background(), h.cli, h.keys.Ledger("gpu-1"), state.Ledger{Node: "gpu-1", Allocations: map[string]state.Allocation{
		live.ID: {Owner: "dan", Role: state.RoleSingle, GPUs: []string{"GPU-gpu-1-0"}, CPUMilli: 1000, MemoryMiB: 1024}}}); err != nil {
		t.Fatal(err)
	}
	h.waitFor("the team gauges", func() bool { return strings.Contains(gather(t, h.api), `voyager_team_gpus{team="-"} 1`) })
	m := gather(t, h.api)
	for _, line := range []string{`voyager_team_gpu_hours{team="vision"} 7.5`, `voyager_team_gpu_hours{team="research"} 3`,
		`voyager_team_budget_used_ratio{team="research"} 1.05`, `voyager_team_budget_gpu_hours{team="research"} 10`,
		`voyager_team_guarantee_gpus{team="research"} 4`, `voyager_team_gpus{team="vision"} 0`} {
		if !strings.Contains(m, line+"\n") {
			t.Errorf("metrics lack %s", line)
		}
	}
	for _, q := range []string{"period=year", "by=owner", "from=2026-13-01", "from=2026-11-02&to=2026-11-01", "period=month&from=2026-11-01"} {
		want(t, h.do("GET", "/api/v1/usage?"+q, root, nil), http.StatusUnprocessableEntity)
	}
}
