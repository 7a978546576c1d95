package console_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/state"
)

// TestTeamUsageChartInBrowser: the history page charts GPU-hours per
// team per day in headless Chromium, each bar the day's GPU-hours, with
// the team's guarantee and budget lines; an admin sees every team's, a
// user her own. The page is screenshotted.
func TestTeamUsageChartInBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		testreq.Missing(t, "chromium", "the browser test drives Debian's chromium: apt-get install -y chromium")
	}
	e := newEnv(t, etcdtest.New(t))
	root := e.token("root", "admin")
	ctx := context.Background()
	for name, body := range map[string]string{
		"vision": `{"guarantee":{"gpus":2},"budget":{"gpuHours":3000,"period":"month"}}`,
		"nlp":    `{"guarantee":{"gpus":1}}`,
	} {
		req, _ := http.NewRequest("PUT", e.srv.URL+"/api/v1/teams/"+name, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+root)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("put team %s: %v %v", name, err, resp)
		}
		resp.Body.Close()
	}
	now := time.Now().UTC()
	today := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	accrue := func(id, owner, team string, gpus int, from time.Time, hours float64) {
		to := from.Add(time.Duration(hours * float64(time.Hour)))
		if _, err := state.Put(ctx, e.cli, e.keys.Status(id), state.Status{Session: id, Phase: state.PhaseSucceeded, Bound: &from, Finished: &to, QueueRevision: 1}); err != nil {
			t.Fatal(err)
		}
		if ok, err := state.Accrue(ctx, e.cli, e.keys, state.Accrual{Session: id, Owner: owner, Team: team, QueueRevision: 1, GPUs: gpus, Bound: from, Ended: to}, nil, to); err != nil || !ok {
			t.Fatalf("accrue %s: %v %v", id, ok, err)
		}
	}
	twoDaysAgo := today.AddDate(0, 0, -2)
	accrue("s-1", "ada", "vision", 4, twoDaysAgo.Add(time.Hour), 10)  // 40 GPU-hours two days ago
	accrue("s-2", "bob", "vision", 1, twoDaysAgo.Add(2*time.Hour), 8) // 8 more
	accrue("s-3", "cyd", "nlp", 2, today, 0.5)                        // 1 today

	bctx, eval := startBrowser(t, chromium, 1000)
	open := func(token string) {
		t.Helper()
		c, stop := context.WithTimeout(bctx, 60*time.Second)
		defer stop()
		if err := chromedp.Do(c, chromedp.Navigate(e.srv.URL+"/console/history"), chromedp.WaitVisible("#token"),
			chromedp.SetValue("#token", token), chromedp.Click("#signin-form button")); err != nil {
			t.Fatalf("sign in: %v", err)
		}
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.querySelector('#view').getAttribute('aria-busy') === 'false' && document.querySelector('#team-usage') !== null`,
			chromedp.WithPollingTimeout(30*time.Second))); err != nil {
			t.Fatalf("history view: %v\n%s", err, eval("document.body.innerText"))
		}
	}
	open(root)
	bar := func(team, day string) string {
		return fmt.Sprintf(`(document.querySelector('#team-usage figure[data-team=%q] rect[data-day=%q]') || {dataset: {hours: 'none'}}).dataset.hours`, team, day)
	}
	for _, c := range []struct{ what, expr, want string }{
		{"vision two days ago", bar("vision", state.DayOf(twoDaysAgo)), "48.000"},
		{"vision today", bar("vision", state.DayOf(today)), "0.000"},
		{"nlp today", bar("nlp", state.DayOf(today)), "1.000"},
		{"the bars of a team", `String(document.querySelectorAll('#team-usage figure[data-team="vision"] rect.bar').length)`, "14"},
		{"vision's guarantee line", `String(!!document.querySelector('#team-usage figure[data-team="vision"] line.guarantee'))`, "true"},
		{"vision's budget line", `String(!!document.querySelector('#team-usage figure[data-team="vision"] line.budget'))`, "true"},
		{"nlp has no budget line", `String(!!document.querySelector('#team-usage figure[data-team="nlp"] line.budget'))`, "false"},
		{"the 48-GPU-hour bar is the tallest", `String(Math.max(...[...document.querySelectorAll('#team-usage rect.bar')].map(r => +r.getAttribute('height'))) === +document.querySelector('#team-usage figure[data-team="vision"] rect[data-day="` + state.DayOf(twoDaysAgo) + `"]').getAttribute('height'))`, "true"},
	} {
		if got := eval(c.expr); got != c.want {
			t.Errorf("%s: %q, want %q", c.what, got, c.want)
		}
	}
	png, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	dir := t.ArtifactDir()
	if base := os.Getenv("VOYAGER_TEST_ARTIFACTS"); base != "" {
		dir = filepath.Join(base, t.Name())
		_ = os.MkdirAll(dir, 0o755)
	}
	if err := os.WriteFile(filepath.Join(dir, "history-team-usage.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot in %s", dir)

	// ada sees her own GPU-hours only.
	if _, err := chromedp.Run(bctx, chromedp.Evaluate[bool](`sessionStorage.clear(); true`)); err != nil {
		t.Fatal(err)
	}
	open(e.token("ada"))
	if got := eval(`[...document.querySelectorAll('#team-usage figure')].map(f => f.dataset.team + ':' + f.dataset.total).join(',')`); got != "vision:40.000" {
		t.Errorf("ada's chart: %q, want vision:40.000", got)
	}
}
