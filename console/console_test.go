package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/api/apitest"
	"github.com/voyager-gpu/voyager/console"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

const secret = "console-test-secret-0123456789abcdef"

// env is a real API on a real (embedded) etcd with the console mounted as
// `voyager api` mounts it, behind a loopback server.
type env struct {
	t    testing.TB
	cli  *clientv3.Client
	keys state.Keys
	api  *api.API
	srv  *httptest.Server
}

func newEnv(t testing.TB, cli *clientv3.Client) *env {
	t.Helper()
	e := &env{t: t, cli: cli, keys: state.MustKeys(state.DefaultPrefix)}
	a, err := api.New(cli, e.keys, api.Config{
		Auth:   api.AuthConfig{HS256Secret: []byte(secret)},
		Rate:   1e9,
		Burst:  1 << 30,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	e.api = a
	apitest.Run(t, a)
	mux := http.NewServeMux()
	a.Mount(mux)
	if err := console.Mount(a.Engine(), mux, console.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(mux)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *env) token(sub string, roles ...string) string {
	e.t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.MapClaims{"sub": sub, "roles": roles, "groups": []string{sub + "-lab"}, "exp": time.Now().Add(time.Hour).Unix()}).SignedString([]byte(secret))
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

type resp struct {
	code   int
	header http.Header
	body   string
}

// get and post send as the script does: the token in Authorization.
func (e *env) send(method, path, token string, form url.Values, headers ...string) resp {
	e.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, e.srv.URL+path, body)
	if err != nil {
		e.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	r, err := client.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer r.Body.Close()
	b, err := io.ReadAll(r.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return resp{r.StatusCode, r.Header, string(b)}
}

func (e *env) get(path, token string) resp { return e.send("GET", path, token, nil) }
func (e *env) post(path, token string, form url.Values) resp {
	return e.send("POST", path, token, form)
}

// addNode registers a simulated node with gpus GPUs of model.
func (e *env) addNode(name, model string, gpus int) {
	e.t.Helper()
	n := state.Node{Name: name, Address: "10.0.0.1", CPUMilli: 64000, MemoryMiB: 512 * 1024, Ports: state.PortRange{First: 40000, Last: 40999}, Simulated: true, Registered: time.Now().UTC()}
	for i := range gpus {
		n.GPUs = append(n.GPUs, state.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", name, i), Model: model, MemoryMiB: 81920, Healthy: true})
	}
	if _, err := state.Put(context.Background(), e.cli, e.keys.Node(name), n); err != nil {
		e.t.Fatal(err)
	}
	e.waitFor("node "+name, func() bool {
		return strings.Contains(e.get("/api/v1/nodes", e.token("root", "admin")).body, `"name":"`+name+`"`)
	})
}

// waitFor polls cond (a watch cache catching up) for up to 10s.
func (e *env) waitFor(what string, cond func() bool) {
	e.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			e.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, with a deadline
	}
}

func wantCode(t *testing.T, r resp, code int, contains ...string) {
	t.Helper()
	if r.code != code {
		t.Fatalf("status %d, want %d; body:\n%s", r.code, code, r.body)
	}
	for _, s := range contains {
		if !strings.Contains(r.body, s) {
			t.Errorf("body lacks %q:\n%s", s, r.body)
		}
	}
}

func TestShellAndAssets(t *testing.T) {
	e := newEnv(t, etcdtest.New(t))
	r := e.get("/", "")
	if r.code != http.StatusFound || r.header.Get("Location") != "/console/" {
		t.Errorf("GET /: %d to %q, want 302 to /console/", r.code, r.header.Get("Location"))
	}
	if r := e.get("/console/", ""); r.code != http.StatusFound || r.header.Get("Location") != "/console/cluster" {
		t.Errorf("GET /console/: %d to %q", r.code, r.header.Get("Location"))
	}
	for _, page := range console.Pages {
		r := e.get("/console/"+page, "")
		wantCode(t, r, 200, `<script src="/console/static/app.js" defer></script>`, `<label for="token">Token</label>`, `data-view="`+page+`"`, `aria-current="page"`)
		if csp := r.header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "default-src 'self'") {
			t.Errorf("%s: Content-Security-Policy %q", page, csp)
		}
		if strings.Contains(r.body, "http://") || strings.Contains(r.body, "https://") {
			t.Errorf("%s: the shell refers to another origin:\n%s", page, r.body)
		}
	}
	for path, ctype := range map[string]string{"/console/static/app.js": "javascript", "/console/static/app.css": "text/css"} {
		r := e.get(path, "")
		if r.code != 200 || !strings.Contains(r.header.Get("Content-Type"), ctype) || len(r.body) < 1000 {
			t.Errorf("%s: %d %q, %d bytes", path, r.code, r.header.Get("Content-Type"), len(r.body))
		}
	}
	wantCode(t, e.get("/console/nope", ""), 404, "the pages are cluster, queue, sessions, history, admin")
	wantCode(t, e.get("/console/view/nope", e.token("ada")), 404)
}

// TestViewsAuthenticateAsTheAPI: a view is the API's answer for the
// caller's own token: refused without one, 403 where the API refuses.
func TestViewsAuthenticateAsTheAPI(t *testing.T) {
	e := newEnv(t, etcdtest.New(t))
	e.addNode("n1", "A100", 2)
	wantCode(t, e.get("/console/view/cluster", ""), 401, "missing bearer token")
	wantCode(t, e.get("/console/view/cluster", "not-a-jwt"), 401, "token refused")
	r := e.get("/console/view/cluster", e.token("ada"))
	// n1 runs nothing, and the API marks every empty node (PowerDownAfter 0).
	wantCode(t, r, 200, `id="node-n1"`, "SIMULATED", "<strong>2</strong> × A100", `class="badge powerdown"`, "1 empty long enough to power down")
	if n := r.header.Get("X-Voyager-API-Calls"); n != "1" {
		t.Errorf("cluster view took %s API calls, want 1", n)
	}
	wantCode(t, e.get("/console/view/admin", e.token("ada")), 403, `needs the &#34;admin&#34; role`)
	wantCode(t, e.get("/console/view/admin", e.token("root", "admin")), 200, `data-node="n1"`, "Cordon n1")
	wantCode(t, e.get("/console/view/queue", e.token("ada")), 200, "Nobody is waiting.")

	// Inventories come from agents: a model name is escaped like any text.
	e.addNode("n2", "X<i>1</i>", 1)
	r = e.get("/console/view/cluster", e.token("ada"))
	wantCode(t, r, 200, "#0 X&lt;i&gt;1&lt;/i&gt; 80 GiB · free")
	if strings.Contains(r.body, "<i>1") {
		t.Error("the cluster view does not escape a GPU model")
	}
}

// TestTenantsSeeOnlyTheirOwn: the sessions, queue, cluster and history
// views show another user's session only as the API does: not at all, or
// anonymous; an admin sees everyone's history by user and group.
func TestTenantsSeeOnlyTheirOwn(t *testing.T) {
	e := newEnv(t, etcdtest.New(t))
	e.addNode("n1", "A100", 1)
	start := func(user string, gpus int) string {
		r := e.post("/console/do/sessions", e.token(user), url.Values{"kind": {"notebook"}, "gpus": {fmt.Sprint(gpus)}})
		wantCode(t, r, 200, "Started notebook session")
		id := strings.TrimSuffix(strings.Fields(strings.SplitN(r.body, "session ", 2)[1])[0], ":")
		return id
	}
	ada, bob := start("ada", 1), start("bob", 1)
	e.waitFor("both queued", func() bool {
		return strings.Count(e.get("/api/v1/queue", e.token("root", "admin")).body, `"session":"s`) == 2
	})

	r := e.get("/console/view/sessions", e.token("ada"))
	wantCode(t, r, 200, `data-session="`+ada+`"`, "Signed in as <strong>ada</strong>")
	if strings.Contains(r.body, bob) {
		t.Errorf("ada's sessions view shows bob's %s", bob)
	}
	r = e.get("/console/view/queue", e.token("ada"))
	wantCode(t, r, 200, `class="mine" data-session="`+ada+`"`, "(another user)")
	if strings.Contains(r.body, bob) {
		t.Errorf("ada's queue shows bob's %s", bob)
	}

	// Both end after an hour on their GPU.
	t0 := time.Now().UTC().Add(-2 * time.Hour)
	t1, code := t0.Add(time.Hour), 0
	for _, id := range []string{ada, bob} {
		st := state.Status{Session: id, Phase: state.PhaseSucceeded, Created: t0, Updated: t1, Started: &t0, Finished: &t1, ExitCode: &code}
		if _, err := state.Put(context.Background(), e.cli, e.keys.Status(id), st); err != nil {
			t.Fatal(err)
		}
	}
	r = e.get("/console/view/history", e.token("ada"))
	wantCode(t, r, 200, `data-session="`+ada+`"`, "1 sessions, 1.00 GPU-hours", "<th scope=\"row\">ada</th><td>1</td><td>1.00</td>", "<th scope=\"row\">ada-lab</th>")
	if strings.Contains(r.body, bob) {
		t.Errorf("ada's history shows bob's %s", bob)
	}
	r = e.get("/console/view/history", e.token("root", "admin"))
	wantCode(t, r, 200, ada, bob, "2 sessions, 2.00 GPU-hours", "<th scope=\"row\">bob-lab</th>")
}

// TestActions: forms act through the API as the viewer, and the API's
// refusals come back with its status and words.
func TestActions(t *testing.T) {
	e := newEnv(t, etcdtest.New(t))
	e.addNode("n1", "A100", 2)
	ada, root := e.token("ada"), e.token("root", "admin")

	wantCode(t, e.post("/console/do/sessions", "", url.Values{"kind": {"notebook"}}), 401)
	wantCode(t, e.post("/console/do/sessions", ada, url.Values{"kind": {"notebook"}, "gpus": {"two"}}), 422, `gpus: got &#34;two&#34;, want a whole number`)
	wantCode(t, e.post("/console/do/sessions", ada, url.Values{"kind": {"batch"}, "gpus": {"1"}}), 422, "command")
	wantCode(t, e.post("/console/do/sessions", ada, url.Values{"kind": {"notebook"}, "gpus": {"1"}, "gpuModel": {"H100"}}), 422, "A100")
	r := e.post("/console/do/sessions", ada, url.Values{"kind": {"batch"}, "gpus": {"1"}, "command": {"echo hi"}, "maxRuntime": {"2h"}})
	wantCode(t, r, 200, "Started batch session")
	resp, err := e.cli.Get(context.Background(), e.keys.Sessions(), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("sessions in etcd: %v %v", resp, err)
	}
	spec, err := state.Decode[state.Session](resp.Kvs[0].Value)
	if err != nil || spec.Owner != "ada" || strings.Join(spec.Command, " ") != "sh -c echo hi" || spec.Limits.MaxRuntime.Std() != 2*time.Hour || spec.Resources.GPUs != 1 {
		t.Errorf("the form wrote %+v (%v)", spec, err)
	}

	wantCode(t, e.post("/console/do/nodes/n1/cordon", ada, url.Values{"reason": {"x"}}), 403)
	wantCode(t, e.post("/console/do/nodes/n1/cordon", root, url.Values{"reason": {"disk"}}), 200, "Node n1: cordon done.")
	if c, err := e.cli.Get(context.Background(), e.keys.Cordon("n1")); err != nil || len(c.Kvs) != 1 || !strings.Contains(string(c.Kvs[0].Value), `"reason":"disk"`) {
		t.Errorf("cordon in etcd: %v %v", c, err)
	}
	e.waitFor("cordon in the admin view", func() bool {
		return strings.Contains(e.get("/console/view/admin", root).body, "cordoned: disk (by root)")
	})
	wantCode(t, e.post("/console/do/nodes/n1/uncordon", root, nil), 200)

	wantCode(t, e.post("/console/do/quotas", root, url.Values{"scope": {"users"}, "name": {"ada"}, "gpus": {"4"}}), 200, "Quota of users ada saved.")
	wantCode(t, e.post("/console/do/quotas", root, url.Values{"scope": {"users"}, "name": {"ada"}, "gpus": {"lots"}}), 422, "gpus")
	e.waitFor("quota in the admin view", func() bool {
		return strings.Contains(e.get("/console/view/admin", root).body, "<td>user</td><th scope=\"row\">ada</th><td>4</td><td>unlimited</td>")
	})

	wantCode(t, e.post("/console/do/profiles", root, url.Values{"name": {"small"}, "profile": {`{"kind":"notebook","resources":{"gpus":1},"colour":"red"}`}}), 400, "colour")
	wantCode(t, e.post("/console/do/profiles", root, url.Values{"name": {"small"}, "profile": {`{"description":"<script>alert(1)</script>","kind":"notebook","resources":{"gpus":1}}`}}), 200, "Profile small saved.")
	for _, who := range []string{root, ada} {
		page := map[string]string{root: "admin", ada: "sessions"}[who]
		r := e.get("/console/view/"+page, who)
		wantCode(t, r, 200, "&lt;script&gt;alert(1)&lt;/script&gt;")
		if strings.Contains(r.body, "<script>alert") {
			t.Errorf("%s view does not escape a profile's description", page)
		}
	}
	wantCode(t, e.post("/console/do/profiles/small/delete", ada, nil), 403)
	wantCode(t, e.post("/console/do/profiles/small/delete", root, nil), 200)
	wantCode(t, e.post("/console/do/nothing", root, nil), 404, "no console action")
}

// TestWarningOffersAction: a standing warning shows on the session's row
// with the button that acts on it: extend for max runtime, stop for a
// drain or a preemption, and the advice to use the notebook when idle.
func TestWarningOffersAction(t *testing.T) {
	e := newEnv(t, etcdtest.New(t))
	e.addNode("n1", "A100", 1)
	ada := e.token("ada")
	r := e.post("/console/do/sessions", ada, url.Values{"kind": {"notebook"}, "gpus": {"1"}})
	wantCode(t, r, 200)
	id := strings.TrimSuffix(strings.Fields(strings.SplitN(r.body, "session ", 2)[1])[0], ":")
	for reason, want := range map[string]string{
		"MaxRuntime":  `data-action="/console/do/sessions/` + id + `/extend"><input type="hidden" name="by" value="2h"><button type="submit">Extend by 2h</button>`,
		"NodeDrained": `<button type="submit">Stop now (save your work first)</button>`,
		"IdleTimeout": "Use the notebook (open it below) to keep it, or stop it.",
	} {
		w := state.Warning{Session: id, Reason: reason, Message: "will be stopped (" + reason + ")", Issued: time.Now().UTC(), StopAt: time.Now().UTC().Add(15 * time.Minute)}
		if _, err := state.Put(context.Background(), e.cli, e.keys.Warning(id), w); err != nil {
			t.Fatal(err)
		}
		wantCode(t, e.get("/console/view/sessions", ada), 200, `<div class="warning" role="alert" data-field="warning"><strong>`+reason+`</strong>: will be stopped (`+reason+`)`, want)
	}
}
