package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// TestCLITeams: `voyager team` defines a tree (admins only), refuses an
// invalid one with the reason and exit 1, lists it in tree order marking
// the caller's team; `session create --team` and --priority meet the
// team's ceiling.
func TestCLITeams(t *testing.T) {
	newCLIEnv(t)
	loginAs(t, "ada")
	if code, _, stderr := voyager(t, "team", "create", "research", "--guarantee", "8"); code != 1 || !strings.Contains(stderr, "admin") {
		t.Errorf("a user defined a team: exit %d, %s", code, stderr)
	}
	_, tok, _ := voyager(t, "token", "-sub", "root", "-admin")
	t.Setenv(envToken, strings.TrimSpace(tok))
	for _, args := range [][]string{
		{"team", "create", "research", "--guarantee", "8", "--max-priority", "50", "--budget", "1000", "--over-budget", "queue"},
		{"team", "create", "vision", "--parent", "research", "--groups", "cv", "--guarantee", "6", "--guarantee-model", "NVIDIA A100=4", "--weight", "2"},
	} {
		if code, out, stderr := voyager(t, args...); code != 0 || !strings.HasPrefix(out, "team "+args[2]+": guarantee") {
			t.Fatalf("%v: exit %d, %q, %s", args, code, out, stderr)
		}
	}
	code, _, stderr := voyager(t, "team", "create", "nlp", "--parent", "research", "--guarantee", "3")
	if code != 1 || !strings.Contains(stderr, "its teams (nlp, vision) are guaranteed 9 GPUs together, more than its own 8") {
		t.Errorf("over-guarantee: exit %d, %s", code, stderr)
	}
	if code, _, stderr := voyager(t, "team", "create", "nlp", "--guarantee-model", "A100"); code != 2 || !strings.Contains(stderr, "invalid --guarantee-model") {
		t.Errorf("bad --guarantee-model: exit %d, %s", code, stderr)
	}
	_, tok, _ = voyager(t, "token", "-sub", "cyd", "-group", "cv")
	t.Setenv(envToken, strings.TrimSpace(tok))
	code, out, _ := voyager(t, "team", "list")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[1], "research ") || !strings.HasPrefix(lines[2], "research/vision (yours)") ||
		!strings.Contains(lines[2], "6 GPUs (4 NVIDIA A100)") || !strings.Contains(lines[1], "1000 GPU-h a month, then queued last") {
		t.Errorf("team list: exit %d\n%s", code, out)
	}
	if code, out, _ := voyager(t, "team", "list", "-o", "name"); code != 0 || out != "research\nvision\n" {
		t.Errorf("team list -o name: %q", out)
	}
	code, _, stderr = voyager(t, "session", "create", "--kind", "batch", "--priority", "60", "--", "true")
	if code != 1 || !strings.Contains(stderr, "priority: got 60, above 50, the maximum team vision inherits from team research") {
		t.Errorf("priority over the ceiling: exit %d, %s", code, stderr)
	}
	code, id, stderr := voyager(t, "session", "create", "--kind", "batch", "--priority", "50", "--team", "vision", "-o", "name", "--", "true")
	if code != 0 {
		t.Fatalf("create in vision: exit %d, %s", code, stderr)
	}
	if code, out, _ := voyager(t, "session", "get", strings.TrimSpace(id), "-o", "json"); code != 0 || !strings.Contains(out, `"team": "vision"`) {
		t.Errorf("session get: exit %d\n%s", code, out)
	}
	// Delete: a user may not; an admin may delete a team with none below
	// it, not one with teams below it.
	if code, _, stderr := voyager(t, "team", "rm", "vision"); code != 1 || !strings.Contains(stderr, "admin") {
		t.Errorf("a user deleted a team: exit %d, %s", code, stderr)
	}
	_, tok, _ = voyager(t, "token", "-sub", "root", "-admin")
	t.Setenv(envToken, strings.TrimSpace(tok))
	if code, _, stderr := voyager(t, "team", "delete", "research"); code != 1 {
		t.Errorf("deleted a team with a team below it: exit %d, %s", code, stderr)
	}
	if code, out, stderr := voyager(t, "team", "delete", "vision"); code != 0 || out != "team vision: deleted\n" {
		t.Errorf("team delete vision: exit %d, %q, %s", code, out, stderr)
	}
}

// TestCLIUsageAndBudgetWarning: `voyager usage` prints the GPU-hours as a
// table with a total, as CSV, and refuses an unknown -o; a create past
// 80 % of the team's budget prints the API's warning on stderr.
func TestCLIUsageAndBudgetWarning(t *testing.T) {
	e := newCLIEnv(t)
	_, tok, _ := voyager(t, "token", "-sub", "root", "-admin")
	t.Setenv(envToken, strings.TrimSpace(tok))
	if code, _, stderr := voyager(t, "team", "create", "vision", "--groups", "cv", "--budget", "10"); code != 0 {
		t.Fatalf("team create: %s", stderr)
	}
	ctx := context.Background()
	now := time.Now().UTC()
	month, _ := api.PeriodStart(state.PeriodMonth, now)
	for i, u := range []struct {
		owner string
		gpus  int
		hours float64
	}{{"ada", 2, 3}, {"bob", 1, 2.5}, {"ada", 1, 3}} {
		id := fmt.Sprintf("s-u%d", i)
		from, to := month, month.Add(time.Duration(u.hours*float64(time.Hour)))
		if _, err := state.Put(ctx, e.cli, e.keys.Status(id), state.Status{Session: id, Phase: state.PhaseSucceeded, Bound: &from, Finished: &to, QueueRevision: 1}); err != nil {
			t.Fatal(err)
		}
		if ok, err := state.Accrue(ctx, e.cli, e.keys, state.Accrual{Session: id, Owner: u.owner, Team: "vision", QueueRevision: 1, GPUs: u.gpus, Bound: from, Ended: to}, nil, to); err != nil || !ok {
			t.Fatalf("accrue: %v %v", ok, err)
		}
	}
	code, out, stderr := voyager(t, "usage")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if code != 0 || len(lines) != 5 || !strings.HasPrefix(lines[1], "TEAM") ||
		strings.Join(strings.Fields(lines[2]), " ") != "vision ada 9.000 32400.000" ||
		strings.Join(strings.Fields(lines[3]), " ") != "vision bob 2.500 9000.000" ||
		strings.Join(strings.Fields(lines[4]), " ") != "TOTAL 11.500 41400.000" {
		t.Errorf("voyager usage: exit %d %s\n%s", code, stderr, out)
	}
	if code, out, _ := voyager(t, "usage", "--by", "user", "-o", "csv"); code != 0 || out != "user,gpu_hours,gpu_seconds\nada,9.000,32400.000\nbob,2.500,9000.000\n" {
		t.Errorf("voyager usage -o csv: exit %d\n%s", code, out)
	}
	if code, _, stderr := voyager(t, "usage", "-o", "yaml"); code != 2 || !strings.Contains(stderr, "want table, json or csv") {
		t.Errorf("voyager usage -o yaml: exit %d %s", code, stderr)
	}
	// 11.5 of 10 GPU-hours: bob's create is refused; at 9 of 12, warned.
	_, tok, _ = voyager(t, "token", "-sub", "bob", "-group", "cv")
	t.Setenv(envToken, strings.TrimSpace(tok))
	if code, _, stderr := voyager(t, "session", "create", "--kind", "batch", "--", "true"); code != 1 || !strings.Contains(stderr, "team vision has used 11.50 of its 10 GPU-hours this month") {
		t.Errorf("over budget: exit %d %s", code, stderr)
	}
	_, tok, _ = voyager(t, "token", "-sub", "root", "-admin")
	t.Setenv(envToken, strings.TrimSpace(tok))
	voyager(t, "team", "create", "vision", "--groups", "cv", "--budget", "12")
	_, tok, _ = voyager(t, "token", "-sub", "bob", "-group", "cv")
	t.Setenv(envToken, strings.TrimSpace(tok))
	if code, _, stderr := voyager(t, "session", "create", "--kind", "batch", "--", "true"); code != 0 || !strings.Contains(stderr, "warning: team vision has used 11.50 of its 12 GPU-hours this month (96%)") {
		t.Errorf("past 80%%: exit %d, stderr %q", code, stderr)
	}
}
