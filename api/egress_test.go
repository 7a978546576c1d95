package api_test

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// TestEgressFromProfileBindsItsSessions: a profile that denies egress
// passes the denial to every session made from it; an owner may narrow the
// profile's allow list but not widen it nor lift the denial; malformed
// networks are refused at admission with the right form named, and nothing
// is written for a refused request.
func TestEgressFromProfileBindsItsSessions(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	root, ada := h.token("root", "admin"), h.token("ada")

	// The profile's own rule is validated.
	p := want(t, h.do("PUT", "/api/v1/profiles/sealed", root, map[string]any{
		"kind": "batch", "egress": map[string]any{"deny": true, "allow": []string{"10.20.0.1/16"}},
	}), http.StatusUnprocessableEntity).problem(t)
	if len(p.Errors) != 1 || p.Errors[0].Field != "egress.allow[0]" || !strings.Contains(p.Errors[0].Message, `want "10.20.0.0/16"`) {
		t.Fatalf("profile with host bits: %+v", p.Errors)
	}
	want(t, h.do("PUT", "/api/v1/profiles/sealed", root, map[string]any{
		"kind": "batch", "egress": map[string]any{"deny": true, "allow": []string{"10.20.0.0/16", "192.0.2.7/32"}},
	}), http.StatusOK)

	job := func(egress any) map[string]any {
		r := map[string]any{"profile": "sealed", "command": []string{"true"}, "resources": map[string]any{"cpuMilli": 200, "memoryMiB": 128}}
		if egress != nil {
			r["egress"] = egress
		}
		return r
	}
	created := func(body map[string]any) state.Egress {
		t.Helper()
		s := decode[struct {
			ID string `json:"id"`
		}](t, want(t, h.do("POST", "/api/v1/sessions", ada, body), http.StatusCreated))
		spec, _, err := state.Get[state.Session](t.Context(), h.cli, h.keys.Session(s.ID))
		if err != nil || spec.Egress == nil {
			t.Fatalf("stored spec of %s: %+v, %v; want an egress rule", s.ID, spec.Egress, err)
		}
		return *spec.Egress
	}
	// Left out: the profile's rule.
	if got := created(job(nil)); !got.Deny || !reflect.DeepEqual(got.Allow, []string{"10.20.0.0/16", "192.0.2.7/32"}) {
		t.Errorf("session of the profile: egress %+v, want the profile's", got)
	}
	// Narrowed: a network inside one the profile allows.
	if got := created(job(map[string]any{"deny": true, "allow": []string{"10.20.3.0/24"}})); !got.Deny || !reflect.DeepEqual(got.Allow, []string{"10.20.3.0/24"}) {
		t.Errorf("narrowed: egress %+v", got)
	}

	before := h.countKeys(h.keys.Prefix())
	for _, c := range []struct {
		name, field, text string
		egress            any
	}{
		{"lifted", "egress.deny", `profile "sealed" denies egress`, map[string]any{"deny": false}},
		{"widened", "egress.allow[0]", "not among those profile \"sealed\" allows (10.20.0.0/16, 192.0.2.7/32)", map[string]any{"deny": true, "allow": []string{"10.0.0.0/8"}}},
		{"not a network", "egress.allow[0]", "want an IPv4 network in CIDR form", map[string]any{"deny": true, "allow": []string{"mirror.example.org"}}},
		{"allow without deny", "egress.allow", `set "deny": true`, map[string]any{"allow": []string{"10.20.0.0/16"}}},
	} {
		p := want(t, h.do("POST", "/api/v1/sessions", ada, job(c.egress)), http.StatusUnprocessableEntity).problem(t)
		found := false
		for _, e := range p.Errors {
			found = found || e.Field == c.field && strings.Contains(e.Message, c.text)
		}
		if !found {
			t.Errorf("%s: errors %+v, want %s: …%s…", c.name, p.Errors, c.field, c.text)
		}
	}
	if after := h.countKeys(h.keys.Prefix()); after != before {
		t.Errorf("refused requests wrote keys: %d before, %d after", before, after)
	}

	// Without a denying profile an owner may deny egress of their own.
	r := map[string]any{"kind": "batch", "command": []string{"true"}, "egress": map[string]any{"deny": true}}
	s := decode[struct {
		ID string `json:"id"`
	}](t, want(t, h.do("POST", "/api/v1/sessions", ada, r), http.StatusCreated))
	spec, _, err := state.Get[state.Session](t.Context(), h.cli, h.keys.Session(s.ID))
	if err != nil || spec.Egress == nil || !spec.Egress.Deny || len(spec.Egress.Allow) != 0 {
		t.Errorf("owner's own denial: %+v, %v", spec.Egress, err)
	}
}
