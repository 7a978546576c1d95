package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// TestProfileRefusedWhenUnusable: a profile whose sessions would all be
// refused at create is refused at the PUT, with the field and the reason,
// and nothing is stored; a usable profile is stored and creates from it
// pass.
func TestProfileRefusedWhenUnusable(t *testing.T) {
	h := newHarness(t, harnessOpts{registries: []string{"registry.example.com"}})
	root := h.token("root", "admin")
	ada := h.token("ada")
	h.addNode("gpu-1", "A100", 2)
	base := func(env map[string]string) map[string]any {
		return map[string]any{"kind": "notebook", "image": "registry.example.com/jupyter:1", "env": env,
			"resources": map[string]any{"gpus": 1, "cpuMilli": 2000, "memoryMiB": 8192}}
	}
	cases := []struct {
		name  string
		body  map[string]any
		field string
		says  string
	}{
		{"jupyter token", base(map[string]string{"JUPYTER_TOKEN": "fixed"}), "env.JUPYTER_TOKEN", "set by Voyager itself"},
		{"voyager variable", base(map[string]string{"VOYAGER_ARRAY_ID": "x"}), "env.VOYAGER_ARRAY_ID", "set by Voyager itself"},
		{"nul in a value", base(map[string]string{"A": "x\x00y"}), "env.A", "NUL byte"},
		{"value too long", base(map[string]string{"A": strings.Repeat("x", 40000)}), "env.A", "bytes, want at most"},
		{"registry not allowed", map[string]any{"kind": "batch", "image": "docker.io/library/python:3.12"}, "image", "registry"},
		{"memory below the minimum", map[string]any{"kind": "notebook", "image": "registry.example.com/jupyter:1", "resources": map[string]any{"memoryMiB": 8}}, "resources.memoryMiB", "at least"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := want(t, h.do("PUT", "/api/v1/profiles/broken", root, tc.body), http.StatusUnprocessableEntity).problem(t)
			found := false
			for _, e := range p.Errors {
				if e.Field == tc.field && strings.Contains(e.Message, tc.says) && strings.Contains(e.Message, "every session made from this profile would be refused") {
					found = true
				}
			}
			if !found {
				t.Errorf("PUT answered %+v; want field %s saying %q and why it matters", p, tc.field, tc.says)
			}
			if n := h.countKeys(h.keys.Profile("broken")); n != 0 {
				t.Errorf("the refused profile was stored (%d keys)", n)
			}
		})
	}
	// A batch profile without a command is usable: each create brings
	// its own. So is a profile without a kind.
	want(t, h.do("PUT", "/api/v1/profiles/batchy", root, map[string]any{"kind": "batch", "image": "registry.example.com/py:1", "env": map[string]string{"A": "1"}}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/profiles/kindless", root, map[string]any{"image": "registry.example.com/py:1"}), http.StatusOK)
	want(t, h.do("POST", "/api/v1/sessions", ada, map[string]any{"profile": "batchy", "command": []string{"python", "x.py"}}), http.StatusCreated)
	want(t, h.do("PUT", "/api/v1/profiles/ok", root, base(map[string]string{"HF_HOME": "/data"})), http.StatusOK)
	want(t, h.do("POST", "/api/v1/sessions", ada, map[string]any{"profile": "ok"}), http.StatusCreated)
}

// TestCordonUnknownNode: cordon and drain of a node that is neither
// registered nor has a ledger answer 404 and write nothing; a registered
// node, and one known only by its ledger (its agent is down), can be
// cordoned.
func TestCordonUnknownNode(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	root := h.token("root", "admin")
	h.addNode("gpu-1", "A100", 1)
	for _, verb := range []string{"cordon", "drain"} {
		p := want(t, h.do("POST", "/api/v1/nodes/gpu-9/"+verb, root, map[string]any{"reason": "typo"}), http.StatusNotFound).problem(t)
		if !strings.Contains(p.Detail, `no node "gpu-9"`) || !strings.Contains(p.Detail, "gpu-1") {
			t.Errorf("%s of an unknown node: %q; want it to name the node and the registered ones", verb, p.Detail)
		}
	}
	if n := h.countKeys(h.keys.Cordons()); n != 0 {
		t.Fatalf("refused cordons wrote %d keys", n)
	}
	want(t, h.do("POST", "/api/v1/nodes/gpu-1/cordon", root, nil), http.StatusOK)
	if _, err := state.Put(context.Background(), h.cli, h.keys.Ledger("gpu-down"), state.Ledger{Node: "gpu-down"}); err != nil {
		t.Fatal(err)
	}
	want(t, h.do("POST", "/api/v1/nodes/gpu-down/drain", root, nil), http.StatusOK)
	if n := h.countKeys(h.keys.Cordons()); n != 2 {
		t.Errorf("%d cordons, want 2 (gpu-1, gpu-down)", n)
	}
}

// TestInvalidPathNameRefused: a PUT of a profile, volume or team, and a
// cordon or drain, whose path names no valid record answer 422 with the
// field "path name" and write nothing.
func TestInvalidPathNameRefused(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	root := h.token("root", "admin")
	before := h.countKeys("/")
	for _, tc := range []struct{ method, path string }{
		{"PUT", "/api/v1/profiles/Not_A_Name"},
		{"PUT", "/api/v1/volumes/Not_A_Name"},
		{"PUT", "/api/v1/teams/Not_A_Name"},
		{"POST", "/api/v1/nodes/Not_A_Name/cordon"},
		{"POST", "/api/v1/nodes/Not_A_Name/drain"},
	} {
		p := want(t, h.do(tc.method, tc.path, root, map[string]any{}), http.StatusUnprocessableEntity).problem(t)
		if len(p.Errors) != 1 || p.Errors[0].Field != "path name" || !strings.Contains(p.Errors[0].Message, "Not_A_Name") {
			t.Errorf("%s %s: %+v; want one error of the field \"path name\" naming it", tc.method, tc.path, p)
		}
	}
	if after := h.countKeys("/"); after != before {
		t.Errorf("refused requests changed the key count from %d to %d", before, after)
	}
}
