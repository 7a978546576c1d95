package console_test

import (
	"context"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// startedID is the session id in a console form's answer.
func startedID(body string) string {
	return strings.TrimSuffix(strings.Fields(strings.SplitN(body, "session ", 2)[1])[0], ":")
}

// TestConsoleRoughEdges: "1 node", not "1 nodes"; Extend offered only
// for a session that has a max runtime to extend; history says why a
// start failed and that a stop was asked for, not only its exit code 137.
func TestConsoleRoughEdges(t *testing.T) {
	e := newEnv(t, etcdtest.New(t))
	e.addNode("n1", "A100", 2)
	ada := e.token("ada")
	r := e.get("/console/view/cluster", ada)
	wantCode(t, r, 200, "<p>1 node · ")
	if strings.Contains(r.body, "1 nodes") {
		t.Errorf("cluster view says 1 nodes")
	}

	limited := startedID(e.post("/console/do/sessions", ada, url.Values{"kind": {"batch"}, "command": {"sleep 60"}, "maxRuntime": {"2h"}}).body)
	open := startedID(e.post("/console/do/sessions", ada, url.Values{"kind": {"batch"}, "command": {"sleep 60"}}).body)
	e.waitFor("both sessions listed", func() bool {
		b := e.get("/console/view/sessions", ada).body
		return strings.Contains(b, `data-session="`+limited+`"`) && strings.Contains(b, `data-session="`+open+`"`)
	})
	b := e.get("/console/view/sessions", ada).body
	if !strings.Contains(b, `data-action="/console/do/sessions/`+limited+`/extend"`) {
		t.Errorf("no Extend for %s, which has a max runtime", limited)
	}
	if strings.Contains(b, `data-action="/console/do/sessions/`+open+`/extend"`) {
		t.Errorf("Extend offered for %s, which has no max runtime to extend", open)
	}

	ctx := context.Background()
	now := time.Now().UTC()
	code := 137
	for id, st := range map[string]state.Status{
		limited: {Session: limited, Phase: state.PhaseFailed, Reason: "StartFailed", Message: "pull image registry.example/x:1: registry unreachable: the registry's name does not resolve", Finished: &now},
		open:    {Session: open, Phase: state.PhaseStopped, Reason: "StopRequested", Message: "stopped on request", ExitCode: &code, Finished: &now},
	} {
		if _, err := state.Put(ctx, e.cli, e.keys.Status(id), st); err != nil {
			t.Fatal(err)
		}
	}
	e.waitFor("history", func() bool {
		b := e.get("/console/view/history", ada).body
		return strings.Contains(b, `data-session="`+limited+`"`) && strings.Contains(b, `data-session="`+open+`"`)
	})
	wantCode(t, e.get("/console/view/history", ada), 200,
		`<small data-field="message">pull image registry.example/x:1: registry unreachable: the registry&#39;s name does not resolve</small>`,
		`137 <small data-field="stopped">(stopped on request, not a failure)</small>`)
}

// TestConsoleHubServers: a server JupyterHub started opens through the
// hub (its base URL /user/<name>/, where the hub authenticates), not at
// the container's own address, which answers 404 outside the hub's base
// URL; and it is stopped through the hub, which would otherwise believe it
// still runs. Without the hub's URL the console says to use the hub.
func TestConsoleHubServers(t *testing.T) {
	e := newEnv(t, etcdtest.New(t))
	e.addNode("n1", "A100", 1)
	ada := e.token("ada")
	ctx := context.Background()
	now := time.Now().UTC()
	mk := func(id string, env map[string]string) {
		s := state.Session{ID: id, Owner: "ada", Kind: state.KindNotebook, Image: "voyager.local/jupyter:latest", Env: env,
			Resources: state.Resources{CPUMilli: 1000, MemoryMiB: 1024}, Desired: state.DesiredRunning, Created: now}
		st := state.Status{Session: id, Phase: state.PhaseRunning, Reason: "Started", Nodes: []string{"n1"}, Started: &now,
			URLs: map[string]string{"jupyter": "http://10.0.0.1:40001/?token=t0ken"}}
		if _, err := state.Put(ctx, e.cli, e.keys.Session(id), s); err != nil {
			t.Fatal(err)
		}
		if _, err := state.Put(ctx, e.cli, e.keys.Status(id), st); err != nil {
			t.Fatal(err)
		}
	}
	mk("hub-linked", map[string]string{"JUPYTERHUB_SERVICE_PREFIX": "/user/ada/", "JUPYTERHUB_PUBLIC_URL": "https://hub.example.org/user/ada/",
		"JUPYTERHUB_PUBLIC_HUB_URL": "https://hub.example.org/hub/"})
	mk("hub-plain", map[string]string{"JUPYTERHUB_SERVICE_PREFIX": "/user/ada/"})
	mk("own", nil)
	var b string
	e.waitFor("three sessions", func() bool {
		b = e.get("/console/view/sessions", ada).body
		return strings.Contains(b, `data-session="hub-linked"`) && strings.Contains(b, `data-session="hub-plain"`) && strings.Contains(b, `data-session="own"`)
	})
	row := func(id string) string {
		i := strings.Index(b, `data-session="`+id+`"`)
		j := strings.Index(b[i:], "</tr>")
		return b[i : i+j]
	}
	hub, plain, own := row("hub-linked"), row("hub-plain"), row("own")
	for _, want := range []string{`<a href="https://hub.example.org/user/ada/" target="_blank" rel="noopener">Jupyter</a> <small>(through JupyterHub)</small>`,
		`href="https://hub.example.org/hub/home" target="_blank" rel="noopener">Stop in JupyterHub</a>`} {
		if !strings.Contains(hub, want) {
			t.Errorf("hub-linked row lacks %s:\n%s", want, hub)
		}
	}
	for _, r := range []string{hub, plain} {
		if strings.Contains(r, "10.0.0.1:40001") || strings.Contains(r, "/console/do/sessions/hub-") {
			t.Errorf("a hub server's row links its container or stops it behind the hub's back:\n%s", r)
		}
	}
	if !strings.Contains(plain, "open it from JupyterHub") || !strings.Contains(plain, "stop it there") {
		t.Errorf("hub-plain row:\n%s", plain)
	}
	if !strings.Contains(own, `href="http://10.0.0.1:40001/?token=t0ken"`) || !strings.Contains(own, `data-action="/console/do/sessions/own/stop"`) {
		t.Errorf("own row:\n%s", own)
	}
}
