package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// TestEnvValuesStayOutOfTheSpec: a create writes the environment values
// to specsecrets/<id>, not to the spec the operator and every agent read;
// the owner's views (the create's answer, a get, the list) show them,
// an admin's show none.
func TestEnvValuesStayOutOfTheSpec(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada, root := h.token("ada"), h.token("root", "admin")
	h.addNode("gpu-1", "A100", 2)
	req := notebook()
	req["env"] = map[string]string{"WANDB_API_KEY": "sk-ada-0123"}
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, req), http.StatusCreated))
	if v.Env["WANDB_API_KEY"] != "sk-ada-0123" {
		t.Errorf("the create's answer shows env %v", v.Env)
	}
	ctx := context.Background()
	raw, err := h.cli.Get(ctx, h.keys.Session(v.ID))
	if err != nil || len(raw.Kvs) != 1 {
		t.Fatal(err)
	}
	if strings.Contains(string(raw.Kvs[0].Value), "sk-ada-0123") {
		t.Errorf("the spec holds the value: %s", raw.Kvs[0].Value)
	}
	spec, _, _ := state.Get[state.Session](ctx, h.cli, h.keys.Session(v.ID))
	if !spec.SecretEnv || spec.Env["WANDB_API_KEY"] != "" {
		t.Errorf("spec env %v secretEnv %v", spec.Env, spec.SecretEnv)
	}
	if sec, _, err := state.Get[state.SpecSecrets](ctx, h.cli, h.keys.SpecSecrets(v.ID)); err != nil || sec.Env["WANDB_API_KEY"] != "sk-ada-0123" {
		t.Errorf("secrets record %+v %v", sec, err)
	}
	if q, _, err := state.Get[state.QueueEntry](ctx, h.cli, h.keys.Pending(v.ID)); err != nil || !q.Secrets {
		t.Errorf("queue entry %+v %v; want secrets: true", q, err)
	}
	g := decode[api.SessionView](t, want(t, h.do("GET", "/api/v1/sessions/"+v.ID, ada, nil), http.StatusOK))
	if g.Env["WANDB_API_KEY"] != "sk-ada-0123" || g.SecretEnv {
		t.Errorf("the owner's get shows env %v (secretEnv %v)", g.Env, g.SecretEnv)
	}
	if l := want(t, h.do("GET", "/api/v1/sessions", ada, nil), http.StatusOK); !strings.Contains(string(l.body), "sk-ada-0123") {
		t.Errorf("the owner's list lacks the value: %s", l.body)
	}
	if a := want(t, h.do("GET", "/api/v1/sessions/"+v.ID, root, nil), http.StatusOK); strings.Contains(string(a.body), "sk-ada-0123") {
		t.Errorf("an admin's view shows the value: %s", a.body)
	}
}
