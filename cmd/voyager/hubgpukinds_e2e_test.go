package main

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// TestJupyterHubGPUKindsE2E: the spawn form of Debian's JupyterHub 3.0
// with the spawner installed by its README's commands, against `voyager
// dev` whose real agent on a real containerd offers a SIMULATED node of
// one shared A100, one A100 partitioned into MIG devices and two whole
// H100s (issue 35). While ada holds a fraction of the shared GPU (made
// with the CLI), her form offers the rest of that GPU to her (50.7 GiB
// free on one), each MIG profile with its free count and the whole H100s,
// and no whole A100; bob's form says the shared GPU is not open to him
// (one owner per shared GPU). Choosing a fraction in bob's form sends
// gpuShareMiB and gpuComputePercent (his session waits for the GPU);
// choosing a MIG profile in cy's sends migProfile, and so does one chosen
// in eve's form in headless Chromium; a fraction without its memory comes
// back on the form with what is wanted, the choice kept.
func TestJupyterHubGPUKindsE2E(t *testing.T) {
	needBinary(t)
	if _, err := exec.LookPath("jupyterhub"); err != nil {
		t.Fatalf("jupyterhub not found: install Debian's jupyterhub (.ci/run does): %v", err)
	}
	rt := privateContainerd(t, "h3-hub-kinds")

	root, _ := filepath.Abs("../..")
	dir := t.TempDir()
	venv := filepath.Join(dir, "venv")
	paths := strings.NewReplacer("/opt/jupyterhub", venv, "/etc/jupyterhub", dir)
	for _, c := range readmeCommands(t, root, "## Install", paths, "apt-get") {
		sh(t, root, c)
	}
	for _, c := range readmeCommands(t, root, "## Configure", paths, "export") {
		sh(t, root, c)
	}
	python := filepath.Join(venv, "bin", "python")
	privKey, pubKey := filepath.Join(dir, "voyager.key"), filepath.Join(dir, "voyager.pub")

	env := newDevEnv(t)
	environ := append(env.environ(), "VOYAGER_JWT_PUBLIC_KEYS="+pubKey,
		"VOYAGER_AGENT_NODE=h3-hub-kinds", "VOYAGER_AGENT_CONTAINERD="+rt.Address(), "VOYAGER_AGENT_NAMESPACE="+rt.Namespace(),
		"VOYAGER_AGENT_IMAGE="+agentTestImage, "VOYAGER_AGENT_STOP_GRACE=1s", "VOYAGER_AGENT_PORTS="+runtimetest.FreePortRange(t, 50),
		"VOYAGER_AGENT_SIMULATE_GPUS=1xA100-80GB/shared,1xA100-80GB/mig=3g.40gb+2g.20gb+1g.10gb,2xH100-80GB")
	dev := start(t, environ, "dev")
	dev.waitFor(`msg="node registered"`, 60*time.Second)
	const a100, h100 = "NVIDIA A100-80GB (simulated)", "NVIDIA H100-80GB (simulated)"

	// ada holds 30000 MiB of the shared GPU, through the CLI.
	ada := binaryToken(t, environ, "-sub", "ada")
	code, out, errOut := runBinaryAs(t, environ, env.httpAddr, ada, "session", "create", "--kind", "batch", "--cpu", "0.2", "--memory", "256",
		"--gpu-share", "30000", "-o", "name", "--", "sleep", "600")
	if code != 0 {
		t.Fatalf("ada's fraction: exit %d\n%s%s", code, out, errOut)
	}
	held := strings.TrimSpace(out)
	cli := etcdClient(t, env.clientAddr)
	status := func(id string) state.Status {
		st, _, _ := state.Get[state.Status](context.Background(), cli, "/voyager/status/"+id)
		return st
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(90 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(200 * time.Millisecond) // polling etcd for a condition, with a deadline
		}
	}
	waitFor("ada's fraction running", func() bool { return status(held).Phase == state.PhaseRunning })
	// sessionOf waits for owner's one Voyager session and returns it.
	sessionOf := func(owner string) (s state.Session) {
		t.Helper()
		waitFor(owner+"'s session", func() bool {
			resp, err := cli.Get(context.Background(), "/voyager/sessions/", clientOpts()...)
			if err != nil {
				t.Fatal(err)
			}
			for _, kv := range resp.Kvs {
				if x, err := state.Decode[state.Session](kv.Value); err == nil && x.Owner == owner {
					s = x
					return true
				}
			}
			return false
		})
		return s
	}

	adminTok := randomHex(t)
	hubPort, proxyPort, apiPort := etcdtest.FreeAddr(t), etcdtest.FreeAddr(t), etcdtest.FreeAddr(t)
	config := filepath.Join(dir, "jupyterhub_config.py")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
import voyager_spawner
c.JupyterHub.spawner_class = "voyager"
c.VoyagerSpawner.voyager_url = "http://%s"
c.VoyagerSpawner.voyager_private_key_file = %q
c.VoyagerSpawner.image = %q
c.VoyagerSpawner.gpus = 0
c.VoyagerSpawner.cpu_milli = 200
c.VoyagerSpawner.memory_mib = 256
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = %s
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = %s
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:%s"
c.JupyterHub.db_url = "sqlite:///%s/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "%s/cookie_secret"
c.JupyterHub.api_tokens = {%q: "admin"}
c.Authenticator.admin_users = {"admin"}
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
c.Spawner.start_timeout = 300
`, env.httpAddr, privKey, agentTestImage, port(proxyPort), port(hubPort), port(apiPort), dir, dir, adminTok)), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &hub{t: t, python: python, dir: dir, config: config, token: adminTok, hubURL: "http://" + hubPort, proxyURL: "http://" + proxyPort}
	startHub(t, h)
	t.Cleanup(func() {
		h.stop()
		if t.Failed() {
			t.Logf("jupyterhub log:\n%s", h.log.String())
		}
	})

	// ada's form: the rest of the shared GPU is hers, every MIG profile
	// and the whole H100s with their free counts; no whole A100 (both are
	// shared or partitioned).
	adaHub := h.login("ada")
	code, page := adaHub.get("/hub/spawn/ada")
	if code != 200 {
		t.Fatalf("ada's spawn form: %d\n%s", code, page)
	}
	for _, want := range []string{
		`<option value="shared:` + regexp.QuoteMeta(a100) + `">A fraction of a shared ` + regexp.QuoteMeta(a100) + ` \(80 GiB each\): 1 of 1 open to you, up to 50\.7 GiB free on one</option>`,
		`<option value="mig:3g\.40gb:` + regexp.QuoteMeta(a100) + `">MIG 3g\.40gb of ` + regexp.QuoteMeta(a100) + ` \([0-9.]+ GiB\): 1 of 1 free</option>`,
		`<option value="mig:1g\.10gb:` + regexp.QuoteMeta(a100) + `">MIG 1g\.10gb of ` + regexp.QuoteMeta(a100) + ` \([0-9.]+ GiB\): 1 of 1 free</option>`,
		`<option value="whole:` + regexp.QuoteMeta(h100) + `">Whole ` + regexp.QuoteMeta(h100) + ` GPUs: 2 of 2 free</option>`,
		`<li>` + regexp.QuoteMeta(h100) + `: 2 of 2 GPUs free</li>`,
	} {
		if !regexp.MustCompile(want).MatchString(page) {
			t.Errorf("ada's spawn form lacks %s:\n%s", want, page)
		}
	}
	if strings.Contains(page, `value="whole:`+a100) {
		t.Errorf("ada's spawn form offers whole A100s, which are shared or partitioned:\n%s", page)
	}

	// bob's: ada's fraction closes the shared GPU to him.
	bobHub := h.login("bob")
	if _, page := bobHub.get("/hub/spawn/bob"); !strings.Contains(page, "A fraction of a shared "+a100+" (80 GiB each): none of 1 open to you now, your server would wait") {
		t.Errorf("bob's spawn form does not say the shared GPU is closed to him:\n%s", page)
	}
	// He asks for a fraction anyway: the request carries it, and waits.
	if code, page := bobHub.post("/hub/spawn/bob", url.Values{"profile": {""}, "device": {"shared:" + a100}, "gpu_share": {"10"}, "gpu_compute": {"40"}}); code != http.StatusFound {
		t.Fatalf("bob's spawn form: %d, want a redirect to the pending page\n%s", code, page)
	}
	bob := sessionOf("bob")
	if r := bob.Resources; r.GPUs != 1 || r.GPUShareMiB != 10240 || r.GPUComputePercent != 40 || r.GPUModel != a100 || r.MIGProfile != "" {
		t.Errorf("bob's session from the form: %+v; want one 10240 MiB fraction at 40%% of a %s", r, a100)
	}
	waitFor("bob's fraction waiting with a reason", func() bool { st := status(bob.ID); return st.Phase == state.PhasePending && st.Message != "" })

	// cy chooses a MIG device: migProfile of that model.
	cyHub := h.login("cy")
	if code, page := cyHub.post("/hub/spawn/cy", url.Values{"profile": {""}, "device": {"mig:1g.10gb:" + a100}, "gpus": {""}}); code != http.StatusFound {
		t.Fatalf("cy's spawn form: %d, want a redirect to the pending page\n%s", code, page)
	}
	if r := sessionOf("cy").Resources; r.GPUs != 1 || r.MIGProfile != "1g.10gb" || r.GPUModel != a100 || r.GPUShareMiB != 0 {
		t.Errorf("cy's session from the form: %+v; want one 1g.10gb MIG device of a %s", r, a100)
	}

	// In Chromium, eve picks a MIG profile from the GPU kind select, the
	// option the form labels with its free count, and starts: her session
	// asks for that MIG device.
	browser := newBrowser(t, "h3-hub-kinds")
	h.browserLogin(browser, "eve")
	h.browse(browser, "/hub/spawn/eve")
	mig := "mig:2g.20gb:" + a100
	if label := js[string](browser, `document.querySelector('#voyager-device option[value="`+mig+`"]').textContent`); !strings.HasSuffix(label, ": 1 of 1 free") {
		t.Errorf("eve's GPU kind option %s reads %q; want it with its free count", mig, label)
	}
	browser.shot(artifactDir(t), "gpu-kinds-form")
	browser.do("choose a 2g.20gb MIG device", chromedp.SetValue("#voyager-device", mig), chromedp.Click(`#spawn_form input[type=submit]`))
	if r := sessionOf("eve").Resources; r.GPUs != 1 || r.MIGProfile != "2g.20gb" || r.GPUModel != a100 {
		t.Errorf("eve's session from the form in Chromium: %+v; want one 2g.20gb MIG device of a %s", r, a100)
	}

	// dee forgets the fraction's memory: the form comes back saying so,
	// her choice kept.
	deeHub := h.login("dee")
	code, page = deeHub.post("/hub/spawn/dee", url.Values{"profile": {""}, "device": {"shared:" + a100}, "gpu_share": {""}, "gpu_compute": {"30"}})
	if code != 200 || !strings.Contains(page, "GPU share: you chose a fraction of a shared "+a100+": want the fraction") ||
		!strings.Contains(page, `<option value="shared:`+a100+`" selected>`) {
		t.Errorf("dee's form without the fraction's memory: %d; want the form again with the reason and her choice\n%s", code, page)
	}
}
