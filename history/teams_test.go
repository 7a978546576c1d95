package history_test

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestCheckerFindsATeamOverItsMaximum: a history whose bind takes team
// org (maximum 1 GPU) to 2 GPUs through its team vision breaks
// team-over-max at that revision, on org's key; the bind before it (1 GPU)
// and lowering vision's own maximum to 0 under its holding break nothing,
// and neither does the release that follows.
func TestCheckerFindsATeamOverItsMaximum(t *testing.T) {
	cli := etcdtest.New(t)
	k := state.MustKeys("/teamsmax")
	one, zero := 1, 0
	inTeam := func(gpu string) state.Allocation {
		a := alloc(100, nil, gpu)
		a.Team = "vision"
		return a
	}
	start := write(t, cli, put{k.Node("n1"), node("n1")},
		put{k.Team("org"), state.Team{Name: "org", MaxGPUs: &one}}, put{k.Team("vision"), state.Team{Name: "vision", Parent: "org"}})
	write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": inTeam("GPU-n1-0")})}, put{k.Binding("n1", "s1"), bnd("s1", inTeam("GPU-n1-0"))})
	write(t, cli, put{k.Team("vision"), state.Team{Name: "vision", Parent: "org", MaxGPUs: &zero}})
	at := write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": inTeam("GPU-n1-0"), "s2": inTeam("GPU-n1-1")})},
		put{k.Binding("n1", "s2"), bnd("s2", inTeam("GPU-n1-1"))})
	write(t, cli, put{k.Ledger("n1"), ledger("n1", map[string]state.Allocation{"s1": inTeam("GPU-n1-0")})}, put{k.Binding("n1", "s2"), nil})
	end := write(t, cli, put{k.Profile("marker"), state.Profile{Name: "end"}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := history.Watch(ctx, cli, k, history.Options{Start: start, End: end})
	if err != nil {
		t.Fatal(err)
	}
	var got []history.Violation
	for _, v := range res.Violations {
		got = append(got, v)
	}
	// vision's own maximum (0) is broken by the same bind: it grew.
	if res.Last < end || len(got) != 2 {
		t.Fatalf("checked to %d (want %d); violations %v; want org's and vision's maxima broken once", res.Last, end, got)
	}
	keys := map[string]bool{}
	for _, v := range got {
		if v.Rule != history.RuleTeamOverMax || v.Revision != at {
			t.Errorf("violation %s; want rule %s at revision %d", v, history.RuleTeamOverMax, at)
		}
		keys[v.Key] = true
	}
	if !keys[k.Team("org")] || !keys[k.Team("vision")] {
		t.Errorf("violations on %v, want teams org and vision", keys)
	}
}
