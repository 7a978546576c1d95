package main

import (
	"strings"
	"testing"
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
}
