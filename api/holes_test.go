package api_test

import (
	"strings"
	"testing"
)

// TestAdmissionClosesHoles: what a node would fail at start or should never
// be asked to do is refused at create, with what was wrong and what would
// be right, and nothing is written. (Limits too small to enforce:
// TestAdmissionBounds.)
func TestAdmissionClosesHoles(t *testing.T) {
	h := newHarness(t, harnessOpts{registries: []string{"docker.io", "registry.example.com:5000"}})
	ada := h.token("ada")
	for _, tc := range []struct {
		name  string
		body  map[string]any
		field string
		msg   string
	}{
		{"NUL in an argument", map[string]any{"kind": "batch", "command": []string{"echo", "a\x00b"}}, "command[1]", "NUL byte"},
		{"NUL in env", map[string]any{"kind": "batch", "command": []string{"true"}, "env": map[string]any{"X": "a\x00"}}, "env.X", "NUL byte"},
		{"dot-dot image", map[string]any{"kind": "batch", "command": []string{"true"}, "image": "docker.io/library/../../etc:1"}, "image", `".." segment`},
		{"registry not allowed", map[string]any{"kind": "batch", "command": []string{"true"}, "image": "evil.example.net:8080/x:1"}, "image", "registry evil.example.net:8080 is not allowed here; want an image from docker.io, registry.example.com:5000"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := want(t, h.do("POST", "/api/v1/sessions", ada, tc.body), 422).problem(t)
			found := false
			for _, f := range p.Errors {
				if f.Field == tc.field && strings.Contains(f.Message, tc.msg) {
					found = true
				}
			}
			if !found {
				t.Errorf("errors %+v; want %s: …%s…", p.Errors, tc.field, tc.msg)
			}
		})
	}
	if n := h.countKeys(h.keys.All()); n != 0 {
		t.Errorf("%d keys written by refused requests", n)
	}
	// Allowed registries, short names included (docker.io), pass.
	for _, img := range []string{"busybox", "registry.example.com:5000/team/img:2"} {
		want(t, h.do("POST", "/api/v1/sessions", ada, map[string]any{"kind": "batch", "command": []string{"true"}, "image": img}), 201)
	}
}

// TestQueuedSessionsPerUserCapped: a user with the most queued sessions
// allowed is refused another; another user is not.
func TestQueuedSessionsPerUserCapped(t *testing.T) {
	h := newHarness(t, harnessOpts{maxQueued: 2})
	ada, bob := h.token("ada"), h.token("bob")
	body := map[string]any{"kind": "batch", "command": []string{"true"}}
	want(t, h.do("POST", "/api/v1/sessions", ada, body), 201)
	want(t, h.do("POST", "/api/v1/sessions", ada, body), 201)
	p := want(t, h.do("POST", "/api/v1/sessions", ada, body), 422).problem(t)
	if len(p.Errors) != 1 || !strings.Contains(p.Errors[0].Message, "you have 2 sessions queued, the most allowed per user is 2") {
		t.Errorf("third create: %+v", p)
	}
	want(t, h.do("POST", "/api/v1/sessions", bob, body), 201)
}
