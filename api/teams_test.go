package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// groupToken mints an HS256 token for sub in groups with roles.
func (h *harness) groupToken(sub string, groups []string, roles ...string) string {
	return h.sign(jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": sub, "groups": groups, "roles": roles, "aud": "voyager", "exp": time.Now().Add(time.Hour).Unix()})
}

// TestTeamsAdminAPI: admins define a tree of teams live; users read it and
// their own membership but cannot write it; every invalid tree is refused
// with the team and field named, writing nothing; a parent with teams
// below it cannot be deleted.
func TestTeamsAdminAPI(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	root := h.token("root", "admin")
	ada := h.groupToken("ada", []string{"cv"})
	put := func(tok, name string, body any) response {
		return h.do("PUT", "/api/v1/teams/"+name, tok, body)
	}
	want(t, put(root, "research", map[string]any{"guarantee": map[string]any{"gpus": 16}, "maxPriority": 50, "maxGPUs": 32}), http.StatusOK)
	v := decode[state.Team](t, want(t, put(root, "vision", map[string]any{"parent": "research", "groups": []string{"cv"}, "guarantee": map[string]any{"gpus": 8}, "weight": 2}), http.StatusOK))
	if v.Name != "vision" || v.By != "root" || v.Updated.IsZero() {
		t.Errorf("written team %+v: want name, by and updated set", v)
	}
	want(t, put(ada, "nlp", map[string]any{"parent": "research"}), http.StatusForbidden)

	for _, c := range []struct {
		name, team string
		body       map[string]any
		field, msg string
	}{
		{"unknown parent", "speech", map[string]any{"parent": "labs"}, "teams.speech.parent", `no team "labs"; create the parent first`},
		{"cycle", "research", map[string]any{"parent": "vision", "guarantee": map[string]any{"gpus": 16}}, "teams.research.parent", `"vision" makes a cycle (research → vision → research)`},
		{"guarantee over the parent's", "nlp", map[string]any{"parent": "research", "guarantee": map[string]any{"gpus": 9}}, "teams.research.guarantee.gpus", "its teams (nlp, vision) are guaranteed 17 GPUs together, more than its own 16"},
		{"priority above the parent's", "nlp", map[string]any{"parent": "research", "maxPriority": 80}, "teams.nlp.maxPriority", "got 80, above 50, the maximum of its parent (set by team research)"},
		{"a group of another team", "nlp", map[string]any{"parent": "research", "groups": []string{"cv"}}, "teams.vision.groups", `group "cv" is also named by team nlp; a group names one team`},
		{"bad budget action", "nlp", map[string]any{"parent": "research", "budget": map[string]any{"gpuHours": 10, "action": "warn"}}, "teams.nlp.budget.action", `got "warn"`},
		{"name mismatch", "nlp", map[string]any{"name": "other"}, "name", `got "other", want "nlp"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := want(t, put(root, c.team, c.body), http.StatusUnprocessableEntity).problem(t)
			if len(p.Errors) != 1 || p.Errors[0].Field != c.field || !strings.Contains(p.Errors[0].Message, c.msg) {
				t.Errorf("errors %+v, want one on %s saying %q", p.Errors, c.field, c.msg)
			}
		})
	}
	list := decode[api.TeamList](t, want(t, h.do("GET", "/api/v1/teams", ada, nil), http.StatusOK))
	if len(list.Items) != 2 || list.Items[0].Name != "research" || list.Items[0].Parent != "" || list.Items[1].Guarantee.GPUs != 8 {
		t.Fatalf("teams after refused writes: %+v", list.Items)
	}
	if list.Mine.Team != "vision" || strings.Join(list.Mine.Teams, ",") != "vision" {
		t.Errorf("ada's membership %+v, want vision", list.Mine)
	}
	want(t, h.do("GET", "/api/v1/teams/nope", ada, nil), http.StatusNotFound)
	p := want(t, h.do("DELETE", "/api/v1/teams/research", root, nil), http.StatusConflict).problem(t)
	if !strings.Contains(p.Detail, "it has teams below it (vision)") {
		t.Errorf("delete of a parent: %q", p.Detail)
	}
	want(t, h.do("DELETE", "/api/v1/teams/vision", ada, nil), http.StatusForbidden)
	want(t, h.do("DELETE", "/api/v1/teams/vision", root, nil), http.StatusNoContent)
	want(t, h.do("DELETE", "/api/v1/teams/vision", root, nil), http.StatusNotFound)
	if n := h.countKeys(h.keys.Teams()); n != 1 {
		t.Errorf("%d team keys left, want 1", n)
	}
}

// TestTeamPriorityCeiling: a user cannot give a session a priority above
// her team's maximum (inherited from its parent), an admin can; the
// session and its queue entry carry the team; a user names only a team of
// hers. Before any team exists, priority 90 is admitted, as it was.
func TestTeamPriorityCeiling(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.addNode("gpu-1", "A100", 8)
	root := h.token("root", "admin")
	ada := h.groupToken("ada", []string{"cv"})
	bob := h.groupToken("bob", []string{"misc"})
	nb := func(prio int, team string) map[string]any {
		b := notebook()
		b["priority"] = prio
		if team != "" {
			b["team"] = team
		}
		return b
	}
	// No teams: the range alone.
	if s := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, nb(90, "")), http.StatusCreated)); s.Team != "" {
		t.Errorf("a session with no teams defined has team %q", s.Team)
	}
	want(t, h.do("PUT", "/api/v1/teams/research", root, map[string]any{"maxPriority": 50, "guarantee": map[string]any{"gpus": 8}}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/teams/vision", root, map[string]any{"parent": "research", "groups": []string{"cv"}}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/teams/nlp", root, map[string]any{"parent": "research", "groups": []string{"text"}, "maxPriority": 10}), http.StatusOK)

	p := want(t, h.do("POST", "/api/v1/sessions", ada, nb(90, "")), http.StatusUnprocessableEntity).problem(t)
	if len(p.Errors) != 1 || p.Errors[0].Field != "priority" || p.Errors[0].Message != "got 90, above 50, the maximum team vision inherits from team research; ask for 50 or less, or ask an admin" {
		t.Errorf("priority above the team's: %+v", p.Errors)
	}
	s := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, nb(50, "")), http.StatusCreated))
	if s.Team != "vision" {
		t.Errorf("ada's session is charged to %q, want vision", s.Team)
	}
	q, _, err := state.Get[state.QueueEntry](context.Background(), h.cli, h.keys.Pending(s.ID))
	if err != nil || q.Team != "vision" {
		t.Errorf("queue entry %+v (%v): want team vision", q, err)
	}
	// An admin may exceed it.
	adm := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.groupToken("root", []string{"cv"}, "admin"), nb(90, "")), http.StatusCreated))
	if adm.Priority != 90 || adm.Team != "vision" {
		t.Errorf("admin's session: priority %d team %q", adm.Priority, adm.Team)
	}
	// A team that is not hers.
	p = want(t, h.do("POST", "/api/v1/sessions", ada, nb(0, "nlp")), http.StatusUnprocessableEntity).problem(t)
	if len(p.Errors) != 1 || p.Errors[0].Field != "team" || !strings.Contains(p.Errors[0].Message, `not a member of team "nlp"; you belong to vision`) {
		t.Errorf("a team not hers: %+v", p.Errors)
	}
	// Bob is in no team and there is no default: uncharged, the range alone.
	if s := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", bob, nb(90, "")), http.StatusCreated)); s.Team != "" {
		t.Errorf("bob's session has team %q", s.Team)
	}
	// With a default team, bob's sessions go there under its ceiling.
	want(t, h.do("PUT", "/api/v1/teams/guests", root, map[string]any{"default": true, "maxPriority": 0}), http.StatusOK)
	p = want(t, h.do("POST", "/api/v1/sessions", bob, nb(1, "")), http.StatusUnprocessableEntity).problem(t)
	if len(p.Errors) != 1 || !strings.Contains(p.Errors[0].Message, "got 1, above 0, team guests's maximum") {
		t.Errorf("bob over the default team's ceiling: %+v", p.Errors)
	}
	if s := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", bob, nb(0, "")), http.StatusCreated)); s.Team != "guests" {
		t.Errorf("bob's session has team %q, want guests", s.Team)
	}
}

// TestConcurrentTeamWritesAllLand: four admins write four teams at once.
// Each write compares the whole tree it was checked on, so all but one
// of a round are refused by etcd; the API reads the tree again and
// retries (writeTeams), and every write lands: each refusal means another
// writer's write landed in between, at most three times.
func TestConcurrentTeamWritesAllLand(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	root := h.token("root", "admin")
	codes := make(chan int, 4)
	for i := range 4 {
		go func() {
			codes <- h.do("PUT", fmt.Sprintf("/api/v1/teams/t%d", i), root, map[string]any{"guarantee": map[string]any{"gpus": 1}}).status
		}()
	}
	for range 4 {
		if code := <-codes; code != http.StatusOK {
			t.Errorf("a concurrent team write answered %d, want 200", code)
		}
	}
	list := decode[api.TeamList](t, want(t, h.do("GET", "/api/v1/teams", root, nil), http.StatusOK))
	if len(list.Items) != 4 {
		t.Errorf("%d teams, want the 4 written: %+v", len(list.Items), list.Items)
	}
}
