package main

import (
	"bufio"
	"context"
	"encoding/json"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/lifecycle"
	"github.com/voyager-gpu/voyager/state"
)

// TestTeamsUsageE2E, on `voyager dev` with real containers: a user of a
// team cannot set a priority above the team's maximum (an admin can);
// her batch jobs run and end, retention moves them to the history file,
// and `voyager usage` agrees with the history file to the second (GPUs
// × (finished − bound) of every retired attempt); a budget below what was
// used refuses the next create with the numbers.
func TestTeamsUsageE2E(t *testing.T) {
	needBinary(t)
	history := filepath.Join(t.TempDir(), "history.jsonl")
	env, environ, dev := devWithAgent(t, "voyager-usage-e2e", "usage-e2e",
		"VOYAGER_AGENT_PORTS=43300-43399", "VOYAGER_RETENTION=1m", "VOYAGER_HISTORY_FILE="+history)
	base := "http://" + env.httpAddr
	admin := lcAPI{t: t, base: base, token: binaryToken(t, environ, "-sub", "root", "-role", "admin")}
	ada := lcAPI{t: t, base: base, token: binaryToken(t, environ, "-sub", "ada", "-group", "cv")}
	if code, b := admin.do("PUT", "/api/v1/teams/vision", map[string]any{"groups": []string{"cv"}, "maxPriority": 10}); code != http.StatusOK {
		t.Fatalf("put team: %d %s", code, b)
	}
	job := func(gpus int, secs string, prio int) map[string]any {
		return map[string]any{"kind": "batch", "priority": prio, "resources": map[string]any{"gpus": gpus, "cpuMilli": 100, "memoryMiB": 64},
			"command": []string{"sh", "-c", "sleep " + secs}}
	}
	if code, b := ada.do("POST", "/api/v1/sessions", job(1, "1", 50)); code != http.StatusUnprocessableEntity || !strings.Contains(string(b), "got 50, above 10, team vision's maximum") {
		t.Fatalf("ada's priority 50: %d %s", code, b)
	}
	ids := []string{ada.create(job(1, "3", 10)), ada.create(job(2, "2", 0)), admin.create(job(1, "1", 50))}
	cli := etcdClient(t, env.clientAddr)
	k := state.MustKeys(state.DefaultPrefix)

	// Every job ends, then leaves etcd for the history file (retention:
	// a minute after it ended, swept every minute).
	deadline := time.Now().Add(4 * time.Minute)
	for _, id := range ids {
		for {
			resp, err := cli.Get(context.Background(), k.Status(id))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.Kvs) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s still in etcd after 4 minutes: %s\ndev stderr:\n%s", id, resp.Kvs[0].Value, dev.stderr())
			}
			time.Sleep(500 * time.Millisecond) // polling for retention, bounded by deadline
		}
	}
	want := map[string]float64{} // team/user → GPU-seconds, from the history file
	f, err := os.Open(history)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var r lifecycle.HistoryRecord
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil || r.Session.ID == "" || seen[r.Session.ID] {
			continue
		}
		seen[r.Session.ID] = true
		if r.Status.Phase != state.PhaseSucceeded || r.Status.Bound == nil || r.Status.Finished == nil {
			t.Errorf("history of %s: %+v, want Succeeded with its bound and finish times", r.Session.ID, r.Status)
			continue
		}
		team := r.Session.Team
		if team == "" {
			team = "-"
		}
		want[team+"/"+r.Session.Owner] += float64(state.SessionGPUs(r.Session)) * r.Status.Finished.Sub(*r.Status.Bound).Seconds()
	}
	if len(seen) != 3 || len(want) != 2 {
		t.Fatalf("history holds %d sessions (%v), want 3 of vision/ada and -/root", len(seen), want)
	}
	cmd := exec.Command(binary, "usage", "--by", "team,user", "-o", "json")
	cmd.Env = append(environ, "VOYAGER_URL="+base, "VOYAGER_TOKEN="+admin.token)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("voyager usage: %v\n%s", err, out)
	}
	var rep api.UsageReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("voyager usage -o json: %v\n%s", err, out)
	}
	got := map[string]float64{}
	for _, row := range rep.Rows {
		got[row.Team+"/"+row.User] = row.GPUSeconds
	}
	for key, secs := range want {
		if math.Abs(got[key]-secs) >= 1 || secs < 1 {
			t.Errorf("voyager usage says %s used %.3f GPU-seconds, the history file %.3f", key, got[key], secs)
		}
	}
	t.Logf("GPU-seconds, voyager usage %v, history file %v", got, want)
	cmd = exec.Command(binary, "usage", "--by", "team", "-o", "csv")
	cmd.Env = append(environ, "VOYAGER_URL="+base, "VOYAGER_TOKEN="+ada.token)
	if out, err := cmd.Output(); err != nil || !strings.HasPrefix(string(out), "team,gpu_hours,gpu_seconds\nvision,") {
		t.Errorf("ada's voyager usage -o csv: %v\n%s", err, out)
	}

	// A budget below what vision used: the next create is refused.
	if code, b := admin.do("PUT", "/api/v1/teams/vision", map[string]any{"groups": []string{"cv"}, "maxPriority": 10, "budget": map[string]any{"gpuHours": 0.001}}); code != http.StatusOK {
		t.Fatalf("put budget: %d %s", code, b)
	}
	code, b := ada.do("POST", "/api/v1/sessions", job(1, "1", 0))
	if code != http.StatusUnprocessableEntity || !strings.Contains(string(b), "team vision has used") || !strings.Contains(string(b), "of its 0.001 GPU-hours this month") {
		t.Fatalf("ada over vision's budget: %d %s", code, b)
	}
}
