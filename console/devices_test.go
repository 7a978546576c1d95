package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/testreq"
	"github.com/voyager-gpu/voyager/state"
)

// putNode registers node n (its GPUs as given) and waits for the API to
// list it.
func (e *env) putNode(n state.Node) {
	e.t.Helper()
	n.Address, n.CPUMilli, n.MemoryMiB, n.Registered = "10.0.0.1", 64000, 512*1024, time.Now().UTC()
	n.Ports = state.PortRange{First: 40000, Last: 40999}
	if _, err := state.Put(context.Background(), e.cli, e.keys.Node(n.Name), n); err != nil {
		e.t.Fatal(err)
	}
	e.waitFor("node "+n.Name, func() bool {
		return strings.Contains(e.get("/api/v1/nodes", e.token("root", "admin")).body, `"name":"`+n.Name+`"`)
	})
}

// TestStartFormOffersSharedGPUsAndMIGDevicesInBrowser: in headless
// Chromium, the start form offers, beside whole GPUs by model, each MIG
// profile and each model of shared GPU the nodes have, with what is free
// of it for the viewer (a shared GPU holding another user's fractions is
// not open to her), marked simulated where the inventory is made up and
// not where it is real; whole-GPU models list neither. Choosing a
// fraction with its memory and compute starts a session asking for
// exactly that; a fraction without its memory is refused with the field
// named.
func TestStartFormOffersSharedGPUsAndMIGDevicesInBrowser(t *testing.T) {
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		testreq.Missing(t, "chromium", "the browser test drives Debian's chromium: apt-get install -y chromium")
	}
	e := newEnv(t, etcdtest.New(t))
	gpu := func(node string, i int, model string) state.GPU {
		return state.GPU{Index: i, UUID: fmt.Sprintf("GPU-%s-%d", node, i), Model: model, MemoryMiB: 81920, Healthy: true}
	}
	// A simulated node with one whole GPU, one split into two MIG
	// devices and two shared GPUs; a real node with a shared H100.
	sim := state.Node{Name: "sim", Simulated: true, GPUs: []state.GPU{gpu("sim", 0, "A100"), gpu("sim", 1, "A100"), gpu("sim", 2, "A100"), gpu("sim", 3, "A100")}}
	sim.GPUs[1].MIGEnabled = true
	sim.GPUs[1].MIGDevices = []state.MIGDevice{{UUID: "MIG-sim-1a", Profile: "1g.10gb", MemoryMiB: 9856}, {UUID: "MIG-sim-1b", Profile: "1g.10gb", MemoryMiB: 9856}}
	sim.GPUs[2].Shared, sim.GPUs[3].Shared = true, true
	e.putNode(sim)
	real := state.Node{Name: "real", GPUs: []state.GPU{gpu("real", 0, "H100")}}
	real.GPUs[0].Shared = true
	e.putNode(real)
	// Bob holds a 30000 MiB fraction of sim's GPU 2: not open to ada.
	bobFrac := state.Allocation{Owner: "bob", Kind: state.KindNotebook, Role: state.RoleSingle, GPUs: []string{"GPU-sim-2"},
		Share: &state.GPUShare{MemoryMiB: 30000, GPUMemoryMiB: 81920}, CPUMilli: 1000, MemoryMiB: 1024}
	if _, err := state.Put(context.Background(), e.cli, e.keys.Ledger("sim"), state.Ledger{Node: "sim", Allocations: map[string]state.Allocation{"bob-nb": bobFrac}}); err != nil {
		t.Fatal(err)
	}
	ada := e.token("ada")
	e.waitFor("bob's fraction in the device list", func() bool {
		return strings.Contains(e.get("/api/v1/nodes?devices=true", ada).body, `"fractions":1`)
	})

	bctx, eval := startBrowser(t, chromium, 1400)
	c, stop := context.WithTimeout(bctx, 60*time.Second)
	defer stop()
	if err := chromedp.Do(c, chromedp.Navigate(e.srv.URL+"/console/sessions"), chromedp.WaitVisible("#token"),
		chromedp.SetValue("#token", ada), chromedp.Click("#signin-form button")); err != nil {
		t.Fatalf("sign in: %v", err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.querySelector('#view').getAttribute('aria-busy') === 'false' && document.querySelector('#device') !== null`,
		chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		t.Fatalf("sessions view: %v", err)
	}
	options := eval(`[...document.querySelectorAll('#device option')].map(o => o.value + '=' + o.textContent + (o.dataset.simulated ? ' [sim]' : '')).join('\n')`)
	want := []string{
		"=whole GPUs",
		"mig:1g.10gb:A100=MIG 1g.10gb of A100, 9856 MiB (2 of 2 free) — simulated [sim]",
		"shared:A100=a fraction of a shared A100 (81920 MiB each; 1 of 2 open to you, up to 81920 MiB free on one) — simulated [sim]",
		"shared:H100=a fraction of a shared H100 (81920 MiB each; 1 of 1 open to you, up to 81920 MiB free on one)",
	}
	if options != strings.Join(want, "\n") {
		t.Errorf("device options:\n%s\nwant:\n%s", options, strings.Join(want, "\n"))
	}
	if got := eval(`[...document.querySelectorAll('#gpuModel option')].map(o => o.value).join(',')`); got != ",A100" {
		t.Errorf("whole-GPU models %q; want any and A100 (the one whole GPU), no MIG device or shared GPU", got)
	}
	// A fraction without its memory: refused, the field named.
	if err := chromedp.Do(c, chromedp.SetValue("#device", "shared:A100"), chromedp.Click("#start-form button[type=submit]")); err != nil {
		t.Fatal(err)
	}
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](`document.body.innerText.includes('gpuShareMiB')`, chromedp.WithPollingTimeout(20*time.Second))); err != nil {
		t.Fatalf("no error naming gpuShareMiB: %v\n%s", err, eval("document.body.innerText"))
	}
	// With it: a session asking for a 20480 MiB fraction, 25% compute.
	if err := chromedp.Do(c, chromedp.SetValue("#device", "shared:A100"), chromedp.SetValue("#gpuShareMiB", "20480"),
		chromedp.SetValue("#gpuComputePercent", "25"), chromedp.SetValue("#name", "frac"), chromedp.Click("#start-form button[type=submit]")); err != nil {
		t.Fatal(err)
	}
	var list api.SessionList
	e.waitFor("ada's fraction session", func() bool {
		r := e.get("/api/v1/sessions", ada)
		return json.Unmarshal([]byte(r.body), &list) == nil && len(list.Items) == 1
	})
	if r := list.Items[0].Resources; r.GPUShareMiB != 20480 || r.GPUComputePercent != 25 || r.GPUModel != "A100" || r.GPUs != 1 {
		t.Errorf("the session asks for %+v; want a 20480 MiB fraction of a shared A100 at 25%% compute", r)
	}
}
