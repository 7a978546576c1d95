package api_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// TestFractionRequests: a fraction of a shared GPU is asked for with
// gpuShareMiB (and gpuComputePercent); shapes that make no sense are
// refused naming the field, and a fraction no shared GPU could ever hold
// (none shared, or all smaller) is refused at admission with why, while
// one that fits is queued with its shape kept.
func TestFractionRequests(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	ada := h.token("ada")
	h.addNode("gpu-1", "NVIDIA A100-SXM4-80GB", 2)
	frac := func(res map[string]any) map[string]any {
		r := notebook()
		base := map[string]any{"cpuMilli": 4000, "memoryMiB": 16384}
		for k, v := range res {
			base[k] = v
		}
		r["resources"] = base
		return r
	}
	for _, c := range []struct {
		name        string
		res         map[string]any
		field, text string
	}{
		{"two GPUs", map[string]any{"gpus": 2, "gpuShareMiB": 10240}, "resources.gpus", "a fraction is of one GPU"},
		{"with a MIG profile", map[string]any{"gpus": 1, "gpuShareMiB": 10240, "migProfile": "1g.10gb"}, "resources.migProfile", "not both"},
		{"negative", map[string]any{"gpus": 1, "gpuShareMiB": -1}, "resources.gpuShareMiB", "want MiB"},
		{"compute over 100", map[string]any{"gpus": 1, "gpuShareMiB": 10240, "gpuComputePercent": 150}, "resources.gpuComputePercent", "1 to 100"},
		{"compute without a fraction", map[string]any{"gpus": 1, "gpuComputePercent": 50}, "resources.gpuComputePercent", "set gpuShareMiB too"},
	} {
		t.Run(c.name, func(t *testing.T) {
			wantFieldError(t, want(t, h.do("POST", "/api/v1/sessions", ada, frac(c.res)), http.StatusUnprocessableEntity).problem(t), c.field, c.text)
		})
	}
	// No GPU of the cluster is shared: no fraction can ever be held.
	p := want(t, h.do("POST", "/api/v1/sessions", ada, frac(map[string]any{"gpus": 1, "gpuShareMiB": 10240})), http.StatusUnprocessableEntity).problem(t)
	if p.Title != "Unsatisfiable request" || !strings.Contains(p.Detail, "no node can ever hold a 10240 MiB fraction of a shared GPU") {
		t.Errorf("no shared GPU: %q %q", p.Title, p.Detail)
	}
	// A node with an 80 GiB shared GPU: 10 GiB is queued, 100 GiB never fits.
	n := state.Node{Name: "gpu-2", Address: "10.0.0.2", CPUMilli: 64000, MemoryMiB: 512 * 1024, Ports: state.PortRange{First: 40000, Last: 40999}, Simulated: true, Registered: time.Now().UTC(),
		GPUs: []state.GPU{{UUID: "GPU-gpu-2-0", Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, Healthy: true, Shared: true}}}
	if _, err := state.Put(context.Background(), h.cli, h.keys.Node("gpu-2"), n); err != nil {
		t.Fatal(err)
	}
	h.waitFor("gpu-2 in the API's view", func() bool {
		return strings.Contains(string(h.do("GET", "/api/v1/nodes", h.token("root", "admin"), nil).body), `"name":"gpu-2"`)
	})
	// The shared GPU is no free GPU for whole requests (nor the spawn
	// form's count); its room shows as the device's freeMiB.
	var nodes api.NodeList
	if err := json.Unmarshal(h.do("GET", "/api/v1/nodes?devices=true", ada, nil).body, &nodes); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes.Items {
		if n.Name != "gpu-2" {
			continue
		}
		if n.GPUs.Total != 1 || n.GPUs.Free != 0 || n.ModelsFree["NVIDIA A100-SXM4-80GB"] != 0 || len(n.Devices) != 1 || !n.Devices[0].Shared || n.Devices[0].FreeMiB != 81920 {
			t.Errorf("gpu-2 %+v; want its shared GPU counted but not free, with 81920 MiB free for fractions", n)
		}
	}
	p = want(t, h.do("POST", "/api/v1/sessions", ada, frac(map[string]any{"gpus": 1, "gpuShareMiB": 102400})), http.StatusUnprocessableEntity).problem(t)
	if !strings.Contains(p.Detail, "no node can ever hold a 102400 MiB fraction") {
		t.Errorf("too large a fraction: %q", p.Detail)
	}
	r := want(t, h.do("POST", "/api/v1/sessions", ada, frac(map[string]any{"gpus": 1, "gpuShareMiB": 10240, "gpuComputePercent": 25})), http.StatusCreated)
	if !strings.Contains(string(r.body), `"gpuShareMiB":10240`) || !strings.Contains(string(r.body), `"gpuComputePercent":25`) {
		t.Errorf("created session %s; want its fraction kept", r.body)
	}
}
