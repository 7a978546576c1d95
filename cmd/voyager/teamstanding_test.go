package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestCLITeamStanding: `voyager team list` shows where each team stands,
// as GET /api/v1/teams does: team nlp (guarantee 2) holds 6 of one node's
// 8 GPUs, 4 of them borrowed, and gives 4 back (one session warned that
// vision reclaims them); team vision (guarantee 4) holds none, is owed 4
// while its 4-GPU session waits, and takes 4 back. Fair shares: 4 each.
func TestCLITeamStanding(t *testing.T) {
	e := newCLIEnv(t)
	ctx := context.Background()
	n := state.Node{Name: "gpu-1", Address: "10.0.0.1", CPUMilli: 64000, MemoryMiB: 512 * 1024, Ports: state.PortRange{First: 40000, Last: 40999}, Simulated: true, Registered: time.Now().UTC()}
	for i := 0; i < 8; i++ {
		n.GPUs = append(n.GPUs, state.GPU{Index: i, UUID: "GPU-" + string(rune('0'+i)), Model: "NVIDIA A100", MemoryMiB: 81920, Healthy: true})
	}
	uuids := func(first, k int) []string {
		var out []string
		for i := first; i < first+k; i++ {
			out = append(out, n.GPUs[i].UUID)
		}
		return out
	}
	for key, v := range map[string]any{
		e.keys.Node("gpu-1"): n,
		e.keys.Ledger("gpu-1"): state.Ledger{Node: "gpu-1", Allocations: map[string]state.Allocation{
			"n1": {Owner: "bob", Team: "nlp", Role: state.RoleSingle, Preemptible: true, GPUs: uuids(0, 4), CPUMilli: 1000, MemoryMiB: 1024},
			"n2": {Owner: "bob", Team: "nlp", Role: state.RoleSingle, Preemptible: true, GPUs: uuids(4, 2), CPUMilli: 1000, MemoryMiB: 1024},
		}},
	} {
		if _, err := state.Put(ctx, e.cli, key, v); err != nil {
			t.Fatal(err)
		}
	}
	_, tok, _ := voyager(t, "token", "-sub", "root", "-admin")
	t.Setenv(envToken, strings.TrimSpace(tok))
	for _, args := range [][]string{
		{"team", "create", "vision", "--groups", "cv", "--guarantee", "4"},
		{"team", "create", "nlp", "--groups", "text", "--guarantee", "2"},
	} {
		if code, _, stderr := voyager(t, args...); code != 0 {
			t.Fatalf("%v: exit %d, %s", args, code, stderr)
		}
	}
	_, ada, _ := voyager(t, "token", "-sub", "ada", "-group", "cv")
	t.Setenv(envToken, strings.TrimSpace(ada))
	code, id, stderr := voyager(t, "session", "create", "--kind", "batch", "--gpus", "4", "-o", "name", "--", "true")
	if code != 0 {
		t.Fatalf("create: exit %d, %s", code, stderr)
	}
	now := time.Now().UTC()
	if _, err := state.Put(ctx, e.cli, e.keys.Warning("n1"), state.Warning{Session: "n1", Reason: state.ReasonPreempted, By: strings.TrimSpace(id), Reclaim: "vision",
		Node: "gpu-1", Issued: now, StopAt: now.Add(2 * time.Minute), Message: "preempted: team vision reclaims its guarantee"}); err != nil {
		t.Fatal(err)
	}
	fields := func(l string) string { return strings.Join(strings.Fields(l), " ") }
	want := func(out string) bool {
		lines := strings.Split(strings.TrimSpace(out), "\n")
		return len(lines) == 3 && strings.Contains(fields(lines[0]), "TEAM GUARANTEE HELD FAIR SHARE RECLAIM") &&
			strings.HasPrefix(fields(lines[1]), "nlp 2 GPUs 6 (4 borrowed) 4 giving back 4 GPUs (1 session) ") &&
			strings.HasPrefix(fields(lines[2]), "vision (yours) 4 GPUs 0 (owed 4) 4 taking back 4 GPUs (1 session) ")
	}
	// The API's caches take the warning and vision's waiting session in
	// their own time: poll until the list shows both, or the deadline.
	var out string
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, out, _ = voyager(t, "team", "list")
		if want(out) || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond) // polling the API's caches
	}
	if !want(out) {
		t.Errorf("team list:\n%s", out)
	}
}
