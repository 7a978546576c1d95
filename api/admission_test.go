package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/voyager-gpu/voyager/api"
)

// TestAdmissionBounds is findings 2 and 8 of issue 11: a request the
// placers could never bind in one transaction (a Ray gang of 63 or more
// workers with etcd's default 128 operations), or one so small that
// thousands would fit a node (1 milli-core, 1 MiB), is refused at the API
// with the limit named. Before, 64 workers and 1 milli-core were accepted:
// the gang was planned and deferred every pass without end, and tiny
// sessions could grow a node's ledger toward etcd's 1.5 MiB request limit.
func TestAdmissionBounds(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	for _, c := range []struct {
		name      string
		edit      func(map[string]any)
		wantField string
		wantText  string
	}{
		{"gang beyond one transaction", func(r map[string]any) { r["ray"] = map[string]any{"workers": 42} },
			"ray.workers", "got 42, want at most 41"},
		{"gang at the api's old cap", func(r map[string]any) { r["ray"] = map[string]any{"workers": 64} },
			"ray.workers", "VOYAGER_PLACER_MAX_TXN_OPS"},
		{"gang beyond every cap", func(r map[string]any) { r["ray"] = map[string]any{"workers": 1000} },
			"ray.workers", "got 1000, want at most 41"},
		{"cpu below the minimum", func(r map[string]any) {
			r["resources"] = map[string]any{"gpus": 0, "cpuMilli": 1, "memoryMiB": 1024}
		}, "resources.cpuMilli", "got 1, want at least 100 (the cluster's minimum, VOYAGER_MIN_CPU_MILLI)"},
		{"memory below the minimum", func(r map[string]any) {
			r["resources"] = map[string]any{"gpus": 0, "cpuMilli": 1000, "memoryMiB": 1}
		}, "resources.memoryMiB", "VOYAGER_MIN_MEMORY_MIB"},
		{"worker below the minimum", func(r map[string]any) {
			r["ray"] = map[string]any{"workers": 1, "workerResources": map[string]any{"gpus": 1}}
		}, "ray.workerResources.cpuMilli", "got 0, want at least 100"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := notebook()
			c.edit(r)
			wantFieldError(t, want(t, h.do("POST", "/api/v1/sessions", ada, r), http.StatusUnprocessableEntity).problem(t), c.wantField, c.wantText)
		})
	}
	// The largest gang that fits one transaction is admitted.
	r := notebook()
	r["ray"] = map[string]any{"workers": 41}
	want(t, h.do("POST", "/api/v1/sessions", ada, r), http.StatusCreated)

	// Groups are repeated in every allocation of a node's ledger: a token
	// with a kilobyte of them is refused, with the claim named.
	var groups []string
	for i := 0; i < 100; i++ {
		groups = append(groups, "a-rather-long-group-name-"+strings.Repeat("x", 5))
	}
	many := h.sign(jwt.SigningMethodHS256, []byte(testSecret), jwt.MapClaims{"sub": "bob", "groups": groups, "aud": "voyager", "exp": time.Now().Add(time.Hour).Unix()})
	p := want(t, h.do("POST", "/api/v1/sessions", many, notebook()), http.StatusUnprocessableEntity).problem(t)
	if !strings.Contains(p.Detail, "VOYAGER_JWT_GROUPS_CLAIM") {
		t.Errorf("groups: %q", p.Detail)
	}
}

// wantFieldError fails unless p has an error on field whose message holds
// text.
func wantFieldError(t *testing.T, p api.Problem, field, text string) {
	t.Helper()
	for _, e := range p.Errors {
		if e.Field == field && strings.Contains(e.Message, text) {
			return
		}
	}
	t.Errorf("errors %+v, want %s: …%s…", p.Errors, field, text)
}
