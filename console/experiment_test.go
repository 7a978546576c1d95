package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/browsertest"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/state"
)

// postJSON sends a JSON body to the API as token and decodes the answer
// into out, failing unless it is code.
func (e *env) postJSON(path, token string, body, out any, code int) {
	e.t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", e.srv.URL+path, strings.NewReader(string(b)))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != code {
		var p api.Problem
		_ = json.NewDecoder(resp.Body).Decode(&p)
		e.t.Fatalf("POST %s: %d %+v; want %d", path, resp.StatusCode, p, code)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			e.t.Fatal(err)
		}
	}
}

// TestSessionsPageShowsExperimentsInBrowser renders "My sessions" in a
// headless Chromium for a user with a three-node job (running, its ranks
// on three nodes), an element of a job array, and the array itself: the
// job's row names each rank's node, every row its /dev/shm and volumes,
// the element's row its array and index with a link to the array's row,
// and the arrays table counts the array's elements. Another user's page
// shows none of it.
func TestSessionsPageShowsExperimentsInBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		testreq.Missing(t, "chromium", "the browser test drives Debian's chromium: apt-get install -y chromium")
	}
	e := newEnv(t, etcdtest.New(t))
	for _, n := range []string{"pt-n1", "pt-n2", "pt-n3"} {
		e.addNode(n, "NVIDIA A100-SXM4-80GB", 8)
	}
	ada := e.token("ada")
	ctx := context.Background()
	if _, err := state.Put(ctx, e.cli, e.keys.Volume("pt-data"), state.Volume{Name: "pt-data", HostPath: "/srv/data", ReadOnly: true, Updated: time.Now().UTC()}); err != nil {
		t.Fatal(err)
	}

	// The job, through the API; its placer and agents are played by
	// writing the status they would.
	var job api.SessionView
	e.postJSON("/api/v1/sessions", ada, map[string]any{"kind": "batch", "nodes": 3, "command": []string{"torchrun", "train.py"},
		"resources": map[string]any{"gpus": 8, "cpuMilli": 8000, "memoryMiB": 65536}, "shmMiB": 16384,
		"volumes": []any{map[string]any{"name": "pt-data", "mountPath": "/data"}}}, &job, http.StatusCreated)
	now := time.Now().UTC()
	st := state.Status{Session: job.ID, Phase: state.PhaseRunning, Message: "all 3 parts running", Nodes: []string{"pt-n2", "pt-n1", "pt-n3"}, Created: now, Updated: now, Started: &now}
	if _, err := state.Put(ctx, e.cli, e.keys.Status(job.ID), st); err != nil {
		t.Fatal(err)
	}
	// The array, through the API, and its first element written as the
	// array controller (not running here) writes one.
	var arr api.ArrayView
	e.postJSON("/api/v1/arrays", ada, map[string]any{"kind": "batch", "command": []string{"python", "train.py", "--seed", "{index}"},
		"indices": "0-9", "maxRunning": 2}, &arr, http.StatusCreated)
	el := state.Session{ID: state.ElementID(arr.ID, 0), Owner: "ada", Kind: state.KindBatch, Command: []string{"python", "train.py", "--seed", "0"},
		Resources: state.Resources{CPUMilli: 1000, MemoryMiB: 4096}, ShmMiB: 2048, Desired: state.DesiredRunning, Created: now,
		Array: &state.ArrayMember{ID: arr.ID, Index: 0}}
	if _, err := state.CreateSession(ctx, e.cli, e.keys, el, now); err != nil {
		t.Fatal(err)
	}
	rec, _, err := state.Get[state.Array](ctx, e.cli, e.keys.Array(arr.ID))
	if err != nil {
		t.Fatal(err)
	}
	rec.Next = 1
	if _, err := state.Put(ctx, e.cli, e.keys.Array(arr.ID), rec); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the job running in the API's view", func() bool {
		return strings.Contains(e.get("/api/v1/sessions/"+job.ID, ada).body, `"phase":"Running"`)
	})

	bctx := browsertest.Start(t, chromium, 800, 600) // for the test's whole life
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		c, stop := context.WithTimeout(bctx, 60*time.Second)
		defer stop()
		if err := chromedp.Do(c, steps...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(expr string) string {
		t.Helper()
		v, err := chromedp.Run(bctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
	open := func(token string) {
		t.Helper()
		run("sign in", chromedp.Navigate(e.srv.URL+"/console/sessions"), chromedp.WaitVisible("#token"),
			chromedp.SetValue("#token", token), chromedp.Click("#signin-form button"))
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.querySelector('#view').getAttribute('aria-busy') === 'false' && document.querySelector('#sessions') !== null`,
			chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			t.Fatalf("sessions view: %v\n%s", err, text("document.body.innerText"))
		}
	}
	open(ada)
	row := func(id string) string {
		return fmt.Sprintf(`document.querySelector('#sessions tr[data-session=%q]')`, id)
	}
	for _, c := range []struct{ what, expr, want string }{
		{"the job's ranks", row(job.ID) + `.querySelector('[data-field=parts]').innerText`, "3 nodes: rank 0 on pt-n2, rank 1 on pt-n1, rank 2 on pt-n3"},
		{"the job's shm and volume", row(job.ID) + `.querySelector('[data-field=resources]').innerText`, "/dev/shm 16384 MiB · pt-data at /data (read-only)"},
		{"the element's array", row(el.ID) + `.querySelector('[data-field=array]').innerText`, "element 0 of array " + arr.ID},
		{"the element's link to its array", row(el.ID) + `.querySelector('[data-field=array] a').getAttribute('href')`, "#array-" + arr.ID},
		{"the element's shm", row(el.ID) + `.querySelector('[data-field=resources]').innerText`, "/dev/shm 2048 MiB"},
		{"the array's row", fmt.Sprintf(`document.querySelector('#arrays tr[data-array=%q]').innerText.replace(/\s+/g, ' ').trim()`, arr.ID),
			arr.ID + " 0-9 2 0 0 0 1 9 1 of 10 created"},
		{"the array's anchor", fmt.Sprintf(`document.querySelector('#array-%s').dataset.array`, arr.ID), arr.ID},
	} {
		if got := text(c.expr); got != c.want {
			t.Errorf("%s: %q; want %q", c.what, got, c.want)
		}
	}

	// Another user: none of ada's sessions or arrays.
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`sessionStorage.clear(); true`)); err != nil {
		t.Fatal(err)
	}
	open(e.token("bob"))
	if body := text("document.body.innerText"); strings.Contains(body, job.ID) || strings.Contains(body, arr.ID) || !strings.Contains(body, "No arrays.") {
		t.Errorf("bob's sessions page shows ada's job or array, or not his empty arrays table:\n%s", body)
	}
}
