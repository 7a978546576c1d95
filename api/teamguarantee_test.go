package api_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// TestTeamGuaranteeByModelValidated: an admin defines a guarantee by GPU
// model ({"gpus": 12, "models": {"H100": 8}}) and reads it back; every
// other shape or value is refused with a 422 naming the field, what was
// sent and what to send — the models alone with the guarantee they most
// likely mean — writing nothing.
func TestTeamGuaranteeByModelValidated(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	root := h.token("root", "admin")
	for _, c := range []struct {
		name      string
		guarantee any
		field     string
		msg       string
	}{
		{"the models alone", map[string]any{"H100": 8, "A100": 4}, "teams.vision.guarantee",
			`unknown field "A100", "H100"; a guarantee is {"gpus": N, "models": {"MODEL": N}}, such as {"gpus": 12, "models": {"H100": 8}} (12 GPUs, 8 of them H100s); for these GPUs by model, send {"gpus":12,"models":{"A100":4,"H100":8}}`},
		{"a bare number", 8, "teams.vision.guarantee", `got 8, want an object such as {"gpus": 12, "models": {"H100": 8}}`},
		{"a fraction of a GPU", map[string]any{"gpus": 1.5}, "teams.vision.guarantee.gpus", "got 1.5, want a whole number of GPUs, 0 or more"},
		{"a count as a string", map[string]any{"gpus": 8, "models": map[string]any{"H100": "8"}}, "teams.vision.guarantee.models.H100", `got "8", want a whole number of H100 GPUs`},
		{"models as a list", map[string]any{"gpus": 8, "models": []string{"H100"}}, "teams.vision.guarantee.models", `got ["H100"], want an object of GPU model to a whole number of GPUs`},
		{"models without gpus", map[string]any{"models": map[string]any{"H100": 8}}, "teams.vision.guarantee.gpus", `missing: models name part of gpus, which is the guarantee in all; send "gpus": 8 or more`},
		{"a negative model count", map[string]any{"gpus": 8, "models": map[string]any{"H100": -1}}, "teams.vision.guarantee.models[H100]", "got -1, want 0 or more"},
		{"models beyond the total", map[string]any{"gpus": 8, "models": map[string]any{"H100": 6, "A100": 4}}, "teams.vision.guarantee.models", "they sum to 10 GPUs, more than guarantee.gpus (8); raise guarantee.gpus to at least 10"},
		{"a negative total", map[string]any{"gpus": -2}, "teams.vision.guarantee.gpus", "got -2, want 0 or more"},
		{"a bad model pattern", map[string]any{"gpus": 8, "models": map[string]any{"[H100": 8}}, "teams.vision.guarantee.models", `model "[H100": not a valid pattern`},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := want(t, h.do("PUT", "/api/v1/teams/vision", root, map[string]any{"guarantee": c.guarantee}), http.StatusUnprocessableEntity).problem(t)
			found := false
			for _, e := range p.Errors {
				found = found || e.Field == c.field && strings.Contains(e.Message, c.msg)
			}
			if !found {
				t.Errorf("errors %+v, want one on %s saying %q", p.Errors, c.field, c.msg)
			}
		})
	}
	if n := h.countKeys(h.keys.Teams()); n != 0 {
		t.Fatalf("%d team keys after refused writes, want 0", n)
	}
	body := map[string]any{"guarantee": map[string]any{"gpus": 12, "models": map[string]any{"H100": 8}}}
	want(t, h.do("PUT", "/api/v1/teams/vision", root, body), http.StatusOK)
	got := decode[state.Team](t, want(t, h.do("GET", "/api/v1/teams/vision", root, nil), http.StatusOK))
	if got.Guarantee.GPUs != 12 || len(got.Guarantee.Models) != 1 || got.Guarantee.Models["H100"] != 8 {
		t.Fatalf("guarantee read back %+v, want 12 GPUs, 8 of them H100", got.Guarantee)
	}
}
