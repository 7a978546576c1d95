package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/voyager-gpu/voyager/internal/browsertest"
	"github.com/voyager-gpu/voyager/internal/testreq"
)

// browserTab is one tab of a headless Chromium, driven over the DevTools
// protocol.
type browserTab struct {
	t    *testing.T
	ctx  context.Context
	name string
}

// newBrowser starts Debian's Chromium headless for the test and returns
// its first tab. Without Chromium the test is skipped, saying how to
// install it (a failure where testreq.Env requires it).
func newBrowser(t *testing.T, name string) *browserTab {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		testreq.Missing(t, "chromium", "the browser test drives Debian's chromium: apt-get install -y chromium")
	}
	return &browserTab{t: t, ctx: browsertest.Start(t, path, 1366, 900), name: name}
}

// tab opens another tab of the same browser: its own sessionStorage, so
// its own sign-in.
func (b *browserTab) tab(name string) *browserTab {
	ctx, cancel := chromedp.NewContext(b.ctx)
	b.t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		b.t.Fatalf("open tab %s: %v", name, err)
	}
	return &browserTab{t: b.t, ctx: ctx, name: name}
}

func (b *browserTab) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %s: %v", b.name, what, err)
	}
}

// js evaluates expr in the page and returns its value.
func js[T any](b *browserTab, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("%s: evaluate %s: %v", b.name, expr, err)
	}
	return v
}

// waitJS waits until expr is true in the page.
func (b *browserTab) waitJS(what, expr string, within time.Duration) {
	b.t.Helper()
	if _, err := chromedp.Run(b.ctx, chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(within), chromedp.WithPollingInterval(50*time.Millisecond))); err != nil {
		b.t.Fatalf("%s: %s: not within %s (%v); page text:\n%s", b.name, what, within, err, js[string](b, "document.body.innerText"))
	}
}

// open navigates to url and waits for its view.
func (b *browserTab) open(url string) {
	b.t.Helper()
	b.do("open "+url, chromedp.Navigate(url))
	b.waitJS("view of "+url, `document.querySelector('#view').getAttribute('aria-busy') === 'false'`, 30*time.Second)
	b.labelled()
}

// labelled fails the test if a field of the page has no label: every
// input, select and textarea must be named for screen readers.
func (b *browserTab) labelled() {
	b.t.Helper()
	if bare := js[[]string](b, `[...document.querySelectorAll('input:not([type=hidden]), select, textarea')]
		.filter(el => el.labels.length === 0).map(el => el.outerHTML)`); len(bare) > 0 {
		b.t.Errorf("%s: fields without a label: %v", b.name, bare)
	}
}

// signInByKeyboard signs in with the keyboard alone: the page puts the
// focus in the token field; Tab reaches the button, Enter presses it.
func (b *browserTab) signInByKeyboard(url, token string) {
	b.t.Helper()
	b.do("open sign-in", chromedp.Navigate(url), chromedp.WaitVisible("#token"))
	b.waitJS("focus in the token field", `document.activeElement === document.querySelector('#token')`, 10*time.Second)
	b.do("type the token, Tab, Enter", chromedp.KeyEvent(token), chromedp.KeyEvent("\t"), chromedp.KeyEvent("\r"))
	b.waitJS("view after sign-in", `document.querySelector('#view').getAttribute('aria-busy') === 'false'`, 30*time.Second)
	b.labelled()
}

// signIn opens url, pastes token into the sign-in form and waits for the
// page's view.
func (b *browserTab) signIn(url, token string, shots string) {
	b.t.Helper()
	b.do("open sign-in", chromedp.Navigate(url), chromedp.WaitVisible("#token"))
	if shots != "" {
		b.shot(shots, "signin")
	}
	b.do("sign in", chromedp.SetValue("#token", token), chromedp.Click("#signin-form button"))
	b.waitJS("view after sign-in", `document.querySelector('#view').getAttribute('aria-busy') === 'false'`, 30*time.Second)
	b.labelled()
}

// shot writes a full-page PNG of the tab to dir/name.png.
func (b *browserTab) shot(dir, name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// artifactDir is where a test leaves its screenshots:
// $VOYAGER_TEST_ARTIFACTS/<test> when set, else the test's artifact
// directory (kept with go test -artifacts).
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := t.ArtifactDir()
	if base := os.Getenv("VOYAGER_TEST_ARTIFACTS"); base != "" {
		dir = filepath.Join(base, t.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("screenshots in %s", dir)
	return dir
}

// TestConsoleBrowserE2E drives the web console in headless Chromium
// against `voyager dev` with its real agent on a real containerd: an admin
// cordons the node from the admin page; a user signs in, starts a
// notebook from the form and sees it wait with its queue position; the
// admin uncordons and the user's page shows it go Pending → Running live,
// without reloading; its logs open; a batch command's logs follow; both
// stop and show in History. Another user sees neither session nor the
// admin page. Every page is screenshotted.
func TestConsoleBrowserE2E(t *testing.T) {
	needBinary(t)
	adminTab := newBrowser(t, "admin")
	const node = "console-e2e"
	env, environ, dev := devWithAgent(t, "voyager-console-e2e", node)
	base := "http://" + env.httpAddr + "/console/"
	shots := artifactDir(t)
	adaToken := binaryToken(t, environ, "-sub", "ada", "-group", "vision")
	bobToken := binaryToken(t, environ, "-sub", "bob")
	rootToken := binaryToken(t, environ, "-sub", "root", "-admin")

	// The admin cordons the node from the admin page.
	adminTab.signIn(base+"admin", rootToken, shots)
	row := fmt.Sprintf(`document.querySelector('#admin-nodes tr[data-node=%q]')`, node)
	adminTab.waitJS("node listed", row+" !== null", 10*time.Second)
	adminTab.do("cordon", chromedp.SetValue("#cr-"+node, "console test"),
		chromedp.Click(fmt.Sprintf(`form[data-action="/console/do/nodes/%s/cordon"] button`, node)))
	adminTab.waitJS("node cordoned", row+".innerText.includes('cordoned: console test')", 10*time.Second)
	adminTab.shot(shots, "admin")

	// The user starts a notebook from the form; it waits (cordoned).
	ada := adminTab.tab("ada")
	ada.signIn(base+"sessions", adaToken, "")
	ada.do("fill the start form", chromedp.WaitVisible("#start-form"), chromedp.SetValue("#gpus", "1"), chromedp.SetValue("#name", "nb"),
		chromedp.Click("#start-form button[type=submit]"))
	ada.waitJS("the notebook's row", `document.querySelector('#sessions tr[data-session]') !== null`, 30*time.Second)
	nb := js[string](ada, `document.querySelector('#sessions tr[data-session]').dataset.session`)
	nbRow := fmt.Sprintf(`document.querySelector('#sessions tr[data-session=%q]')`, nb)
	if ph := js[string](ada, nbRow+".dataset.phase"); ph != "Pending" {
		t.Fatalf("a notebook on a cordoned node is %s, want Pending", ph)
	}
	// From here the page must change by itself: mark it, count its view
	// loads, and record every phase its row shows.
	loads := js[string](ada, `window.__mark = 'same page'; document.querySelector('#view').dataset.loads`)
	js[bool](ada, `(() => { const el = `+nbRow+`.querySelector('[data-field=phase]'); window.__phases = [el.textContent];
		new MutationObserver(() => window.__phases.push(el.textContent)).observe(el, {childList: true, characterData: true, subtree: true}); return true })()`)
	ada.shot(shots, "sessions-pending")

	// Its queue position, in a second tab of the same user.
	adaQueue := adminTab.tab("ada-queue")
	adaQueue.signIn(base+"queue", adaToken, "")
	adaQueue.waitJS("own queue entry", fmt.Sprintf(`document.querySelector('#queue tr.mine[data-session=%q]') !== null`, nb), 10*time.Second)
	if pos := js[string](adaQueue, `document.querySelector('#queue tr.mine .position').textContent`); pos != "1" {
		t.Errorf("queue position %q, want 1", pos)
	}
	if est := js[string](adaQueue, `document.querySelector('#queue tr.mine .estimate').innerText`); !strings.Contains(est, "cannot be estimated") {
		t.Errorf("estimate with the only node cordoned: %q, want it to say it cannot be estimated", est)
	}
	adaQueue.shot(shots, "queue")

	// Another user sees neither the session nor the admin page.
	bob := adminTab.tab("bob")
	bob.signInByKeyboard(base+"queue", bobToken)
	if text := js[string](bob, "document.body.innerText"); strings.Contains(text, nb) || !strings.Contains(text, "(another user)") {
		t.Errorf("bob's queue shows ada's session id, or no anonymous entry:\n%s", text)
	}
	bob.open(base + "admin")
	bob.waitJS("admin refused", `document.querySelector('#view .problem[data-status="403"]') !== null`, 10*time.Second)
	if hidden := js[bool](bob, `document.querySelector('[data-admin-only]').hidden`); !hidden {
		t.Error("the Admin link is shown to a plain user")
	}
	bob.shot(shots, "admin-refused-for-user")

	// The admin uncordons; ada's page shows Running without reloading.
	adminTab.do("uncordon", chromedp.Click(fmt.Sprintf(`form[data-action="/console/do/nodes/%s/uncordon"] button`, node)))
	ada.waitJS("notebook Running", nbRow+".dataset.phase === 'Running'", 90*time.Second)
	if mark, now := js[string](ada, "window.__mark"), js[string](ada, `document.querySelector('#view').dataset.loads`); mark != "same page" || now != loads {
		t.Errorf("the page was reloaded (mark %q, view loads %s → %s): phases must arrive live", mark, loads, now)
	}
	phases := js[[]string](ada, "window.__phases")
	if len(phases) < 2 || phases[0] != "Pending" || phases[len(phases)-1] != "Running" {
		t.Errorf("phases shown %v, want Pending … Running", phases)
	}
	if href := js[string](ada, nbRow+".querySelector('[data-field=jupyter] a')?.href ?? ''"); !strings.HasPrefix(href, "http") {
		t.Errorf("no Jupyter link once Running (%q)", href)
	}
	ada.shot(shots, "sessions-running")

	// Bob's cluster page shows the GPU held by "(another user)", no id.
	bob.open(base + "cluster")
	if text := js[string](bob, "document.querySelector('#nodes').innerText"); strings.Contains(text, nb) || !strings.Contains(text, "(another user)") || !strings.Contains(text, "SIMULATED") {
		t.Errorf("bob's cluster page: want the held GPU anonymous and the node SIMULATED, got:\n%s", text)
	}
	bob.shot(shots, "cluster-as-another-user")
	adminTab.open(base + "cluster")
	if text := js[string](adminTab, "document.querySelector('#nodes').innerText"); !strings.Contains(text, "ada/"+nb) {
		t.Errorf("the admin's cluster page does not name the holder ada/%s:\n%s", nb, text)
	}
	adminTab.shot(shots, "cluster-as-admin")
	bob.open(base + "sessions")
	if strings.Contains(js[string](bob, "document.body.innerText"), nb) {
		t.Error("bob's sessions page shows ada's session")
	}

	// The notebook's logs open and follow.
	ada.do("open logs", chromedp.Click(fmt.Sprintf(`#sessions tr[data-session=%q] button.logs`, nb)))
	ada.waitJS("logs following", `document.querySelector('#logs').dataset.state === 'following'`, 30*time.Second)

	// A batch command from the form: its output arrives in the logs.
	before := js[[]string](ada, `[...document.querySelectorAll('#sessions tr[data-session]')].map(r => r.dataset.session)`)
	ada.do("start a batch", chromedp.Click(`input[name=kind][value=batch]`), chromedp.SetValue("#gpus", "1"),
		chromedp.SetValue("#command", "echo console-batch-hello; sleep 600"), chromedp.Click("#start-form button[type=submit]"))
	ada.waitJS("the batch's row", fmt.Sprintf(`document.querySelectorAll('#sessions tr[data-session]').length > %d`, len(before)), 30*time.Second)
	batch := js[string](ada, fmt.Sprintf(`[...document.querySelectorAll('#sessions tr[data-session]')].map(r => r.dataset.session).find(id => !%s.includes(id))`, jsArray(before)))
	batchRow := fmt.Sprintf(`document.querySelector('#sessions tr[data-session=%q]')`, batch)
	ada.waitJS("batch Running", batchRow+".dataset.phase === 'Running'", 90*time.Second)
	ada.do("open the batch's logs", chromedp.Click(fmt.Sprintf(`#sessions tr[data-session=%q] button.logs`, batch)))
	ada.waitJS("batch output in the logs", `document.querySelector('#logs-text').textContent.includes('console-batch-hello')`, 60*time.Second)
	ada.shot(shots, "sessions-logs")

	// Stop both from their rows.
	for _, id := range []string{batch, nb} {
		ada.do("stop "+id, chromedp.Click(fmt.Sprintf(`form[data-action="/console/do/sessions/%s/stop"] button`, id)))
		sel := fmt.Sprintf(`document.querySelector('#sessions tr[data-session=%q]')`, id)
		ada.waitJS(id+" stopped", fmt.Sprintf(`(r => r === null || r.dataset.phase === 'Stopped')(%s)`, sel), 60*time.Second)
	}
	ada.open(base + "history")
	for _, id := range []string{batch, nb} {
		ada.waitJS(id+" in history", fmt.Sprintf(`(document.querySelector('#finished tr[data-session=%q]')?.innerText ?? '').includes('Stopped')`, id), 10*time.Second)
	}
	ada.shot(shots, "history")
	ada.open(base + "cluster")
	ada.shot(shots, "cluster")

	bob.open(base + "history")
	if text := js[string](bob, "document.body.innerText"); strings.Contains(text, nb) || strings.Contains(text, batch) {
		t.Errorf("bob's history shows ada's sessions:\n%s", text)
	}
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}

func jsArray(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return "[" + strings.Join(q, ",") + "]"
}
