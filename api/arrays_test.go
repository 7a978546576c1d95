package api_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// sweep is a valid array request with fields changed by edit.
func sweep(edit func(m map[string]any)) map[string]any {
	m := map[string]any{"command": []string{"python", "train.py", "--seed", "{index}"}, "indices": "0-99", "maxRunning": 10,
		"resources": map[string]any{"gpus": 1, "cpuMilli": 1000, "memoryMiB": 1024}}
	if edit != nil {
		edit(m)
	}
	return m
}

// TestArrayAdmission: a bad array is refused at once with what was wrong
// and what would be right, and leaves nothing in etcd: no array, no
// session.
func TestArrayAdmission(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.addNode("sw-n1", "NVIDIA A100-SXM4-80GB", 8)
	ada := h.token("ada")
	for _, tc := range []struct {
		name, field, msg string
		edit             func(m map[string]any)
	}{
		{"no indices", "indices", "want an index set such as", func(m map[string]any) { delete(m, "indices") }},
		{"bad index set", "indices", `range "9-1" runs backwards`, func(m map[string]any) { m["indices"] = "0-3,9-1" }},
		{"too many elements", "indices", "more than 1000 elements", func(m map[string]any) { m["indices"] = "0-20000" }},
		{"indices and params", "params", "not both", func(m map[string]any) { m["params"] = []string{"a"} }},
		{"empty params", "params", "empty", func(m map[string]any) { delete(m, "indices"); m["params"] = []string{} }},
		{"param without params", "command", "{param}", func(m map[string]any) { m["command"] = []string{"train", "{param}"} }},
		{"negative cap", "maxRunning", "want 0 (no cap) or more", func(m map[string]any) { m["maxRunning"] = -1 }},
		{"a notebook", "kind", "batch", func(m map[string]any) { m["kind"] = "notebook" }},
		{"no command", "command", "", func(m map[string]any) { delete(m, "command") }},
		{"more GPUs than any node", "resources", "no node can ever hold", func(m map[string]any) { m["resources"] = map[string]any{"gpus": 16} }},
		{"a gang on more machines than there are", "nodes", "no node can ever hold", func(m map[string]any) { m["nodes"] = 3 }},
		{"onPartFailure without nodes", "onPartFailure", "applies to multi-node jobs only", func(m map[string]any) { m["onPartFailure"] = "Continue" }},
		{"a param too large after substitution", "element 1: env.P", "after substitution", func(m map[string]any) {
			delete(m, "indices")
			m["params"] = []string{"x", strings.Repeat("y", 40<<10)}
			m["env"] = map[string]string{"P": "{param}"}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := h.do("POST", "/api/v1/arrays", ada, sweep(tc.edit))
			if r.status != 422 && r.status != 400 {
				t.Fatalf("status %d, want 422: %s", r.status, r.body)
			}
			p := r.problem(t)
			found := false
			for _, e := range p.Errors {
				if strings.HasPrefix(e.Field, tc.field) && strings.Contains(e.Message, tc.msg) {
					found = true
				}
			}
			if !found {
				t.Errorf("problem %+v names no field %s with %q", p, tc.field, tc.msg)
			}
			if n := h.countKeys(h.keys.Arrays()) + h.countKeys(h.keys.Sessions()); n != 0 {
				t.Errorf("%d keys written by a refused request", n)
			}
		})
	}
}

// TestArrayQueuedLimit: an array counts against the per-user limit of
// queued sessions as many as it may hold unfinished at once.
func TestArrayQueuedLimit(t *testing.T) {
	h := newHarness(t, harnessOpts{maxQueued: 12})
	ada := h.token("ada")
	want(t, h.do("POST", "/api/v1/sessions", ada, map[string]any{"kind": "batch", "command": []string{"true"}}), 201)
	want(t, h.do("POST", "/api/v1/sessions", ada, map[string]any{"kind": "batch", "command": []string{"true"}}), 201)
	p := want(t, h.do("POST", "/api/v1/arrays", ada, sweep(func(m map[string]any) { m["maxRunning"] = 11 })), 422).problem(t)
	if len(p.Errors) != 1 || p.Errors[0].Field != "maxRunning" || !strings.Contains(p.Errors[0].Message, "lower maxRunning to 10 or less") {
		t.Errorf("problem %+v", p)
	}
	if n := h.countKeys(h.keys.Arrays()); n != 0 {
		t.Errorf("%d arrays written by a refused request", n)
	}
	v := decode[api.ArrayView](t, want(t, h.do("POST", "/api/v1/arrays", ada, sweep(nil)), 201))
	if v.MaxRunning != 10 || v.Summary.Size != 100 || v.Summary.Waiting != 100 || v.Owner != "ada" || v.Template.Command[3] != "{index}" {
		t.Errorf("created %+v", v)
	}
	// No cap: the array may queue all 100 at once, over the limit.
	want(t, h.do("POST", "/api/v1/arrays", ada, sweep(func(m map[string]any) { delete(m, "maxRunning") })), 422)
}

// TestArrayVisibilityAndStop: only the owner (and admins) see an array;
// a stop before any element exists skips them all and ends the array.
func TestArrayVisibilityAndStop(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada, bob, root := h.token("ada"), h.token("bob"), h.token("root", "admin")
	v := decode[api.ArrayView](t, want(t, h.do("POST", "/api/v1/arrays", ada, sweep(func(m map[string]any) {
		delete(m, "indices")
		m["params"] = []string{"lr=0.1", "lr=0.01", "lr=0.001"}
		m["command"] = []string{"train", "--{param}"}
	})), 201))
	if v.Indices != "0-2" || v.Summary.Size != 3 || v.MaxRunning != 3 {
		t.Errorf("params array: %+v", v)
	}
	want(t, h.do("GET", "/api/v1/arrays/"+v.ID, bob, nil), 404)
	want(t, h.do("POST", "/api/v1/arrays/"+v.ID+"/stop", bob, nil), 404)
	if l := decode[api.ArrayList](t, want(t, h.do("GET", "/api/v1/arrays", bob, nil), 200)); len(l.Items) != 0 {
		t.Errorf("bob lists %d arrays", len(l.Items))
	}
	if l := decode[api.ArrayList](t, want(t, h.do("GET", "/api/v1/arrays", root, nil), 200)); len(l.Items) != 1 {
		t.Errorf("an admin lists %d arrays, want 1", len(l.Items))
	}
	sr := decode[api.ArrayStopResult](t, want(t, h.do("POST", "/api/v1/arrays/"+v.ID+"/stop", ada, nil), 202))
	if sr.Array.Stop == nil || sr.Array.Stop.By != "ada" || sr.Stopping != 0 || sr.Array.Summary.Skipped != 3 {
		t.Errorf("stop: %+v", sr)
	}
	a, _, err := state.Get[state.Array](t.Context(), h.cli, h.keys.Array(v.ID))
	if err != nil || a.Stop == nil || a.Next != 0 {
		t.Errorf("record after the stop: %+v, %v", a, err)
	}
	// A second stop changes nothing.
	sr = decode[api.ArrayStopResult](t, want(t, h.do("POST", "/api/v1/arrays/"+v.ID+"/stop", ada, nil), 202))
	if !sr.Array.Stop.At.Equal(a.Stop.At) {
		t.Errorf("a second stop moved the stop time")
	}
}

// TestArrayMountsItsVolumes: an array's elements mount the volumes its
// request names, resolved at admission as a session's are (a per-user
// path made the owner's); a volume the owner may not use is refused with
// nothing written.
func TestArrayMountsItsVolumes(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.addNode("sw-n1", "NVIDIA A100-SXM4-80GB", 8)
	admin, ada := h.token("root", "admin"), h.token("ada")
	want(t, h.do("PUT", "/api/v1/volumes/sw-results", admin, map[string]any{"hostPath": "/srv/results/{user}", "perUser": true}), http.StatusOK)
	want(t, h.do("PUT", "/api/v1/volumes/sw-bobs", admin, map[string]any{"hostPath": "/srv/bob", "users": []string{"bob"}}), http.StatusOK)

	r := h.do("POST", "/api/v1/arrays", ada, sweep(func(m map[string]any) {
		m["volumes"] = []map[string]any{{"name": "sw-bobs", "mountPath": "/data"}}
	}))
	if r.status != http.StatusUnprocessableEntity || !strings.Contains(string(r.body), "sw-bobs") {
		t.Fatalf("an array naming another user's volume: %d %s, want 422 naming it", r.status, r.body)
	}
	if n := h.countKeys(h.keys.Arrays()); n != 0 {
		t.Errorf("%d arrays written by a refused request", n)
	}
	v := decode[api.ArrayView](t, want(t, h.do("POST", "/api/v1/arrays", ada, sweep(func(m map[string]any) {
		m["volumes"] = []map[string]any{{"name": "sw-results", "mountPath": "/results"}}
	})), http.StatusCreated))
	arr, _, err := state.Get[state.Array](t.Context(), h.cli, h.keys.Array(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	if vs := arr.Template.Volumes; len(vs) != 1 || vs[0].MountPath != "/results" || vs[0].HostPath != "/srv/results/ada" {
		t.Errorf("the array's template mounts %+v; want sw-results at /results from /srv/results/ada", vs)
	}
}

// TestArrayIdempotencyKey: an array's create follows the sessions'
// Idempotency-Key contract. A repeat with the same key and body returns
// the first array (201, Idempotent-Replayed) and writes nothing; repeats
// racing each other make one array; the same key with another body, or a
// key that made a session, is refused with 422 naming what it made; once
// the array is gone (retired), the repeat is a 409.
func TestArrayIdempotencyKey(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	r1 := want(t, h.do("POST", "/api/v1/arrays", ada, sweep(nil), "Idempotency-Key", "arr-k1"), 201)
	r2 := want(t, h.do("POST", "/api/v1/arrays", ada, sweep(nil), "Idempotency-Key", "arr-k1"), 201)
	v1, v2 := decode[api.ArrayView](t, r1), decode[api.ArrayView](t, r2)
	if v1.ID != v2.ID || r2.header.Get("Idempotent-Replayed") != "true" || r1.header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("repeat made %s (replayed %q), want %s", v2.ID, r2.header.Get("Idempotent-Replayed"), v1.ID)
	}
	if v2.Summary.Size != 100 || v2.MaxRunning != 10 || r2.header.Get("Location") != "/api/v1/arrays/"+v1.ID {
		t.Errorf("replayed view %+v, location %q", v2, r2.header.Get("Location"))
	}
	if n := h.countKeys(h.keys.Arrays()); n != 1 {
		t.Fatalf("%d arrays after a repeat, want 1", n)
	}

	// Eight creates with one new key at once: one array; each answer is it.
	body, _ := json.Marshal(sweep(func(m map[string]any) { m["indices"] = "0-9" }))
	ids := make(chan string, 8)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", h.srv.URL+"/api/v1/arrays", bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+ada)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", "arr-k2")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var v api.ArrayView
			if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != 201 {
				t.Errorf("racing create: status %d (%v)", resp.StatusCode, err)
				return
			}
			ids <- v.ID
		})
	}
	wg.Wait()
	close(ids)
	first := ""
	for id := range ids {
		if first == "" {
			first = id
		}
		if id != first {
			t.Errorf("racing creates with one key answered arrays %s and %s", first, id)
		}
	}
	if n := h.countKeys(h.keys.Arrays()); n != 2 {
		t.Fatalf("%d arrays after eight racing creates with one key, want 2 in all", n)
	}

	// The same key with another body: refused, naming the first array.
	p := want(t, h.do("POST", "/api/v1/arrays", ada, sweep(func(m map[string]any) { m["maxRunning"] = 5 }), "Idempotency-Key", "arr-k1"), 422).problem(t)
	if !strings.Contains(p.Detail, "already created array "+v1.ID+" with a different request body") {
		t.Errorf("other body: detail %q", p.Detail)
	}
	// A key that made a session: refused, even with no other difference.
	s := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, map[string]any{"kind": "batch", "command": []string{"true"}}, "Idempotency-Key", "arr-k3"), 201))
	p = want(t, h.do("POST", "/api/v1/arrays", ada, sweep(nil), "Idempotency-Key", "arr-k3"), 422).problem(t)
	if !strings.Contains(p.Detail, "already created session "+s.ID+" through the other route") {
		t.Errorf("session's key: detail %q", p.Detail)
	}
	// And the reverse.
	p = want(t, h.do("POST", "/api/v1/sessions", ada, map[string]any{"kind": "batch", "command": []string{"true"}}, "Idempotency-Key", "arr-k1"), 422).problem(t)
	if !strings.Contains(p.Detail, "already created array "+v1.ID+" through the other route") {
		t.Errorf("array's key on sessions: detail %q", p.Detail)
	}
	if n := h.countKeys(h.keys.Arrays()); n != 2 {
		t.Errorf("%d arrays after refused repeats, want 2", n)
	}
	// Another user's same key is theirs.
	v3 := decode[api.ArrayView](t, want(t, h.do("POST", "/api/v1/arrays", h.token("bob"), sweep(nil), "Idempotency-Key", "arr-k1"), 201))
	if v3.ID == v1.ID {
		t.Error("bob got ada's array back")
	}
	// The array retired: the repeat says so.
	if _, err := h.cli.Delete(t.Context(), h.keys.Array(v1.ID)); err != nil {
		t.Fatal(err)
	}
	p = want(t, h.do("POST", "/api/v1/arrays", ada, sweep(nil), "Idempotency-Key", "arr-k1"), 409).problem(t)
	if !strings.Contains(p.Detail, "created array "+v1.ID+", which no longer exists") {
		t.Errorf("retired: detail %q", p.Detail)
	}
}

// TestIdempotentRepeatsPassAFullQueue: a repeat is answered before
// admission, so the queue its own first create filled never refuses it
// (a session's or an array's), while a new request is refused.
func TestIdempotentRepeatsPassAFullQueue(t *testing.T) {
	h := newHarness(t, harnessOpts{maxQueued: 10})
	ada := h.token("ada")
	job := map[string]any{"kind": "batch", "command": []string{"true"}}
	arr := want(t, h.do("POST", "/api/v1/arrays", ada, sweep(nil), "Idempotency-Key", "arr-full-1"), 201)
	s := want(t, h.do("POST", "/api/v1/sessions", ada, job, "Idempotency-Key", "arr-full-2"), 201)
	// The queue holds ada's session; the array may queue 10 more: full.
	want(t, h.do("POST", "/api/v1/arrays", ada, sweep(nil), "Idempotency-Key", "arr-full-3"), 422)
	r := want(t, h.do("POST", "/api/v1/arrays", ada, sweep(nil), "Idempotency-Key", "arr-full-1"), 201)
	if decode[api.ArrayView](t, r).ID != decode[api.ArrayView](t, arr).ID || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("array repeat: %s", r.body)
	}
	for range 9 {
		want(t, h.do("POST", "/api/v1/sessions", ada, job), 201)
	}
	want(t, h.do("POST", "/api/v1/sessions", ada, job), 422)
	r = want(t, h.do("POST", "/api/v1/sessions", ada, job, "Idempotency-Key", "arr-full-2"), 201)
	if decode[api.SessionView](t, r).ID != decode[api.SessionView](t, s).ID || r.header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("session repeat: %s", r.body)
	}
}
