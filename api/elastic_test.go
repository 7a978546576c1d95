package api_test

import (
	"context"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// TestElasticAdmission: an elastic range is checked at admission with a
// clear error naming the field and what would be right; a valid one is
// stored in the spec, the queue entry and the status, at its minimum.
func TestElasticAdmission(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.addNode("n1", "NVIDIA A100-SXM4-80GB", 8)
	ada := h.token("ada")
	batch := func(el map[string]any, edit ...func(map[string]any)) map[string]any {
		r := map[string]any{"kind": "batch", "image": "voyager/train:latest", "command": []string{"python", "train.py"},
			"resources": map[string]any{"cpuMilli": 4000, "memoryMiB": 16384}, "elastic": el}
		for _, e := range edit {
			e(r)
		}
		return r
	}
	for _, c := range []struct {
		name, field, text string
		body              map[string]any
	}{
		{"min above max", "elastic.max", "want min ≤ max", batch(map[string]any{"min": 8, "max": 2})},
		{"min zero", "elastic.min", "want at least 1 GPU", batch(map[string]any{"min": 0, "max": 4})},
		{"max above any request", "elastic.max", "want at most 64", batch(map[string]any{"min": 2, "max": 65})},
		{"max above any node", "elastic.max", "want elastic.max at most 8", batch(map[string]any{"min": 2, "max": 12})},
		{"a notebook", "elastic", "batch jobs only", batch(map[string]any{"min": 2, "max": 8}, func(r map[string]any) { r["kind"] = "notebook"; delete(r, "command") })},
		{"a range of nodes", "elastic", "range of nodes", batch(map[string]any{"min": 2, "max": 8}, func(r map[string]any) { r["nodes"] = 2 })},
		{"gpus that are not the minimum", "resources.gpus", "set it to elastic.min", batch(map[string]any{"min": 2, "max": 8}, func(r map[string]any) {
			r["resources"] = map[string]any{"gpus": 4, "cpuMilli": 4000, "memoryMiB": 16384}
		})},
		{"fractions", "elastic", "whole GPUs", batch(map[string]any{"min": 1, "max": 2}, func(r map[string]any) {
			r["resources"] = map[string]any{"gpuShareMiB": 1000, "gpus": 1, "cpuMilli": 4000, "memoryMiB": 16384}
		})},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := h.countKeys(h.keys.Sessions())
			wantFieldError(t, want(t, h.do("POST", "/api/v1/sessions", ada, c.body), http.StatusUnprocessableEntity).problem(t), c.field, c.text)
			if after := h.countKeys(h.keys.Sessions()); after != before {
				t.Errorf("a refused request wrote a session: %d sessions, were %d", after, before)
			}
		})
	}
	v := decode[map[string]any](t, want(t, h.do("POST", "/api/v1/sessions", ada, batch(map[string]any{"min": 2, "max": 8})), http.StatusCreated))
	id, _ := v["id"].(string)
	spec, _, err := state.Get[state.Session](context.Background(), h.cli, h.keys.Session(id))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Elastic == nil || spec.Elastic.Min != 2 || spec.Elastic.Max != 8 || spec.Resources.GPUs != 2 || spec.Resources.CPUMilli != 4000 {
		t.Fatalf("spec: elastic %+v, resources %+v", spec.Elastic, spec.Resources)
	}
	q, _, err := state.Get[state.QueueEntry](context.Background(), h.cli, h.keys.Pending(id))
	if err != nil {
		t.Fatal(err)
	}
	if q.Elastic == nil || q.Elastic.Min != 2 || q.Elastic.Max != 8 {
		t.Fatalf("queue entry: %+v", q.Elastic)
	}
	// One size is a fixed-size job.
	v = decode[map[string]any](t, want(t, h.do("POST", "/api/v1/sessions", ada, batch(map[string]any{"min": 3, "max": 3})), http.StatusCreated))
	spec, _, err = state.Get[state.Session](context.Background(), h.cli, h.keys.Session(v["id"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Elastic != nil || spec.Resources.GPUs != 3 {
		t.Fatalf("a range of one size: elastic %+v, gpus %d", spec.Elastic, spec.Resources.GPUs)
	}
}

// TestElasticNodesAdmission: a range of machines (elastic minNodes,
// maxNodes) is checked at admission with a clear error naming the field
// and what would be right, writing nothing; a valid one is stored as a
// multi-node job of maxNodes machines whose queue entry asks for its cap.
func TestElasticNodesAdmission(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for _, n := range []string{"n1", "n2", "n3"} {
		h.addNode(n, "NVIDIA A100-SXM4-80GB", 2)
	}
	ada := h.token("ada")
	batch := func(el map[string]any, edit ...func(map[string]any)) map[string]any {
		r := map[string]any{"kind": "batch", "image": "voyager/train:latest", "command": []string{"torchrun", "train.py"},
			"resources": map[string]any{"gpus": 2, "cpuMilli": 4000, "memoryMiB": 16384}, "elastic": el}
		for _, e := range edit {
			e(r)
		}
		return r
	}
	for _, c := range []struct {
		name, field, text string
		body              map[string]any
	}{
		{"min above max", "elastic.maxNodes", "want minNodes ≤ maxNodes", batch(map[string]any{"minNodes": 3, "maxNodes": 2})},
		{"min zero", "elastic.minNodes", "want at least 1 machine", batch(map[string]any{"minNodes": 0, "maxNodes": 3})},
		{"more machines than one transaction binds", "elastic.maxNodes", "want at most", batch(map[string]any{"minNodes": 1, "maxNodes": 500})},
		{"more machines than the cluster has", "elastic.maxNodes", "want elastic.maxNodes at most 3", batch(map[string]any{"minNodes": 1, "maxNodes": 5})},
		{"a range of GPUs and of nodes", "elastic", "want one", batch(map[string]any{"min": 1, "max": 2, "minNodes": 1, "maxNodes": 3})},
		{"a notebook", "elastic", "batch jobs only", batch(map[string]any{"minNodes": 1, "maxNodes": 3}, func(r map[string]any) { r["kind"] = "notebook"; delete(r, "command") })},
		{"a Ray cluster", "elastic", "not a Ray cluster", batch(map[string]any{"minNodes": 1, "maxNodes": 3}, func(r map[string]any) { r["ray"] = map[string]any{"workers": 1} })},
		{"nodes that are not the maximum", "nodes", "set it to elastic.maxNodes", batch(map[string]any{"minNodes": 1, "maxNodes": 3}, func(r map[string]any) { r["nodes"] = 2 })},
		{"MIG parts", "elastic", "whole GPUs", batch(map[string]any{"minNodes": 1, "maxNodes": 3}, func(r map[string]any) {
			r["resources"] = map[string]any{"gpus": 1, "migProfile": "1g.10gb", "cpuMilli": 4000, "memoryMiB": 16384}
		})},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := h.countKeys(h.keys.Sessions())
			wantFieldError(t, want(t, h.do("POST", "/api/v1/sessions", ada, c.body), http.StatusUnprocessableEntity).problem(t), c.field, c.text)
			if after := h.countKeys(h.keys.Sessions()); after != before {
				t.Errorf("a refused request wrote a session: %d sessions, were %d", after, before)
			}
		})
	}
	v := decode[map[string]any](t, want(t, h.do("POST", "/api/v1/sessions", ada, batch(map[string]any{"minNodes": 1, "maxNodes": 3})), http.StatusCreated))
	id, _ := v["id"].(string)
	spec, _, err := state.Get[state.Session](context.Background(), h.cli, h.keys.Session(id))
	if err != nil {
		t.Fatal(err)
	}
	if el := spec.Elastic; el == nil || el.MinNodes != 1 || el.MaxNodes != 3 || el.Min != 0 || spec.Nodes != 3 || spec.Resources.GPUs != 2 || spec.OnPartFailure != state.PartFailureStopAll {
		t.Fatalf("spec: elastic %+v, nodes %d, resources %+v, onPartFailure %q", spec.Elastic, spec.Nodes, spec.Resources, spec.OnPartFailure)
	}
	q, _, err := state.Get[state.QueueEntry](context.Background(), h.cli, h.keys.Pending(id))
	if err != nil {
		t.Fatal(err)
	}
	if q.Elastic == nil || q.Elastic.MaxNodes != 3 || q.Nodes != 3 || q.Workers != 2 {
		t.Fatalf("queue entry: nodes %d workers %d elastic %+v", q.Nodes, q.Workers, q.Elastic)
	}
	// One count is a fixed multi-node job.
	v = decode[map[string]any](t, want(t, h.do("POST", "/api/v1/sessions", ada, batch(map[string]any{"minNodes": 2, "maxNodes": 2})), http.StatusCreated))
	spec, _, err = state.Get[state.Session](context.Background(), h.cli, h.keys.Session(v["id"].(string)))
	if err != nil {
		t.Fatal(err)
	}
	if spec.Elastic != nil || spec.Nodes != 2 {
		t.Fatalf("a range of one count: elastic %+v, nodes %d", spec.Elastic, spec.Nodes)
	}
}

// TestElasticNodesVerdictIsItsOwn: the admission check's cached verdict
// of a range of machines (planned down to its minimum) is never taken for
// a fixed job of its maximum: on two machines a fixed three-machine job
// is refused after an elastic 1-3 was checked.
func TestElasticNodesVerdictIsItsOwn(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	h.addNode("n1", "NVIDIA A100-SXM4-80GB", 2)
	h.addNode("n2", "NVIDIA A100-SXM4-80GB", 2)
	ada := h.token("ada")
	body := func(edit func(map[string]any)) map[string]any {
		r := map[string]any{"kind": "batch", "image": "voyager/train:latest", "command": []string{"torchrun", "train.py"},
			"resources": map[string]any{"gpus": 2, "cpuMilli": 4000, "memoryMiB": 16384}}
		edit(r)
		return r
	}
	wantFieldError(t, want(t, h.do("POST", "/api/v1/sessions", ada, body(func(r map[string]any) {
		r["elastic"] = map[string]any{"minNodes": 1, "maxNodes": 3}
	})), http.StatusUnprocessableEntity).problem(t), "elastic.maxNodes", "want elastic.maxNodes at most 2")
	wantFieldError(t, want(t, h.do("POST", "/api/v1/sessions", ada, body(func(r map[string]any) { r["nodes"] = 3 })),
		http.StatusUnprocessableEntity).problem(t), "nodes", "")
}

// TestUsageCountsAnElasticJobAtItsSize: the usage report's running
// attempt of an elastic job counts the GPUs it was bound at
// (status.elastic.size, as the accountant does when it ends), not its
// spec's minimum or maximum.
func TestUsageCountsAnElasticJobAtItsSize(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	for _, n := range []string{"n1", "n2", "n3"} {
		h.addNode(n, "NVIDIA A100-SXM4-80GB", 2)
	}
	root := h.token("root", "admin")
	now := time.Now().UTC()
	bound := now.Add(-30 * time.Minute)
	counted := bound // the report's window is this month
	if month := time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC); counted.Before(month) {
		counted = month
	}
	for _, c := range []struct {
		user string
		el   map[string]any
		st   state.Elastic
	}{
		{"ada", map[string]any{"minNodes": 1, "maxNodes": 3}, state.Elastic{MinNodes: 1, MaxNodes: 3, Nodes: 2, Size: 4}},
		{"bob", map[string]any{"min": 1, "max": 2}, state.Elastic{Min: 1, Max: 2, Size: 2}},
	} {
		body := map[string]any{"kind": "batch", "image": "voyager/train:latest", "command": []string{"torchrun", "train.py"},
			"resources": map[string]any{"gpus": 2, "cpuMilli": 4000, "memoryMiB": 16384}, "elastic": c.el}
		if c.user == "bob" {
			body["resources"] = map[string]any{"cpuMilli": 4000, "memoryMiB": 16384}
		}
		v := decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", h.token(c.user), body), http.StatusCreated))
		el := c.st
		h.putStatus(state.Status{Session: v.ID, Phase: state.PhaseRunning, Bound: &bound, QueueRevision: 5, Elastic: &el})
	}
	h.waitFor("both running statuses in the cache", func() bool {
		rep := decode[api.UsageReport](t, want(t, h.do("GET", "/api/v1/usage?by=user", root, nil), http.StatusOK))
		return len(rep.Rows) == 2
	})
	rep := decode[api.UsageReport](t, want(t, h.do("GET", "/api/v1/usage?by=user", root, nil), http.StatusOK))
	hours := time.Since(counted).Hours()
	for _, row := range rep.Rows {
		want := map[string]float64{"ada": 4 * hours, "bob": 2 * hours}[row.User]
		if math.Abs(row.GPUHours-want) > 0.02 {
			t.Errorf("%s's running elastic job: %.3f GPU-h, want %.3f (its size × its time)", row.User, row.GPUHours, want)
		}
	}
}
