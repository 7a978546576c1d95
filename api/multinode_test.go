package api_test

import (
	"context"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// mnJob is a valid multi-node job request of n machines.
func mnJob(n int) map[string]any {
	return map[string]any{"kind": "batch", "image": "voyager/jupyter:latest", "command": []string{"torchrun", "train.py"}, "nodes": n,
		"resources": map[string]any{"gpus": 1, "cpuMilli": 4000, "memoryMiB": 16384}}
}

// TestMultiNodeAdmission: a batch job on several machines is admitted with
// its queue entry asking for one part per machine (rank 0 the head, the
// rest its workers, each with the same resources); combinations that mean
// nothing (a multi-node notebook, nodes with Ray workers, more parts than
// one bind transaction holds, an unknown onPartFailure) are refused with
// the field and what would be right.
func TestMultiNodeAdmission(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	for _, c := range []struct {
		name      string
		edit      func(map[string]any)
		wantField string
		wantText  string
	}{
		{"a notebook on several machines", func(r map[string]any) { r["kind"] = "notebook" },
			"nodes", "want a batch session"},
		{"nodes and ray workers", func(r map[string]any) { r["ray"] = map[string]any{"workers": 2} },
			"nodes", "ask for one"},
		{"more parts than one transaction holds", func(r map[string]any) { r["nodes"] = 43 },
			"nodes", "got 43, want at most 42"},
		{"negative nodes", func(r map[string]any) { r["nodes"] = -2 },
			"nodes", "got -2, want 0 or 1"},
		{"an unknown part-failure policy", func(r map[string]any) { r["onPartFailure"] = "Ignore" },
			"onPartFailure", `got "Ignore", want "StopAll"`},
		{"a part-failure policy on one machine", func(r map[string]any) { r["nodes"] = 1; r["onPartFailure"] = "Continue" },
			"onPartFailure", "applies to multi-node jobs only"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := mnJob(3)
			c.edit(r)
			p := want(t, h.do("POST", "/api/v1/sessions", ada, r), http.StatusUnprocessableEntity).problem(t)
			found := false
			for _, e := range p.Errors {
				if e.Field == c.wantField && strings.Contains(e.Message, c.wantText) {
					found = true
				}
			}
			if !found {
				t.Errorf("errors %+v, want %s: …%s…", p.Errors, c.wantField, c.wantText)
			}
		})
	}

	// The largest job that fits one transaction is admitted, with the
	// default policy; its queue entry has one worker per further rank.
	v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, mnJob(42)), http.StatusCreated))
	if v.Nodes != 42 || v.OnPartFailure != state.PartFailureStopAll {
		t.Errorf("admitted job has nodes %d, onPartFailure %q; want 42, StopAll", v.Nodes, v.OnPartFailure)
	}
	q, _, err := state.Get[state.QueueEntry](context.Background(), h.cli, h.keys.Pending(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	if q.Nodes != 42 || q.Workers != 41 || q.WorkerRequest != nil || len(q.Parts()) != 42 || !reflect.DeepEqual(q.Parts()[41], q.Request) {
		t.Errorf("queue entry %+v: want nodes 42, 41 workers with the head's request", q)
	}
	if q.Ports(state.RoleHead) != 1+state.JobPeerPorts || q.Ports(state.RoleWorker) != state.JobPeerPorts {
		t.Errorf("job ports: head %d, worker %d", q.Ports(state.RoleHead), q.Ports(state.RoleWorker))
	}

	// nodes 1 is a job on one machine, as without nodes.
	r := mnJob(1)
	v = decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, r), http.StatusCreated))
	if v.Nodes != 0 || v.OnPartFailure != "" {
		t.Errorf("one-machine job: nodes %d, onPartFailure %q; want 0 and none", v.Nodes, v.OnPartFailure)
	}
}
