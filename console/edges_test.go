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
