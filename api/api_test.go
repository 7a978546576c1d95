package api_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

func TestSessionLifecycle(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")

	r := want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated)
	v := decode[api.SessionView](t, r)
	if v.Owner != "ada" || v.Kind != state.KindNotebook || v.Desired != state.DesiredRunning || v.Status.Phase != state.PhasePending {
		t.Fatalf("created %+v", v)
	}
	if loc := r.header.Get("Location"); loc != "/api/v1/sessions/"+v.ID {
		t.Errorf("Location %q", loc)
	}
	if h.countKeys(h.keys.Pending(v.ID)) != 1 {
		t.Error("no queue entry written")
	}

	// Get: pending, with the live queue reason (no nodes at all).
	h.waitFor("the queue entry in the API's cache", func() bool {
		g := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+v.ID, ada, nil), http.StatusOK))
		return g.Status.QueuePosition == 1
	})
	g := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+v.ID, ada, nil), http.StatusOK))
	if g.Status.Reason != "Capacity" || !strings.Contains(g.Status.Message, "no nodes are registered") {
		t.Errorf("pending status %+v, want reason Capacity and a message that no nodes are registered", g.Status)
	}

	// List with pagination.
	for i := 0; i < 2; i++ {
		want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated)
	}
	want(t, h.do("POST", "/api/v1/sessions", h.token("bob"), notebook()), http.StatusCreated)
	p1 := decode[api.SessionList](t, want(t, h.do("GET", "/api/v1/sessions?limit=2", ada, nil), http.StatusOK))
	if len(p1.Items) != 2 || p1.Continue == "" || p1.Items[0].ID != v.ID {
		t.Fatalf("first page %d items, continue %q", len(p1.Items), p1.Continue)
	}
	p2 := decode[api.SessionList](t, want(t, h.do("GET", "/api/v1/sessions?limit=2&continue="+p1.Continue, ada, nil), http.StatusOK))
	if len(p2.Items) != 1 || p2.Continue != "" || p2.Items[0].Owner != "ada" {
		t.Fatalf("second page %+v", p2)
	}
	all := decode[api.SessionList](t, want(t, h.do("GET", "/api/v1/sessions", h.token("root", "admin"), nil), http.StatusOK))
	if len(all.Items) != 4 {
		t.Errorf("admin lists %d sessions, want 4", len(all.Items))
	}
	bobs := decode[api.SessionList](t, want(t, h.do("GET", "/api/v1/sessions?owner=bob&phase=Pending", h.token("root", "admin"), nil), http.StatusOK))
	if len(bobs.Items) != 1 || bobs.Items[0].Owner != "bob" {
		t.Errorf("admin filter owner=bob: %+v", bobs.Items)
	}

	// Stop while pending: cancelled in one transaction.
	sr := decode[api.StopResult](t, want(t, h.do("POST", "/api/v1/sessions/"+v.ID+"/stop", ada, nil), http.StatusAccepted))
	if sr.Outcome != state.StopCancelled || sr.Session.Status.Phase != state.PhaseStopped || sr.Session.Desired != state.DesiredStopped {
		t.Fatalf("stop pending: %+v", sr)
	}
	if h.countKeys(h.keys.Pending(v.ID)) != 0 {
		t.Error("queue entry still there after cancel")
	}
	sr = decode[api.StopResult](t, want(t, h.do("DELETE", "/api/v1/sessions/"+v.ID, ada, nil), http.StatusAccepted))
	if sr.Outcome != state.StopAlready {
		t.Errorf("second stop: outcome %q, want unchanged", sr.Outcome)
	}
	stopped := decode[api.SessionList](t, want(t, h.do("GET", "/api/v1/sessions?phase=Stopped", ada, nil), http.StatusOK))
	if len(stopped.Items) != 1 {
		t.Errorf("phase=Stopped lists %d", len(stopped.Items))
	}
}

func TestStopRunningSessionSetsDesired(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	// What a bind does: the queue entry goes, the status says Running.
	if _, err := h.cli.Delete(context.Background(), h.keys.Pending(v.ID)); err != nil {
		t.Fatal(err)
	}
	// As the agent writes it: the token under secrets/gpu-1/, not in the
	// status that operators read.
	ops, err := state.StatusOps(h.keys, "gpu-1", state.Status{Session: v.ID, Phase: state.PhaseRunning, Nodes: []string{"gpu-1"},
		URLs: map[string]string{"jupyter": "http://gpu-1:40001/lab?token=sekrit", "logs": "http://gpu-1:7071/logs/" + v.ID + "?key=k"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
		t.Fatal(err)
	}
	if st, _, _ := state.Get[state.Status](context.Background(), h.cli, h.keys.Status(v.ID)); st.URLs["jupyter"] != "http://gpu-1:40001/lab" || st.URLs["logs"] != "http://gpu-1:7071/logs/"+v.ID {
		t.Fatalf("stored status URLs %v, want them without token and key", st.URLs)
	}

	g := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+v.ID, ada, nil), http.StatusOK))
	if g.Status.URLs["jupyter"] != "http://gpu-1:40001/lab?token=sekrit" {
		t.Errorf("owner sees jupyter URL %q, want it with its token", g.Status.URLs["jupyter"])
	}
	if _, ok := g.Status.URLs["logs"]; ok {
		t.Error("the agent's log URL is shown to clients")
	}
	adm := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+v.ID, h.token("root", "admin"), nil), http.StatusOK))
	if adm.Status.URLs["jupyter"] != "http://gpu-1:40001/lab" {
		t.Errorf("admin sees jupyter URL %q, want it without the owner's token", adm.Status.URLs["jupyter"])
	}

	sr := decode[api.StopResult](t, want(t, h.do("POST", "/api/v1/sessions/"+v.ID+"/stop", ada, nil), http.StatusAccepted))
	if sr.Outcome != state.StopRequested || sr.Session.Desired != state.DesiredStopped || sr.Session.Status.Phase != state.PhaseRunning {
		t.Fatalf("stop running: %+v", sr)
	}
}

func TestIdempotencyKey(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	r1 := want(t, h.do("POST", "/api/v1/sessions", ada, notebook(), "Idempotency-Key", "k-1"), http.StatusCreated)
	r2 := want(t, h.do("POST", "/api/v1/sessions", ada, notebook(), "Idempotency-Key", "k-1"), http.StatusCreated)
	v1, v2 := decode[api.SessionView](t, r1), decode[api.SessionView](t, r2)
	if v1.ID != v2.ID || r2.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("repeat made %s (replayed %q), want %s", v2.ID, r2.header.Get("Idempotent-Replayed"), v1.ID)
	}
	if n := h.countKeys(h.keys.Sessions()); n != 1 {
		t.Errorf("%d sessions, want 1", n)
	}
	// Another user's same key is their own.
	v3 := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.token("bob"), notebook(), "Idempotency-Key", "k-1"), http.StatusCreated))
	if v3.ID == v1.ID {
		t.Error("bob got ada's session back")
	}
	// Same key, other body: refused.
	other := notebook()
	other["priority"] = 5
	p := want(t, h.do("POST", "/api/v1/sessions", ada, other, "Idempotency-Key", "k-1"), http.StatusUnprocessableEntity).problem(t)
	if !strings.Contains(p.Detail, "already created session "+v1.ID+" with a different request body") {
		t.Errorf("detail %q", p.Detail)
	}
	// The record expires with a lease.
	resp, err := h.cli.Get(context.Background(), h.keys.IdempotencyDir(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 2 || resp.Kvs[0].Lease == 0 {
		t.Fatalf("idempotency records: %d, lease %v", len(resp.Kvs), resp.Kvs[0].Lease)
	}
}

func TestAuthRefusals(t *testing.T) {
	h := newHarness(t, harnessOpts{issuer: "https://idp.example"})
	now := time.Now()
	base := func() jwt.MapClaims {
		return jwt.MapClaims{"sub": "ada", "aud": "voyager", "iss": "https://idp.example", "exp": now.Add(time.Hour).Unix()}
	}
	with := func(k string, v any) jwt.MapClaims {
		c := base()
		if v == nil {
			delete(c, k)
		} else {
			c[k] = v
		}
		return c
	}
	rsaPEM := mustRead(t, h.pemPub)
	none := func(c jwt.MapClaims) string {
		s, err := jwt.NewWithClaims(jwt.SigningMethodNone, c).SignedString(jwt.UnsafeAllowNoneSignatureType)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	tests := []struct {
		name   string
		header string // Authorization
		want   string // the problem's detail
	}{
		{"no token", "", "missing bearer token: send Authorization: Bearer <JWT> (voyager token mints one for development)"},
		{"not bearer", "Basic YWRhOnB3", "missing bearer token: send Authorization: Bearer <JWT> (voyager token mints one for development)"},
		{"malformed", "Bearer not.a.jwt", "token refused: malformed: want a JWT of three base64url parts (header.claims.signature)"},
		{"expired", "Bearer " + h.sign(jwt.SigningMethodHS256, []byte(testSecret), with("exp", now.Add(-time.Minute).Unix())), "token refused: expired"},
		{"no exp", "Bearer " + h.sign(jwt.SigningMethodHS256, []byte(testSecret), with("exp", nil)), "token refused: it has no exp claim; tokens must expire"},
		{"not yet valid", "Bearer " + h.sign(jwt.SigningMethodHS256, []byte(testSecret), with("nbf", now.Add(time.Hour).Unix())), "token refused: not valid yet (nbf is in the future)"},
		{"wrong aud", "Bearer " + h.sign(jwt.SigningMethodHS256, []byte(testSecret), with("aud", "other")), `token refused: audience must include "voyager"`},
		{"wrong iss", "Bearer " + h.sign(jwt.SigningMethodHS256, []byte(testSecret), with("iss", "https://evil")), `token refused: issuer must be "https://idp.example"`},
		{"bad signature", "Bearer " + h.sign(jwt.SigningMethodHS256, []byte("another-secret-of-enough-length-123"), base()), "token refused: bad signature"},
		{"alg none", "Bearer " + none(base()), `token refused: signing algorithm "none" is not accepted: want HS256 or RS256 or ES256`},
		{"HS256 signed with the RSA public key", "Bearer " + h.sign(jwt.SigningMethodHS256, rsaPEM, base()), "token refused: bad signature"},
		{"RS384 not accepted", "Bearer " + h.sign(jwt.SigningMethodRS384, h.rsaKey, base()), `token refused: signing algorithm "RS384" is not accepted: want HS256 or RS256 or ES256`},
		{"bad subject", "Bearer " + h.sign(jwt.SigningMethodHS256, []byte(testSecret), with("sub", "a b")), `token refused: invalid sub claim "a b": want 1-128 letters, digits, '@', '.', '_', '+' or '-'`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r response
			if tc.header == "" {
				r = h.do("GET", "/api/v1/sessions", "", nil)
			} else {
				r = h.do("GET", "/api/v1/sessions", "", nil, "Authorization", tc.header)
			}
			p := want(t, r, http.StatusUnauthorized).problem(t)
			if p.Detail != tc.want {
				t.Errorf("detail %q\nwant   %q", p.Detail, tc.want)
			}
			if r.header.Get("WWW-Authenticate") == "" {
				t.Error("no WWW-Authenticate header")
			}
		})
	}
	// Accepted: each configured algorithm.
	for name, tok := range map[string]string{
		"HS256": h.sign(jwt.SigningMethodHS256, []byte(testSecret), base()),
		"RS256": h.sign(jwt.SigningMethodRS256, h.rsaKey, base()),
		"ES256": h.sign(jwt.SigningMethodES256, h.ecKey, base()),
	} {
		t.Run("accepts "+name, func(t *testing.T) {
			who := decode[map[string]any](t, want(t, h.do("GET", "/api/v1/whoami", tok, nil), http.StatusOK))
			if who["subject"] != "ada" {
				t.Errorf("whoami %v", who)
			}
		})
	}
}

// HS/RS confusion in its classic form: a token that claims HS256 with the
// server's RSA public key as the HMAC secret must fail even where HS256 is
// not configured at all.
func TestAlgorithmConfusionWithoutHS256(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	keys, err := api.LoadPublicKeys(h.pemPub)
	if err != nil {
		t.Fatal(err)
	}
	a, err := api.New(h.cli, h.keys, api.Config{Auth: api.AuthConfig{PublicKeys: keys, Audience: "voyager"}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	tok := h.sign(jwt.SigningMethodHS256, mustRead(t, h.pemPub), jwt.MapClaims{"sub": "ada", "aud": "voyager", "exp": time.Now().Add(time.Hour).Unix()})
	req, _ := http.NewRequest("GET", srv.URL+"/api/v1/whoami", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p api.Problem
	_ = json.NewDecoder(resp.Body).Decode(&p)
	if resp.StatusCode != 401 || p.Detail != `token refused: signing algorithm "HS256" is not accepted: want RS256 or ES256` {
		t.Fatalf("status %d, detail %q", resp.StatusCode, p.Detail)
	}
}

func TestVisibilityAndRoles(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada, bob, root, hub := h.token("ada"), h.token("bob"), h.token("root", "admin"), h.token("jupyterhub", "service")
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))

	for _, r := range []struct{ method, path string }{
		{"GET", "/api/v1/sessions/" + v.ID},
		{"POST", "/api/v1/sessions/" + v.ID + "/stop"},
		{"DELETE", "/api/v1/sessions/" + v.ID},
		{"GET", "/api/v1/sessions/" + v.ID + "/events"},
		{"GET", "/api/v1/sessions/" + v.ID + "/logs"},
	} {
		p := want(t, h.do(r.method, r.path, bob, nil), http.StatusNotFound).problem(t)
		if p.Detail != fmt.Sprintf("no session %q", v.ID) {
			t.Errorf("%s %s as another user: detail %q", r.method, r.path, p.Detail)
		}
	}
	if l := decode[api.SessionList](t, want(t, h.do("GET", "/api/v1/sessions", bob, nil), http.StatusOK)); len(l.Items) != 0 {
		t.Errorf("bob lists %d sessions", len(l.Items))
	}
	p := want(t, h.do("GET", "/api/v1/sessions?owner=ada", bob, nil), http.StatusForbidden).problem(t)
	if p.Detail != "only admins may list other users' sessions; leave owner out to list yours (bob)" {
		t.Errorf("detail %q", p.Detail)
	}
	want(t, h.do("GET", "/api/v1/sessions/"+v.ID, root, nil), http.StatusOK)

	// Admin-only routes as a user.
	for _, r := range []struct {
		method, path string
		body         any
	}{
		{"POST", "/api/v1/nodes/gpu-1/cordon", nil},
		{"POST", "/api/v1/nodes/gpu-1/uncordon", nil},
		{"POST", "/api/v1/nodes/gpu-1/drain", nil},
		{"PUT", "/api/v1/profiles/small", map[string]any{"image": "x"}},
		{"DELETE", "/api/v1/profiles/small", nil},
		{"GET", "/api/v1/quotas", nil},
		{"PUT", "/api/v1/quotas/users/ada", map[string]any{"gpus": 1}},
		{"DELETE", "/api/v1/quotas/users/ada", nil},
	} {
		p := want(t, h.do(r.method, r.path, ada, r.body), http.StatusForbidden).problem(t)
		if !strings.HasSuffix(p.Detail, `needs the "admin" role`) {
			t.Errorf("%s %s as a user: detail %q", r.method, r.path, p.Detail)
		}
	}

	// The service role acts for users, and does nothing else.
	p = want(t, h.do("GET", "/api/v1/sessions", hub, nil), http.StatusForbidden).problem(t)
	if p.Detail != `a "service" token must name the user it acts for in X-Voyager-On-Behalf-Of` {
		t.Errorf("service alone: %q", p.Detail)
	}
	sv := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", hub, notebook(), api.OnBehalfOfHeader, "ada"), http.StatusCreated))
	if sv.Owner != "ada" {
		t.Errorf("service-made session owned by %q", sv.Owner)
	}
	want(t, h.do("GET", "/api/v1/sessions/"+v.ID, hub, nil, api.OnBehalfOfHeader, "ada"), http.StatusOK)
	want(t, h.do("GET", "/api/v1/sessions/"+v.ID, hub, nil, api.OnBehalfOfHeader, "bob"), http.StatusNotFound)
	// It may read the nodes (what is free now, for the spawn form)...
	want(t, h.do("GET", "/api/v1/nodes", hub, nil, api.OnBehalfOfHeader, "ada"), http.StatusOK)
	// ...and nothing else.
	for _, path := range []string{"/api/v1/queue", "/api/v1/quotas"} {
		p := want(t, h.do("GET", path, hub, nil, api.OnBehalfOfHeader, "ada"), http.StatusForbidden).problem(t)
		if p.Detail != `a "service" token may only act on behalf of a user on /sessions, /profiles and /volumes, and read /nodes` {
			t.Errorf("service on %s: %q", path, p.Detail)
		}
	}
	p = want(t, h.do("GET", "/api/v1/sessions", bob, nil, api.OnBehalfOfHeader, "ada"), http.StatusForbidden).problem(t)
	if p.Detail != `only a token with the "service" role may act on behalf of a user (X-Voyager-On-Behalf-Of)` {
		t.Errorf("user with on-behalf-of: %q", p.Detail)
	}
}

func TestBadInputWritesNothing(t *testing.T) {
	h := newHarness(t, harnessOpts{maxBody: 4096})
	ada := h.token("ada")
	tests := []struct {
		name   string
		body   any
		status int
		detail string
		fields []string
	}{
		{"empty", "", 400, "the body is empty: want a JSON object", nil},
		{"not json", "{kind:", 400, "invalid JSON at byte 2: invalid character 'k' looking for beginning of object key string", nil},
		{"unknown field", `{"kind":"batch","gpu":1}`, 400, `unknown field "gpu"; the fields are listed in /openapi.json`, []string{"gpu"}},
		{"wrong type", `{"kind":"batch","resources":{"gpus":"two"}}`, 400, "resources.gpus: got a JSON string, want a number", []string{"resources.gpus"}},
		{"trailing data", `{"kind":"batch"} {}`, 400, "trailing data after the JSON object", nil},
		{"too large", `{"kind":"` + strings.Repeat("x", 5000) + `"}`, 413, "the body is larger than 4096 bytes", nil},
		{"invalid values", map[string]any{"kind": "train", "resources": map[string]any{"gpus": 100, "gpuModel": "[A100", "migProfile": "big"}, "priority": 1000, "env": map[string]any{"1X": "y", "JUPYTER_TOKEN": "t"}},
			422, "", []string{"kind", "env.1X", "env.JUPYTER_TOKEN", "resources.gpus", "resources.gpuModel", "resources.migProfile", "priority"}},
		{"batch without command", map[string]any{"kind": "batch", "image": "busybox", "limits": map[string]any{"idleTimeout": "1h"}, "restart": map[string]any{"policy": "Always"}},
			422, `command: required for a batch session: the program and its arguments, e.g. ["python", "train.py"]; limits.idleTimeout: applies to notebook sessions only; a batch session ends when its command does; restart.policy: got "Always", want "Never" or "OnFailure"`, nil},
		{"bad duration", `{"kind":"batch","limits":{"maxRuntime":"soon"}}`, 400, `parse duration "soon": want a Go duration such as "90m" or "2h": time: invalid duration "soon"`, nil},
		{"unknown profile", map[string]any{"profile": "nope"}, 422, `profile: no profile "nope"; GET /api/v1/profiles lists them (there are none)`, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := want(t, h.do("POST", "/api/v1/sessions", ada, tc.body), tc.status).problem(t)
			if tc.detail != "" && p.Detail != tc.detail {
				t.Errorf("detail %q\nwant   %q", p.Detail, tc.detail)
			}
			var got []string
			for _, f := range p.Errors {
				got = append(got, f.Field)
				if f.Message == "" {
					t.Errorf("field %s has no message", f.Field)
				}
			}
			if tc.fields != nil && strings.Join(got, ",") != strings.Join(tc.fields, ",") {
				t.Errorf("fields %v, want %v", got, tc.fields)
			}
		})
	}
	if n := h.countKeys(h.keys.All()); n != 0 {
		t.Errorf("%d keys written by refused requests", n)
	}
}

func TestImpossibleRequestRefused(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	// With no nodes at all, anything valid queues.
	big := notebook()
	big["resources"] = map[string]any{"gpus": 16, "gpuModel": "*H100*"}
	want(t, h.do("POST", "/api/v1/sessions", ada, big), http.StatusCreated)

	h.addNode("gpu-1", "NVIDIA A100-SXM4-80GB", 8)
	p := want(t, h.do("POST", "/api/v1/sessions", ada, big), http.StatusUnprocessableEntity).problem(t)
	if p.Title != "Unsatisfiable request" || p.Detail != `resources.gpuModel: no node has a GPU matching "*H100*"; the GPU models present are NVIDIA A100-SXM4-80GB (8)` {
		t.Errorf("model: %q %q", p.Title, p.Detail)
	}
	big["resources"] = map[string]any{"gpus": 16, "gpuModel": "*A100*"}
	p = want(t, h.do("POST", "/api/v1/sessions", ada, big), http.StatusUnprocessableEntity).problem(t)
	if p.Detail != "resources: no node can ever hold 16×A100: the largest node has 8 matching GPUs, 64 cores CPU and 524288 MiB memory; the request asks for 16 GPU *A100*, 1 CPU, 4096 MiB" {
		t.Errorf("size: %q", p.Detail)
	}
	big["resources"] = map[string]any{"gpus": 8, "gpuModel": "*A100*"}
	want(t, h.do("POST", "/api/v1/sessions", ada, big), http.StatusCreated)
	// A Ray session needs one node per part: two workers need three nodes.
	big["ray"] = map[string]any{"workers": 2}
	p = want(t, h.do("POST", "/api/v1/sessions", ada, big), http.StatusUnprocessableEntity).problem(t)
	if !strings.HasPrefix(p.Detail, "ray: no node can ever hold") {
		t.Errorf("ray: %q", p.Detail)
	}
	big["resources"] = map[string]any{"gpus": 1, "cpuMilli": 128000}
	delete(big, "ray")
	p = want(t, h.do("POST", "/api/v1/sessions", ada, big), http.StatusUnprocessableEntity).problem(t)
	if p.Detail != "resources: no node can ever hold 1×GPU: the largest node has 8 matching GPUs, 64 cores CPU and 524288 MiB memory; the request asks for 1 GPU, 128 CPU, 4096 MiB" {
		t.Errorf("cpu: %q", p.Detail)
	}
	// The check is memoised by request for the nodes as they are: the same
	// request gets the same answer, and a node that can hold a refused
	// request makes it admissible at once.
	if p2 := want(t, h.do("POST", "/api/v1/sessions", ada, big), http.StatusUnprocessableEntity).problem(t); p2.Detail != p.Detail {
		t.Errorf("the same request again: %q, want %q", p2.Detail, p.Detail)
	}
	big["resources"] = map[string]any{"gpus": 16, "gpuModel": "*A100*"}
	want(t, h.do("POST", "/api/v1/sessions", ada, big), http.StatusUnprocessableEntity)
	h.addNode("gpu-2", "NVIDIA A100-SXM4-80GB", 16)
	want(t, h.do("POST", "/api/v1/sessions", ada, big), http.StatusCreated)
}

func TestEventsStream(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	req, _ := http.NewRequest("GET", h.srv.URL+"/api/v1/sessions/"+v.ID+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+ada)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	events := make(chan api.Event)
	go func() {
		defer close(events)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var ev api.Event
				if json.Unmarshal([]byte(d), &ev) == nil {
					events <- ev
				}
			}
		}
	}()
	next := func() api.Event {
		t.Helper()
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("stream ended early")
			}
			return ev
		case <-ctx.Done():
			t.Fatal("no event")
		}
		return api.Event{}
	}
	if ev := next(); ev.Phase != state.PhasePending || ev.Message != "Pending: waiting for the placer" || ev.Progress != 10 {
		t.Fatalf("first event %+v", ev)
	}
	code := 0
	steps := []state.Status{
		{Session: v.ID, Phase: state.PhaseBound, Reason: "Bound", Message: "on gpu-1"},
		{Session: v.ID, Phase: state.PhaseBound, Reason: "Bound", Message: "on gpu-1"}, // no change: no event
		{Session: v.ID, Phase: state.PhaseRunning, Reason: "Started", Message: "Jupyter answers"},
		{Session: v.ID, Phase: state.PhaseSucceeded, Reason: "Exited", Message: "the command finished", ExitCode: &code},
	}
	wantMsgs := []string{"Bound: on gpu-1", "Running: Jupyter answers", "Succeeded: the command finished (exit code 0)"}
	for _, st := range steps {
		h.putStatus(st)
	}
	for i, m := range wantMsgs {
		ev := next()
		if ev.Message != m {
			t.Errorf("event %d: %q, want %q", i, ev.Message, m)
		}
		if ev.Terminal != (i == len(wantMsgs)-1) {
			t.Errorf("event %d terminal=%v", i, ev.Terminal)
		}
	}
	select {
	case _, ok := <-events:
		if ok {
			t.Error("an event after the terminal one")
		}
	case <-ctx.Done():
		t.Error("stream did not end after the terminal event")
	}
}

func TestLogsContract(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	p := want(t, h.do("GET", "/api/v1/sessions/"+v.ID+"/logs", ada, nil), http.StatusServiceUnavailable).problem(t)
	wantDetail := "no node agent serves logs for session " + v.ID + " yet (phase Pending): the agent that runs a session publishes its log endpoint in status.urls.logs once the container exists"
	if p.Detail != wantDetail {
		t.Errorf("detail %q", p.Detail)
	}
	agent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "hi\ntail=%s follow=%s\n", r.URL.Query().Get("tail"), r.URL.Query().Get("follow"))
	}))
	defer agent.Close()
	h.putStatus(state.Status{Session: v.ID, Phase: state.PhaseRunning, URLs: map[string]string{"logs": agent.URL + "/logs/" + v.ID}})
	r := want(t, h.do("GET", "/api/v1/sessions/"+v.ID+"/logs?tail=10&follow=true", ada, nil), http.StatusOK)
	if string(r.body) != "hi\ntail=10 follow=true\n" {
		t.Errorf("logs %q", r.body)
	}
	want(t, h.do("GET", "/api/v1/sessions/"+v.ID+"/logs?tail=-1", ada, nil), http.StatusUnprocessableEntity)
}

func TestNodesQueueAdmin(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada, bob, root := h.token("ada"), h.token("bob"), h.token("root", "admin")
	h.addNode("gpu-1", "NVIDIA A100-SXM4-80GB", 2)
	// One allocation on the node.
	led := state.Ledger{Node: "gpu-1", Allocations: map[string]state.Allocation{"s1": {Owner: "zed", Role: state.RoleSingle, GPUs: []string{"GPU-gpu-1-0"}, CPUMilli: 1000, MemoryMiB: 1024}}}
	if _, err := state.Put(context.Background(), h.cli, h.keys.Ledger("gpu-1"), led); err != nil {
		t.Fatal(err)
	}
	h.waitFor("ledger in the API's view", func() bool {
		return strings.Contains(string(h.do("GET", "/api/v1/nodes", ada, nil).body), `"used":1`)
	})
	nodes := decode[struct{ Items []api.NodeSummary }](t, want(t, h.do("GET", "/api/v1/nodes", ada, nil), http.StatusOK))
	if n := nodes.Items[0]; n.GPUs != (api.GPUCounts{Total: 2, Used: 1, Free: 1}) || !n.Simulated || n.Sessions != 1 ||
		n.ModelsFree["NVIDIA A100-SXM4-80GB"] != 1 || len(n.ModelsFree) != 1 {
		t.Errorf("node %+v", n)
	}

	// Queue: bob's 2-GPU request waits behind nothing; ada's 1-GPU fits.
	two := notebook()
	two["resources"] = map[string]any{"gpus": 2}
	bv := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", bob, two), http.StatusCreated))
	av := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, notebook()), http.StatusCreated))
	type queue struct {
		Items []api.QueueEntry
		Mine  int
	}
	h.waitFor("both entries in the queue view", func() bool {
		return len(decode[queue](t, h.do("GET", "/api/v1/queue", ada, nil)).Items) == 2
	})
	q := decode[queue](t, want(t, h.do("GET", "/api/v1/queue", ada, nil), http.StatusOK))
	if q.Mine != 1 {
		t.Errorf("mine %d", q.Mine)
	}
	for _, e := range q.Items {
		switch {
		case e.Mine && (e.Session != av.ID || e.Reason != "Placing"):
			t.Errorf("my entry %+v", e)
		case !e.Mine && (e.Session != "" || e.Owner != "(another user)" || e.Reason != "Capacity"):
			t.Errorf("bob's entry as seen by ada %+v", e)
		}
	}
	qa := decode[queue](t, want(t, h.do("GET", "/api/v1/queue", root, nil), http.StatusOK))
	for _, e := range qa.Items {
		if e.Session == "" {
			t.Errorf("admin sees an anonymous entry %+v", e)
		}
	}
	g := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+bv.ID, bob, nil), http.StatusOK))
	if g.Status.Reason != "Capacity" || g.Status.QueuePosition != 1 || !strings.Contains(g.Status.Message, "the best node has 1 free") {
		t.Errorf("bob's live status %+v", g.Status)
	}

	// Cordon, uncordon, drain.
	c := want(t, h.do("POST", "/api/v1/nodes/gpu-1/cordon", root, map[string]any{"reason": "fan"}), http.StatusOK)
	if !strings.Contains(string(c.body), `"reason":"fan"`) {
		t.Errorf("cordon %s", c.body)
	}
	cd, _, err := state.Get[state.Cordon](context.Background(), h.cli, h.keys.Cordon("gpu-1"))
	if err != nil || cd.By != "root" || cd.Drain {
		t.Fatalf("cordon %+v %v", cd, err)
	}
	want(t, h.do("POST", "/api/v1/nodes/gpu-1/uncordon", root, nil), http.StatusOK)
	if h.countKeys(h.keys.Cordon("gpu-1")) != 0 {
		t.Error("cordon still there")
	}
	// Drain stops the node's notebooks: make ada's session hold the node.
	if _, err := h.cli.Delete(context.Background(), h.keys.Pending(av.ID)); err != nil {
		t.Fatal(err)
	}
	led.Allocations[av.ID] = state.Allocation{Owner: "ada", Role: state.RoleSingle, GPUs: []string{"GPU-gpu-1-1"}}
	if _, err := state.Put(context.Background(), h.cli, h.keys.Ledger("gpu-1"), led); err != nil {
		t.Fatal(err)
	}
	d := decode[map[string]any](t, want(t, h.do("POST", "/api/v1/nodes/gpu-1/drain", root, map[string]any{"reason": "maintenance"}), http.StatusOK))
	if fmt.Sprint(d["stopping"]) != "["+av.ID+"]" {
		t.Errorf("drain lists %v as stopping", d["stopping"])
	}
	// The drain is recorded, not acted on here: the lifecycle controller
	// warns the notebook first, then stops it at the cluster's deadline.
	cd, _, _ = state.Get[state.Cordon](context.Background(), h.cli, h.keys.Cordon("gpu-1"))
	if !cd.Drain || cd.Deadline != nil {
		t.Errorf("drain without a deadline wrote %+v; want drain with no deadline (the cluster default applies)", cd)
	}
	if s, _, _ := state.Get[state.Session](context.Background(), h.cli, h.keys.Session(av.ID)); s.Desired != state.DesiredRunning || s.Eviction != nil {
		t.Errorf("the API stopped the notebook itself: %+v", s)
	}
	want(t, h.do("POST", "/api/v1/nodes/gpu-1/drain", root, map[string]any{"deadline": "0s"}), http.StatusOK)
	if cd, _, _ = state.Get[state.Cordon](context.Background(), h.cli, h.keys.Cordon("gpu-1")); cd.Deadline == nil || !cd.Deadline.Equal(cd.Since) {
		t.Errorf("drain with deadline 0s wrote %+v; want the deadline now", cd)
	}
	want(t, h.do("POST", "/api/v1/nodes/Bad_Name/cordon", root, nil), http.StatusUnprocessableEntity)

	// Profiles.
	prof := map[string]any{"description": "1 A100", "kind": "notebook", "image": "voyager/jupyter:latest", "resources": map[string]any{"gpus": 1, "gpuModel": "*A100*", "cpuMilli": 4000, "memoryMiB": 8192}}
	want(t, h.do("PUT", "/api/v1/profiles/a100", root, prof), http.StatusOK)
	if l := decode[struct{ Items []state.Profile }](t, want(t, h.do("GET", "/api/v1/profiles", ada, nil), http.StatusOK)); len(l.Items) != 1 || l.Items[0].Name != "a100" {
		t.Errorf("profiles %+v", l)
	}
	want(t, h.do("GET", "/api/v1/profiles/a100", ada, nil), http.StatusOK)
	pv := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, map[string]any{"profile": "a100"}), http.StatusCreated))
	if pv.Image != "voyager/jupyter:latest" || pv.Resources.GPUModel != "*A100*" || pv.Kind != state.KindNotebook {
		t.Errorf("session from profile %+v", pv.Session)
	}
	// Set fields override the profile's one by one (as JupyterHub's spawner sends them).
	pv = decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, map[string]any{"profile": "a100", "resources": map[string]any{"gpus": 2, "memoryMiB": 4096}}), http.StatusCreated))
	if r := pv.Resources; r.GPUs != 2 || r.GPUModel != "*A100*" || r.CPUMilli != 4000 || r.MemoryMiB != 4096 {
		t.Errorf("profile with overrides: %+v", r)
	}
	want(t, h.do("PUT", "/api/v1/profiles/bad", root, map[string]any{"kind": "x"}), http.StatusUnprocessableEntity)
	want(t, h.do("DELETE", "/api/v1/profiles/a100", root, nil), http.StatusNoContent)
	want(t, h.do("GET", "/api/v1/profiles/a100", ada, nil), http.StatusNotFound)

	// Quotas.
	want(t, h.do("PUT", "/api/v1/quotas/users/ada", root, map[string]any{"gpus": 4}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/quotas/groups/vision", root, map[string]any{"memoryMiB": 1024, "weight": 3}), http.StatusOK)
	ql := decode[api.QuotaList](t, want(t, h.do("GET", "/api/v1/quotas", root, nil), http.StatusOK))
	if *ql.Users["ada"].GPUs != 4 || *ql.Groups["vision"].MemoryMiB != 1024 || ql.Groups["vision"].Weight == nil || *ql.Groups["vision"].Weight != 3 {
		t.Errorf("quotas %+v", ql)
	}
	if r := want(t, h.do("PUT", "/api/v1/quotas/groups/vision", root, map[string]any{"weight": 0}), http.StatusUnprocessableEntity); !strings.Contains(string(r.body), "fair-share weight above 0") {
		t.Errorf("weight 0: %s", r.body)
	}
	want(t, h.do("PUT", "/api/v1/quotas/teams/x", root, map[string]any{"gpus": 1}), http.StatusUnprocessableEntity)
	want(t, h.do("PUT", "/api/v1/quotas/users/ada", root, map[string]any{"gpus": -1}), http.StatusUnprocessableEntity)
	want(t, h.do("DELETE", "/api/v1/quotas/users/ada", root, nil), http.StatusNoContent)
	want(t, h.do("DELETE", "/api/v1/quotas/users/ada", root, nil), http.StatusNotFound)
}

func TestRateLimitPerSubject(t *testing.T) {
	h := newHarness(t, harnessOpts{rate: 0.001, burst: 2})
	ada := h.token("ada")
	want(t, h.do("GET", "/api/v1/whoami", ada, nil), http.StatusOK)
	want(t, h.do("GET", "/api/v1/whoami", ada, nil), http.StatusOK)
	r := want(t, h.do("GET", "/api/v1/whoami", ada, nil), http.StatusTooManyRequests)
	if r.header.Get("Retry-After") == "" || !strings.HasPrefix(r.problem(t).Detail, "more than 0.001 requests per second (burst 2) from ada") {
		t.Errorf("429: %s", r.body)
	}
	want(t, h.do("GET", "/api/v1/whoami", h.token("bob"), nil), http.StatusOK) // bob has his own bucket
}

func TestMetricsAndOpenAPI(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	want(t, h.do("POST", "/api/v1/sessions", h.token("ada"), notebook()), http.StatusCreated)
	h.waitFor("the status in the cache", func() bool {
		return strings.Contains(gather(t, h.api), `voyager_sessions{phase="Pending"} 1`)
	})
	m := gather(t, h.api)
	for _, s := range []string{
		`voyager_api_requests_total{code="201",method="POST",route="/api/v1/sessions"} 1`,
		`voyager_pending_sessions{reason="Queued"} 1`,
		`voyager_gpus{state="allocated"} 0`,
	} {
		if !strings.Contains(m, s) {
			t.Errorf("metrics lack %s", s)
		}
	}
	doc := decode[map[string]any](t, want(t, h.do("GET", "/openapi.json", "", nil), http.StatusOK))
	if doc["openapi"] != "3.0.3" {
		t.Errorf("openapi %v", doc["openapi"])
	}
	paths := doc["paths"].(map[string]any)
	for _, rt := range h.api.Routes() {
		p := rt.Path
		for _, seg := range []string{"id", "name", "scope"} {
			p = strings.ReplaceAll(p, ":"+seg, "{"+seg+"}")
		}
		p = strings.ReplaceAll(p, "*path", "{path}")
		item, ok := paths[p].(map[string]any)
		if !ok || item[strings.ToLower(rt.Method)] == nil {
			t.Errorf("route %s %s is not in the OpenAPI document", rt.Method, rt.Path)
		}
	}
	p := want(t, h.do("GET", "/api/v1/nope", h.token("ada"), nil), http.StatusNotFound).problem(t)
	if p.Detail != "no route GET /api/v1/nope; the routes are listed in /openapi.json" {
		t.Errorf("404 %q", p.Detail)
	}
	want(t, h.do("PATCH", "/api/v1/sessions", h.token("ada"), nil), http.StatusMethodNotAllowed)
}

// TestJWKSKeys verifies RS256 and ES256 tokens against a JWKS document,
// choosing the key by kid.
func TestJWKSKeys(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	b64 := base64.RawURLEncoding.EncodeToString
	ec := h.ecKey.PublicKey
	ecBytes, err := ec.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	jwks := map[string]any{"keys": []map[string]any{
		{"kty": "RSA", "kid": "r1", "use": "sig", "n": b64(h.rsaKey.N.Bytes()), "e": b64(big.NewInt(int64(h.rsaKey.E)).Bytes())},
		{"kty": "EC", "kid": "e1", "crv": "P-256", "x": b64(ecBytes[1:33]), "y": b64(ecBytes[33:])},
	}}
	b, _ := json.Marshal(jwks)
	path := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	keys, err := api.LoadPublicKeys(path)
	if err != nil {
		t.Fatal(err)
	}
	a, err := api.New(h.cli, h.keys, api.Config{Auth: api.AuthConfig{PublicKeys: keys}})
	if err != nil {
		t.Fatal(err)
	}
	claims := jwt.MapClaims{"sub": "ada", "exp": time.Now().Add(time.Hour).Unix()}
	for _, tc := range []struct {
		name   string
		method jwt.SigningMethod
		key    any
		kid    string
		code   int
	}{
		{"RS256 kid r1", jwt.SigningMethodRS256, h.rsaKey, "r1", 200},
		{"ES256 kid e1", jwt.SigningMethodES256, h.ecKey, "e1", 200},
		{"ES256 no kid", jwt.SigningMethodES256, h.ecKey, "", 200},
		{"RS256 with the EC kid", jwt.SigningMethodRS256, h.rsaKey, "e1", 401},
		{"unknown kid", jwt.SigningMethodRS256, h.rsaKey, "zz", 401},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := jwt.NewWithClaims(tc.method, claims)
			if tc.kid != "" {
				tok.Header["kid"] = tc.kid
			}
			s, err := tok.SignedString(tc.key)
			if err != nil {
				t.Fatal(err)
			}
			rec := httptest.NewRecorder()
			req := httptest.NewRequest("GET", "/api/v1/whoami", nil)
			req.Header.Set("Authorization", "Bearer "+s)
			a.Handler().ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Errorf("status %d, want %d: %s", rec.Code, tc.code, rec.Body)
			}
		})
	}
}

// TestMintHS256NestedClaims mints with configured claim paths and checks
// the API reads roles and groups back from them.
func TestMintHS256NestedClaims(t *testing.T) {
	cli := etcdtest.New(t)
	a, err := api.New(cli, state.MustKeys(state.DefaultPrefix), api.Config{Auth: api.AuthConfig{
		HS256Secret: []byte(testSecret), RolesClaim: "realm_access.roles", GroupsClaim: "grp", AdminRole: "ops"}})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := api.MintHS256([]byte(testSecret), api.TokenClaims{Subject: "ada", Roles: []string{"ops"}, Groups: []string{"vision"},
		TTL: time.Hour, RolesClaim: "realm_access.roles", GroupsClaim: "grp"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest("GET", "/api/v1/whoami", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	a.Handler().ServeHTTP(rec, req)
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"admin":true`) || !strings.Contains(rec.Body.String(), `"groups":["vision"]`) {
		t.Errorf("whoami %d %s", rec.Code, rec.Body)
	}
}

// TestStreamsEndWithRun checks that an open event stream ends when the
// API's Run ends, so a graceful HTTP shutdown need not wait for it.
func TestStreamsEndWithRun(t *testing.T) {
	cli := etcdtest.New(t)
	a, err := api.New(cli, state.MustKeys(state.DefaultPrefix), api.Config{Auth: api.AuthConfig{HS256Secret: []byte(testSecret)}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- a.Run(ctx) }()
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	tok, _ := api.MintHS256([]byte(testSecret), api.TokenClaims{Subject: "ada", TTL: time.Hour}, time.Now())
	do := func(method, path string, body string) *http.Response {
		req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	resp := do("POST", "/api/v1/sessions", `{"kind":"notebook"}`)
	var v api.SessionView
	_ = json.NewDecoder(resp.Body).Decode(&v)
	resp.Body.Close()
	stream := do("GET", "/api/v1/sessions/"+v.ID+"/events", "")
	defer stream.Body.Close()
	br := bufio.NewReader(stream.Body)
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "id: ") {
		t.Fatalf("first line %q %v", line, err)
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	ended := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, br); close(ended) }()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		t.Fatal("the event stream outlived Run")
	}
}
