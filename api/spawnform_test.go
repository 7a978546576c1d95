package api_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// TestDevicesOnBehalfForTheSpawnForm: the JupyterHub spawner reads
// /api/v1/nodes?devices=true with its service token on behalf of the
// user whose spawn form it draws (issue 35). Each user sees her own
// fraction on a shared GPU as hers and another user's as "(another
// user)", with its fractions and free memory, so the form can tell which
// shared GPUs are open to her; the service itself is no admin.
func TestDevicesOnBehalfForTheSpawnForm(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	const model = "NVIDIA A100-SXM4-80GB"
	n := state.Node{Name: "gpu-s", Address: "10.0.0.3", CPUMilli: 64000, MemoryMiB: 512 * 1024, Ports: state.PortRange{First: 40000, Last: 40999}, Simulated: true, Registered: time.Now().UTC()}
	for i := range 3 {
		n.GPUs = append(n.GPUs, state.GPU{Index: i, UUID: fmt.Sprintf("GPU-s-%d", i), Model: model, MemoryMiB: 81920, Healthy: true, Shared: true})
	}
	frac := func(owner, gpu string, mib int64) state.Allocation {
		return state.Allocation{Kind: state.KindNotebook, Owner: owner, Role: state.RoleSingle, GPUs: []string{gpu}, CPUMilli: 1000, MemoryMiB: 1024,
			Share: &state.GPUShare{MemoryMiB: mib, GPUMemoryMiB: 81920}}
	}
	l := state.Ledger{Node: "gpu-s", Allocations: map[string]state.Allocation{
		"sb": frac("bob", "GPU-s-0", 20480),
		"sa": frac("ada", "GPU-s-1", 10240), "sa2": frac("ada", "GPU-s-1", 30720),
	}}
	ctx := context.Background()
	if _, err := state.Put(ctx, h.cli, h.keys.Node("gpu-s"), n); err != nil {
		t.Fatal(err)
	}
	if _, err := state.Put(ctx, h.cli, h.keys.Ledger("gpu-s"), l); err != nil {
		t.Fatal(err)
	}
	hub := h.token("jupyterhub", "service")
	devices := func(user string) map[string]api.GPUDevice {
		t.Helper()
		nl := decode[api.NodeList](t, want(t, h.do("GET", "/api/v1/nodes?devices=true", hub, nil, api.OnBehalfOfHeader, user), http.StatusOK))
		out := map[string]api.GPUDevice{}
		for _, n := range nl.Items {
			for _, d := range n.Devices {
				out[d.UUID] = d
			}
		}
		return out
	}
	h.waitFor("the fractions in the API's view", func() bool { return devices("ada")["GPU-s-1"].Fractions == 2 })
	type seen struct {
		owner     string
		fractions int
		free      int64
	}
	for user, wantSeen := range map[string][3]seen{
		"ada": {{"(another user)", 1, 61440}, {"ada", 2, 40960}, {"", 0, 81920}},
		"bob": {{"bob", 1, 61440}, {"(another user)", 2, 40960}, {"", 0, 81920}},
		"cy":  {{"(another user)", 1, 61440}, {"(another user)", 2, 40960}, {"", 0, 81920}},
	} {
		d := devices(user)
		for i, w := range wantSeen {
			g := d[fmt.Sprintf("GPU-s-%d", i)]
			if got := (seen{g.Owner, g.Fractions, g.FreeMiB}); !g.Shared || !g.Simulated || got != w {
				t.Errorf("GPU %d on behalf of %s: %+v (shared %v, simulated %v); want %+v, shared and simulated", i, user, got, g.Shared, g.Simulated, w)
			}
		}
	}
}

// TestRequestGPUKindReplacesProfiles: a request's MIG profile or fraction
// is the request's choice of GPU kind (the spawn form's GPU kind select on
// a Voyager profile of another kind): it drops the profile's other kind
// instead of being refused for asking both, and keeps the profile's CPU
// and memory.
func TestRequestGPUKindReplacesProfiles(t *testing.T) {
	h := newHarness(t, harnessOpts{})
	const model = "NVIDIA A100-SXM4-80GB"
	n := state.Node{Name: "gpu-k", Address: "10.0.0.4", CPUMilli: 64000, MemoryMiB: 512 * 1024, Ports: state.PortRange{First: 40000, Last: 40999}, Simulated: true, Registered: time.Now().UTC(),
		GPUs: []state.GPU{
			{Index: 0, UUID: "GPU-k-0", Model: model, MemoryMiB: 81920, Healthy: true, Shared: true},
			{Index: 1, UUID: "GPU-k-1", Model: model, MemoryMiB: 81920, Healthy: true, MIGEnabled: true,
				MIGDevices: []state.MIGDevice{{UUID: "MIG-k-1-0", Profile: "1g.10gb", MemoryMiB: 9984}}},
		}}
	if _, err := state.Put(context.Background(), h.cli, h.keys.Node("gpu-k"), n); err != nil {
		t.Fatal(err)
	}
	root, ada := h.token("root", "admin"), h.token("ada")
	h.waitFor("gpu-k in the API's view", func() bool {
		return strings.Contains(string(h.do("GET", "/api/v1/nodes", root, nil).body), `"name":"gpu-k"`)
	})
	for name, res := range map[string]map[string]any{
		"mig":   {"gpus": 1, "migProfile": "1g.10gb", "cpuMilli": 3000, "memoryMiB": 3072},
		"share": {"gpus": 1, "gpuShareMiB": 20480, "gpuComputePercent": 25, "cpuMilli": 3000, "memoryMiB": 3072},
	} {
		want(t, h.do("PUT", "/api/v1/profiles/"+name, root, map[string]any{"kind": "notebook", "image": "x", "resources": res}), http.StatusOK)
	}
	create := func(profile string, res map[string]any) state.Resources {
		t.Helper()
		r := notebook()
		r["profile"], r["resources"] = profile, res
		return decode[api.SessionView](t, want(t, h.do("POST", "/api/v1/sessions", ada, r), http.StatusCreated)).Resources
	}
	if r := create("mig", map[string]any{"gpuShareMiB": 10240, "gpuComputePercent": 40}); r.MIGProfile != "" || r.GPUShareMiB != 10240 || r.GPUComputePercent != 40 || r.GPUs != 1 || r.CPUMilli != 3000 {
		t.Errorf("a fraction on the MIG profile: %+v; want the fraction, no MIG profile, the profile's CPU", r)
	}
	if r := create("share", map[string]any{"migProfile": "1g.10gb"}); r.MIGProfile != "1g.10gb" || r.GPUShareMiB != 0 || r.GPUComputePercent != 0 || r.MemoryMiB != 3072 {
		t.Errorf("a MIG device on the fraction profile: %+v; want the MIG profile, no fraction or compute percent, the profile's memory", r)
	}
	// Both in one request are still refused.
	r := notebook()
	r["profile"], r["resources"] = "share", map[string]any{"migProfile": "1g.10gb", "gpuShareMiB": 10240}
	wantFieldError(t, want(t, h.do("POST", "/api/v1/sessions", ada, r), http.StatusUnprocessableEntity).problem(t), "resources.migProfile", "not both")
}
