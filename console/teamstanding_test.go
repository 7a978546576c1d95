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

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/state"
)

// TestTeamStandingInBrowser: the history page shows, in headless
// Chromium, a row per team with what it holds against its guarantee and
// its fair share, what it borrows or is owed, and the reclaims under way:
// team nlp (guarantee 2) holds 6 of the node's 8 GPUs, 4 borrowed, and
// gives 4 back (one session warned that vision reclaims them), all 6
// counted as A100s, the model vision's guarantee names; team
// vision (guarantee 4, 2 of them A100s) holds none, is owed 4 while its
// session waits, and takes 4 back; each team's fair share is 4. The bar
// of a team that borrows is drawn past its guarantee mark. The page is
// screenshotted.
func TestTeamStandingInBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		testreq.Missing(t, "chromium", "the browser test drives Debian's chromium: apt-get install -y chromium")
	}
	e := newEnv(t, etcdtest.New(t))
	root := e.token("root", "admin")
	ctx := context.Background()
	e.addNode("gpu-1", "NVIDIA A100", 8)
	for name, body := range map[string]string{
		"vision": `{"groups":["ada-lab"],"guarantee":{"gpus":4,"models":{"A100":2}}}`,
		"nlp":    `{"groups":["bob-lab"],"guarantee":{"gpus":2}}`,
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
	gpus := func(first, n int) []string {
		var out []string
		for i := first; i < first+n; i++ {
			out = append(out, fmt.Sprintf("GPU-gpu-1-%d", i))
		}
		return out
	}
	if _, err := state.Put(ctx, e.cli, e.keys.Ledger("gpu-1"), state.Ledger{Node: "gpu-1", Allocations: map[string]state.Allocation{
		"n1": {Owner: "bob", Team: "nlp", Role: state.RoleSingle, Preemptible: true, GPUs: gpus(0, 4), CPUMilli: 1000, MemoryMiB: 1024},
		"n2": {Owner: "bob", Team: "nlp", Role: state.RoleSingle, Preemptible: true, GPUs: gpus(4, 2), CPUMilli: 1000, MemoryMiB: 1024},
	}}); err != nil {
		t.Fatal(err)
	}
	var v api.SessionView
	e.postJSON("/api/v1/sessions", e.token("ada"), map[string]any{"kind": "batch", "image": "voyager/jupyter:latest", "command": []string{"true"},
		"resources": map[string]any{"gpus": 4, "cpuMilli": 1000, "memoryMiB": 1024}}, &v, http.StatusCreated)
	now := time.Now().UTC()
	if _, err := state.Put(ctx, e.cli, e.keys.Warning("n1"), state.Warning{Session: "n1", Reason: state.ReasonPreempted, By: v.ID, Reclaim: "vision",
		Node: "gpu-1", Issued: now, StopAt: now.Add(2 * time.Minute), Message: "preempted: team vision reclaims its guarantee"}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the reclaim in the standing", func() bool {
		return strings.Contains(e.get("/api/v1/teams", root).body, `"reclaimedSessions":1`)
	})

	bctx, eval := startBrowser(t, chromium, 1000)
	c, stop := context.WithTimeout(bctx, 60*time.Second)
	defer stop()
	if err := chromedp.Do(c, chromedp.Navigate(e.srv.URL+"/console/history"), chromedp.WaitVisible("#token"),
		chromedp.SetValue("#token", root), chromedp.Click("#signin-form button")); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.querySelector('#view').getAttribute('aria-busy') === 'false' && document.querySelector('#team-standing') !== null`,
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("history view: %v\n%s", err, eval("document.body.innerText"))
	}
	row := func(team string) string {
		return fmt.Sprintf(`(d => d ? [d.held, d.guarantee, d.fair, d.borrowed, d.owed, d.reclaimed, d.reclaiming].join(' ') : 'none')((document.querySelector('#team-standing tr[data-team=%q]') || {}).dataset)`, team)
	}
	text := func(team string) string {
		return fmt.Sprintf(`document.querySelector('#team-standing tr[data-team=%q]').innerText.replace(/\s+/g, ' ').trim()`, team)
	}
	// The held bar's right end against the guarantee mark.
	pastGuarantee := func(team string) string {
		return fmt.Sprintf(`(r => String(+r.querySelector('rect.held').getAttribute('x') + +r.querySelector('rect.held').getAttribute('width') > +r.querySelector('line.guarantee').getAttribute('x1')))(document.querySelector('#team-standing tr[data-team=%q]'))`, team)
	}
	for _, c := range []struct{ what, expr, want string }{
		{"nlp's numbers", row("nlp"), "6 2 4 4 0 4 0"},
		{"vision's numbers", row("vision"), "0 4 4 0 4 0 4"},
		{"nlp's row", text("nlp"), "nlp 6 (6 A100) 2 4 4 borrowed giving back 4 GPUs (1 session)"},
		{"vision's row", text("vision"), "vision 0 4 (2 A100) 4 owed 4 taking back 4 GPUs (1 session)"},
		{"nlp's bar passes its guarantee", pastGuarantee("nlp"), "true"},
		{"vision's bar does not", pastGuarantee("vision"), "false"},
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
	if err := os.WriteFile(filepath.Join(dir, "history-team-standing.png"), png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot in %s", dir)
}
