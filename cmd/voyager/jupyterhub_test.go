package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/internal/testlog"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// recipeImage returns the archive of the image voyager.local/<name>, built
// by deploy/images/<name>/build.sh from Debian's packages when it is not
// in the cache yet (minutes): $VOYAGER_IMAGE_CACHE, else
// ~/.cache/voyager/images, as make image names it (voyager.local/jupyter's
// archive is voyager.local-jupyterlab.tar, since it serves JupyterLab).
func recipeImage(t *testing.T, name string) string {
	t.Helper()
	cache := os.Getenv("VOYAGER_IMAGE_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "voyager", "images")
	}
	archive := name
	if name == "jupyter" {
		archive = "jupyterlab" // the JupyterLab image's archive, as make image names it
	}
	out := filepath.Join(cache, "voyager.local-"+archive+".tar")
	if _, err := os.Stat(out); err == nil {
		return out
	}
	root, _ := filepath.Abs("../..")
	script := filepath.Join("deploy", "images", name, "build.sh")
	cmd := exec.Command(filepath.Join(root, script), out)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		t.Fatalf("build the %s image (%s): %v\n%s", name, script, err, log.String())
	}
	return out
}

// importImage imports the image archive into rt's namespace.
func importImage(t *testing.T, rt *runtime.Containerd, archive string) {
	t.Helper()
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := rt.Import(context.Background(), f); err != nil {
		t.Fatalf("import %s: %v", archive, err)
	}
}

// hub is a running JupyterHub with the VoyagerSpawner, run by python (a
// venv's, where the spawner is installed).
type hub struct {
	t                          *testing.T
	python, dir, config, token string
	hubURL, proxyURL           string
	proc                       *exec.Cmd
	log                        *testlog.Buffer

	mu       sync.Mutex
	lastHTML map[string]string // user → html_message of his last progress event that had one
}

func startHub(t *testing.T, h *hub) {
	t.Helper()
	if h.log == nil { // a restarted hub appends to the log
		h.log = &testlog.Buffer{}
	}
	h.proc = exec.Command(h.python, "-m", "jupyterhub", "-f", h.config)
	h.proc.Dir = h.dir
	// Debian's configurable-http-proxy finds its modules (commander, …)
	// under /usr/share/nodejs, which a node not built by Debian (as on
	// these machines) does not search by itself.
	h.proc.Env = append(os.Environ(), "NODE_PATH=/usr/share/nodejs:/usr/lib/nodejs")
	h.proc.Stdout, h.proc.Stderr = h.log, h.log
	if err := h.proc.Start(); err != nil {
		t.Fatalf("start jupyterhub: %v", err)
	}
	// The hub answers its API before it has restored the proxy's routes
	// of running servers; it logs "is now running" once it has.
	deadline := time.Now().Add(60 * time.Second)
	for {
		if strings.Contains(h.log.String(), "JupyterHub is now running") {
			if code, _ := h.call("GET", "/hub/api/", nil); code == 200 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("jupyterhub did not answer within 60s:\n%s", h.log.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (h *hub) stop() {
	if h.proc == nil || h.proc.Process == nil {
		return
	}
	_ = h.proc.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = h.proc.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		_ = h.proc.Process.Kill()
		<-done
	}
	h.proc = nil
}

// call sends a hub REST API request with the admin token.
func (h *hub) call(method, path string, body any) (int, []byte) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, h.hubURL+path, rd)
	req.Header.Set("Authorization", "token "+h.token)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// progress reads the hub's progress stream of user's server, as the
// pending page does, until it reports ready or failed, or until stop
// returns true for a message. It may run on any goroutine.
func (h *hub) progress(user string, stop func(msg string) bool) ([]string, error) {
	req, _ := http.NewRequest("GET", h.hubURL+"/hub/api/users/"+user+"/server/progress", nil)
	req.Header.Set("Authorization", "token "+h.token)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("read progress of %s: %w", user, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return nil, fmt.Errorf("read progress of %s: %d %s", user, resp.StatusCode, b)
	}
	var msgs []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data:") {
			continue
		}
		var ev struct {
			Message string `json:"message"`
			HTML    string `json:"html_message"`
			Ready   bool   `json:"ready"`
			Failed  bool   `json:"failed"`
		}
		if json.Unmarshal([]byte(strings.TrimSpace(line[5:])), &ev) != nil {
			continue
		}
		msgs = append(msgs, ev.Message)
		if ev.HTML != "" {
			h.mu.Lock()
			if h.lastHTML == nil {
				h.lastHTML = map[string]string{}
			}
			h.lastHTML[user] = ev.HTML
			h.mu.Unlock()
		}
		if ev.Ready || ev.Failed || (stop != nil && stop(ev.Message)) {
			return msgs, nil
		}
	}
	return msgs, fmt.Errorf("progress of %s ended without ready or failed: %q (%v)", user, msgs, sc.Err())
}

// mustProgress is progress on the test's goroutine.
func (h *hub) mustProgress(user string, stop func(msg string) bool) []string {
	h.t.Helper()
	msgs, err := h.progress(user, stop)
	if err != nil {
		h.t.Fatal(err)
	}
	return msgs
}

// afterSpawn reads the progress of user's spawn that has ended. Between
// the spawner's failure and the end of the hub's clean-up, JupyterHub 3.0
// answers 400 "is not starting"; the pending page then asks again, as
// this does.
func (h *hub) afterSpawn(user string) []string {
	h.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		msgs, err := h.progress(user, nil)
		if err == nil {
			return msgs
		}
		if !strings.Contains(err.Error(), "is not starting") || time.Now().After(deadline) {
			h.t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // polling, bounded by deadline
	}
}

// start asks the hub's REST API to start user's server with options.
func (h *hub) start(user string, options map[string]any) {
	h.t.Helper()
	if code, b := h.call("POST", "/hub/api/users/"+user, nil); code != 201 && code != 409 {
		h.t.Fatalf("create user %s: %d %s", user, code, b)
	}
	if code, b := h.call("POST", "/hub/api/users/"+user+"/server", options); code != 201 && code != 202 {
		h.t.Fatalf("start %s's server with %v: %d %s", user, options, code, b)
	}
}

// failure starts user's server with options and returns the last progress
// message, which must be the hub's "Spawn failed: …".
func (h *hub) failure(user string, options map[string]any) string {
	h.t.Helper()
	if code, b := h.call("POST", "/hub/api/users/"+user, nil); code != 201 && code != 409 {
		h.t.Fatalf("create user %s: %d %s", user, code, b)
	}
	// A spawn that fails within the hub's slow_spawn_timeout answers 500.
	if code, b := h.call("POST", "/hub/api/users/"+user+"/server", options); code != 201 && code != 202 && code != 500 {
		h.t.Fatalf("start %s's server with %v: %d %s", user, options, code, b)
	}
	msgs := h.afterSpawn(user)
	last := msgs[len(msgs)-1]
	if !strings.HasPrefix(last, "Spawn failed: ") {
		h.t.Fatalf("%s's spawn with %v: progress %q, want a failure", user, options, msgs)
	}
	return last
}

func (h *hub) waitServer(user string, ready bool) {
	h.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		code, b := h.call("GET", "/hub/api/users/"+user, nil)
		var u struct {
			Servers map[string]struct {
				Ready bool `json:"ready"`
			} `json:"servers"`
		}
		_ = json.Unmarshal(b, &u)
		s, has := u.Servers[""]
		if code == 200 && has == ready && (!ready || s.Ready) {
			return
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("server of %s: want ready=%v; hub says %d %s\nhub log:\n%s", user, ready, code, b, h.log.String())
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// port is the port of a host:port address.
func port(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

// statusThroughProxy asks the single-user server, through the hub's proxy,
// for its /api/status.
func (h *hub) statusThroughProxy(user string) (int, string) {
	req, _ := http.NewRequest("GET", h.proxyURL+"/user/"+user+"/api/status", nil)
	req.Header.Set("Authorization", "token "+h.token)
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// browser is a hub user's cookie session: the pages a browser gets.
type browser struct {
	t   *testing.T
	h   *hub
	cli *http.Client
}

// login signs user in through the hub's login form (the dummy
// authenticator takes any password).
func (h *hub) login(user string) *browser {
	h.t.Helper()
	jar, _ := cookiejar.New(nil)
	b := &browser{t: h.t, h: h, cli: &http.Client{Jar: jar, Timeout: 60 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
	code, body := b.post("/hub/login", url.Values{"username": {user}, "password": {"x"}})
	if code != http.StatusFound {
		h.t.Fatalf("log in as %s: %d %s", user, code, body)
	}
	return b
}

func (b *browser) post(path string, form url.Values) (int, string) {
	b.t.Helper()
	resp, err := b.cli.PostForm(b.h.proxyURL+path, form)
	if err != nil {
		b.t.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func (b *browser) get(path string) (int, string) {
	b.t.Helper()
	resp, err := b.cli.Get(b.h.proxyURL + path)
	if err != nil {
		b.t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// browserLogin signs user in through the hub's login page in Chromium
// (the dummy authenticator takes any password), out of whoever was.
func (h *hub) browserLogin(b *browserTab, user string) {
	h.t.Helper()
	// Log out first: the login page sends a signed-in user on.
	b.do("log out", chromedp.Navigate(h.proxyURL+"/hub/logout"))
	waitPage(b, "the login page", `location.pathname === '/hub/login' && document.readyState === 'complete' && document.querySelector('#username_input') !== null`, 30*time.Second)
	b.do("log in as "+user, chromedp.SetValue("#username_input", user), chromedp.SetValue("#password_input", "x"),
		chromedp.Click("#login_submit"))
	waitPage(b, "logged in as "+user, `!location.pathname.startsWith('/hub/login') && document.readyState === 'complete'`, 30*time.Second)
}

// waitPage waits until expr is true in b's page. Unlike waitJS it
// survives the navigations of the hub's forms and redirects: an
// evaluation that a navigation interrupts is tried again. A load that
// Chromium abandoned because the host's network changed (other tests add
// and remove network interfaces all the time; ERR_NETWORK_CHANGED) is
// reloaded, as its error page offers.
func waitPage(b *browserTab, what, expr string, within time.Duration) {
	b.t.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(b.ctx, 5*time.Second)
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](expr))
		if err == nil && !ok {
			if changed, _ := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.body !== null && document.body.innerText.includes('ERR_NETWORK_CHANGED')`)); changed {
				b.t.Logf("%s: %s: the host's network changed under the page; reloading it", b.name, what)
				_, _ = chromedp.Run(ctx, chromedp.Reload())
			}
		}
		cancel()
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			text, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string]("document.body ? document.body.innerText : ''"))
			b.t.Fatalf("%s: %s: not within %s (last error %v); page text:\n%s", b.name, what, within, err, text)
		}
		time.Sleep(100 * time.Millisecond) // polling, bounded by deadline
	}
}

// browse opens the hub page at path in Chromium and waits until it has
// loaded.
func (h *hub) browse(b *browserTab, path string) {
	h.t.Helper()
	b.do("open "+path, chromedp.Navigate(h.proxyURL+path))
	waitPage(b, "page "+path, fmt.Sprintf(`location.pathname === %q && document.readyState === 'complete' && document.body !== null`, path), 30*time.Second)
}

// readmeCommands returns the commands of the first ```sh block after
// heading in the spawner's README, with what the test must change
// (paths) replaced; lines starting with skip are left out.
func readmeCommands(t *testing.T, root, heading string, replace *strings.Replacer, skip string) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "jupyterhub", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no %q", heading)
	}
	text = text[i:]
	i = strings.Index(text, "```sh\n")
	j := strings.Index(text[i+6:], "```")
	if i < 0 || j < 0 {
		t.Fatalf("README.md's %q has no sh block", heading)
	}
	var out []string
	for _, line := range strings.Split(text[i+6:i+6+j], "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") || (skip != "" && strings.HasPrefix(line, skip)) {
			continue
		}
		out = append(out, replace.Replace(line))
	}
	return out
}

func sh(t *testing.T, dir, command string) string {
	t.Helper()
	c := exec.Command("/bin/sh", "-ec", command)
	c.Dir = dir
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", command, err, out)
	}
	return string(out)
}

// TestJupyterHubE2E: Debian's JupyterHub 3.0 with the spawner installed
// into a virtual environment by the README's own commands and selected as
// spawner_class = "voyager", the dummy authenticator, the spawner's "Leave
// the queue" page, and a key pair whose tokens live 10 s, against `voyager
// dev` (which trusts the public key) with its real agent on a real
// containerd and GPUs of two models. In headless Chromium: JupyterLab at
// /user/<name>/lab, running a notebook cell in a kernel; the web console's
// Jupyter link of that server, through the hub, to Lab with 200; the spawn form
// with the free GPUs of each model; Voyager's reason on the pending page,
// at once and after a reload, for a request no node can hold; a queued
// user's place in line after a reload, and the button that takes him out
// of the queue; Voyager down. Through the hub's REST API and cookie
// sessions: a 4-GPU profile chosen in the form gets the profile's GPUs,
// CPU and memory and answers through the hub's proxy; two readers of its
// progress see every message in order; a profile whose image lacks
// jupyterhub-singleuser fails saying so; a spawn after the first token
// expired succeeds; the hub restarts and still knows its server; stopping
// removes the container.
func TestJupyterHubE2E(t *testing.T) {
	needBinary(t)
	if _, err := exec.LookPath("jupyterhub"); err != nil {
		t.Fatalf("jupyterhub not found: install Debian's jupyterhub (.ci/run does): %v", err)
	}
	rt := privateContainerd(t, "voyager-hub-e2e")
	importImage(t, rt, recipeImage(t, "jupyter"))

	// The spawner, installed as its README says, into a venv that sees
	// Debian's JupyterHub; then the hub's key pair, made by its keygen.
	root, _ := filepath.Abs("../..")
	dir := t.TempDir()
	venv := filepath.Join(dir, "venv")
	paths := strings.NewReplacer("/opt/jupyterhub", venv, "/etc/jupyterhub", dir)
	for _, c := range readmeCommands(t, root, "## Install", paths, "apt-get") {
		sh(t, root, c)
	}
	python := filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(python); err != nil {
		t.Fatalf("the README's install commands made no %s: %v", python, err)
	}
	for _, c := range readmeCommands(t, root, "## Configure", paths, "export") {
		sh(t, root, c)
	}
	privKey, pubKey := filepath.Join(dir, "voyager.key"), filepath.Join(dir, "voyager.pub")

	// The hub's API listens on the machine's own address, which sessions
	// (in their own network namespaces) reach only because the agent is
	// told to allow it: single-user servers call the hub back.
	hubIP := runtimetest.MachineAddr(t)
	hubPort := net.JoinHostPort(hubIP, port(etcdtest.FreeAddr(t)))
	env := newDevEnv(t)
	environ := append(env.environ(), "VOYAGER_JWT_PUBLIC_KEYS="+pubKey, "VOYAGER_AGENT_NETWORK_ALLOW="+hubPort,
		"VOYAGER_AGENT_NODE=hub-e2e", "VOYAGER_AGENT_CONTAINERD="+rt.Address(), "VOYAGER_AGENT_NAMESPACE="+rt.Namespace(),
		"VOYAGER_AGENT_SIMULATE_GPUS=4xA100-80GB,4xH100-80GB", "VOYAGER_AGENT_STOP_GRACE=2s", "VOYAGER_AGENT_ACTIVITY_EVERY=1s",
		"VOYAGER_AGENT_PORTS="+runtimetest.FreePortRange(t, 100)) // apart from the ports of other tests running at the same time
	dev := start(t, environ, "dev")
	dev.waitFor(`msg="node registered"`, 60*time.Second)
	admin := lcAPI{t: t, base: "http://" + env.httpAddr, token: binaryToken(t, environ, "-sub", "root", "-role", "admin")}
	// quad names no image: the spawner's image runs. nojupyter's image
	// (busybox) has no jupyterhub-singleuser.
	for name, p := range map[string]map[string]any{
		"quad":      {"description": "4 GPUs", "resources": map[string]any{"gpus": 4, "cpuMilli": 700, "memoryMiB": 1536}},
		"nojupyter": {"description": "busybox", "image": agentTestImage, "resources": map[string]any{"gpus": 1, "cpuMilli": 200, "memoryMiB": 256}},
	} {
		if code, b := admin.do("PUT", "/api/v1/profiles/"+name, p); code != http.StatusOK && code != http.StatusCreated {
			t.Fatalf("put profile %s: %d %s", name, code, b)
		}
	}
	// ada is in the hub's group vision (load_groups below), which names
	// a team: the spawner signs her groups into its tokens.
	if code, b := admin.do("PUT", "/api/v1/teams/vision", map[string]any{"groups": []string{"vision"}}); code != http.StatusOK {
		t.Fatalf("put team vision: %d %s", code, b)
	}

	adminTok := randomHex(t)
	proxyPort, apiPort := etcdtest.FreeAddr(t), etcdtest.FreeAddr(t)
	config := filepath.Join(dir, "jupyterhub_config.py")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
import voyager_spawner
c.JupyterHub.spawner_class = "voyager"
c.JupyterHub.extra_handlers = voyager_spawner.extra_handlers()
c.VoyagerSpawner.voyager_url = "http://%s"
c.VoyagerSpawner.voyager_private_key_file = %q
c.VoyagerSpawner.voyager_token_lifetime = 10
c.VoyagerSpawner.image = "voyager.local/jupyter:latest"
c.VoyagerSpawner.gpus = 1
c.VoyagerSpawner.cpu_milli = 300
c.VoyagerSpawner.memory_mib = 1024
c.VoyagerSpawner.hub_public_url = "http://%s"
c.JupyterHub.cleanup_servers = False
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = %s
c.JupyterHub.hub_ip = %q
c.JupyterHub.hub_port = %s
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:%s"
c.JupyterHub.db_url = "sqlite:///%s/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "%s/cookie_secret"
c.JupyterHub.api_tokens = {%q: "admin"}
c.Authenticator.admin_users = {"admin"}
c.JupyterHub.load_groups = {"vision": ["ada"]}
# The REST API answers at once (202) so the test reads every progress event.
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 60
`, env.httpAddr, privKey, proxyPort, port(proxyPort), hubIP, port(hubPort), port(apiPort), dir, dir, adminTok)), 0o600); err != nil {
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
	cli := etcdClient(t, env.clientAddr)
	sessions := func(owner string) (out []state.Session, st []state.Status) {
		resp, err := cli.Get(context.Background(), "/voyager/sessions/", clientOpts()...)
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			s, _ := state.Decode[state.Session](kv.Value)
			if s.Owner == owner {
				x, _, _ := state.Get[state.Status](context.Background(), cli, "/voyager/status/"+s.ID)
				out, st = append(out, s), append(st, x)
			}
		}
		return out, st
	}

	// A token minted now with the spawner's lifetime, to show below that
	// such a token has expired by the time eve spawns.
	stale := strings.TrimSpace(sh(t, dir, python+` -c "from voyager_spawner.tokens import Minter; print(Minter('`+privKey+`', 'jupyterhub', ['service'], 10).token())"`))
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if parts := strings.Split(stale, "."); len(parts) != 3 {
		t.Fatalf("minted token %q", stale)
	} else if b, err := base64.RawURLEncoding.DecodeString(parts[1]); err != nil || json.Unmarshal(b, &claims) != nil || claims.Exp == 0 {
		t.Fatalf("minted token's claims %q: %v", parts[1], err)
	}

	// The spawn form, as ada's browser gets it: Voyager's profiles and the
	// free GPUs of each model.
	ada := h.login("ada")
	if code, page := ada.get("/hub/spawn/ada"); code != 200 ||
		!strings.Contains(page, `value="quad"`) ||
		!strings.Contains(page, "NVIDIA A100-80GB (simulated): 4 of 4 GPUs free") ||
		!strings.Contains(page, "NVIDIA H100-80GB (simulated): 4 of 4 GPUs free") {
		t.Fatalf("ada's spawn form: %d\n%s", code, page)
	}
	firstToken := time.Now() // the spawner minted its first token by now, to read the form

	// ada chooses the 4-GPU profile in the form, leaving its resource
	// fields blank; two readers follow her progress, the second from after
	// the first's first message: both see every message, in order.
	if code, page := ada.post("/hub/spawn/ada", url.Values{"profile": {"quad"}, "gpus": {""}, "cpu": {""}, "memory": {""}}); code != http.StatusFound {
		t.Fatalf("ada's spawn form: %d, want a redirect to the pending page\n%s", code, page)
	}
	var wg sync.WaitGroup
	var once sync.Once
	firstSeen := make(chan struct{})
	var readA, readB []string
	var errA, errB error
	wg.Add(2)
	go func() {
		defer wg.Done()
		readA, errA = h.progress("ada", func(string) bool { once.Do(func() { close(firstSeen) }); return false })
	}()
	go func() {
		defer wg.Done()
		<-firstSeen
		readB, errB = h.progress("ada", nil)
	}()
	wg.Wait()
	if errA != nil || errB != nil {
		t.Fatalf("ada's progress: %v; %v", errA, errB)
	}
	t.Logf("ada's progress: %q", readA)
	if fmt.Sprint(readA) != fmt.Sprint(readB) {
		t.Errorf("two readers of ada's progress differ:\n%q\n%q", readA, readB)
	}
	// Events come in the order of the session's life. The stream starts at
	// the session's status when the spawner connects, so a fast placer can
	// make it begin past Waiting or GPUs assigned; never out of order.
	rank := []string{"Server requested", "Waiting for GPUs", "GPUs assigned", "Starting", "Server running", "Server ready"}
	last, seen := -1, map[int]bool{}
	for _, m := range readA {
		for r, prefix := range rank {
			if strings.HasPrefix(m, prefix) {
				if r < last {
					t.Errorf("progress %q goes back from %q to %q", readA, rank[last], prefix)
				}
				last, seen[r] = r, true
			}
		}
	}
	if !seen[0] || !seen[4] || !seen[5] {
		t.Errorf("progress %q lacks %q, %q or %q", readA, rank[0], rank[4], rank[5])
	}
	h.waitServer("ada", true)
	if code, body := h.statusThroughProxy("ada"); code != 200 || !strings.Contains(body, "last_activity") {
		t.Fatalf("GET /user/ada/api/status through the proxy = %d %s", code, body)
	}
	specs, sts := sessions("ada")
	if len(specs) == 1 && (strings.Join(specs[0].Groups, ",") != "vision" || specs[0].Team != "vision") {
		t.Errorf("ada's session through the hub: groups %v, team %q; want her hub group vision and its team", specs[0].Groups, specs[0].Team)
	}
	if len(specs) != 1 || sts[0].Phase != state.PhaseRunning {
		t.Fatalf("ada's Voyager sessions: %+v %+v", specs, sts)
	}
	if r := specs[0].Resources; r.GPUs != 4 || r.CPUMilli != 700 || r.MemoryMiB != 1536 || specs[0].Image != "voyager.local/jupyter:latest" || specs[0].Profile != "quad" {
		t.Errorf("ada's session from the 4-GPU profile: image %q, resources %+v; want the profile's 4 GPUs, 700m CPU, 1536 MiB and the spawner's image", specs[0].Image, r)
	}
	// The agent samples the single-user server under the hub's prefix with
	// the hub server's token (it refuses JUPYTER_TOKEN): the status gains
	// Jupyter's activity, and the simulated GPUs', marked so.
	var act *state.Activity
	for deadline := time.Now().Add(30 * time.Second); act == nil; {
		if _, got := sessions("ada"); len(got) == 1 && got[0].Activity != nil && got[0].Activity.Jupyter != nil {
			act = got[0].Activity
		} else if time.Now().After(deadline) {
			t.Fatalf("ada's session has no Jupyter activity after 30s: %+v", got)
		} else {
			time.Sleep(200 * time.Millisecond) // polling, bounded by deadline
		}
	}
	if act.LastActive.IsZero() || act.Jupyter.LastActivity.IsZero() || len(act.GPUs) != 4 || !act.GPUs[0].Simulated {
		t.Errorf("ada's activity %+v (jupyter %+v); want lastActive, Jupyter's last activity and four simulated GPUs", act, act.Jupyter)
	}

	// In Chromium, ada opens /user/ada/lab through the hub's proxy (its
	// OAuth sign-in on the way): the image's JupyterLab, under the
	// single-user server, with the hub's links in its page config; a
	// notebook from its launcher runs a cell in a kernel, not as root.
	browser := newBrowser(t, "hub")
	shots := artifactDir(t)
	adaSession := specs[0].ID
	t.Cleanup(func() { // what her single-user server said, where a browser step failed
		if t.Failed() {
			code, b := admin.do("GET", "/api/v1/sessions/"+adaSession+"/logs", nil)
			t.Logf("ada's single-user server's log (%d):\n%s", code, b)
		}
	})
	h.browserLogin(browser, "ada")
	// Lab in a tab of its own: its unsaved notebook would hold the hub's
	// pages below behind a "leave this page?" dialog.
	lab := browser.tab("lab")
	if uid := labRunsACell(lab, h.proxyURL+"/user/ada/lab", shots); uid == "0" {
		t.Errorf("ada's kernel runs as root")
	}
	if hub := js[string](lab, `(c => c.hubUser + ' ' + c.hubPrefix)(JSON.parse(document.querySelector('#jupyter-config-data').textContent))`); hub != "ada /hub/" {
		t.Errorf("JupyterLab's page config names hub user and prefix %q, want %q (File > Hub Control Panel needs them)", hub, "ada /hub/")
	}
	// In another tab of her browser, ada signs in to Voyager's web console:
	// her hub server's row links it through the hub (the spawner tells
	// Voyager the hub's public URL), and following the link lands on her
	// JupyterLab with 200.
	console := browser.tab("console")
	console.signIn("http://"+env.httpAddr+"/console/sessions", binaryToken(t, environ, "-sub", "ada"), "")
	sel := fmt.Sprintf(`#sessions tr[data-session=%q] [data-field=jupyter] a`, specs[0].ID)
	link := "document.querySelector('" + sel + "')"
	console.waitJS("the Jupyter link of ada's hub server", link+" !== null", 30*time.Second)
	if href, want := js[string](console, link+".href"), h.proxyURL+"/user/ada/"; href != want {
		t.Errorf("the console links ada's hub server to %q, want %q (through the hub)", href, want)
	}
	console.shot(shots, "console-hub-link")
	// The link opens a new tab (target=_blank); the same click in this
	// tab keeps the test on one page.
	js[bool](console, link+".removeAttribute('target') || true")
	console.do("follow the Jupyter link", chromedp.Click(sel))
	// (A second Lab window takes a workspace of its own: /lab/workspaces/auto-….)
	waitPage(console, "JupyterLab from the console's link", `location.pathname.startsWith('/user/ada/lab') && document.querySelector('#main.jp-LabShell') !== null`, 2*time.Minute)
	if code := js[int](console, `performance.getEntriesByType('navigation')[0].responseStatus`); code != 200 {
		t.Errorf("the console's Jupyter link of ada's hub server answered %d, want 200", code)
	}

	// In Chromium, cy opens the spawn form: Voyager's profiles, blank
	// resource fields, and the free GPUs of each of the two models. He
	// asks for 16 GPUs, which no node can hold: the pending page says
	// Voyager's reason at once, and so does the page after a reload.
	// (With the hub's default slow_spawn_timeout the form itself comes
	// back with the reason; this hub answers at once, for the progress
	// readers.)
	h.browserLogin(browser, "cy")
	h.browse(browser, "/hub/spawn/cy")
	form := js[string](browser, "document.body.innerText")
	for _, want := range []string{`NVIDIA A100-80GB \(simulated\): [0-4] of 4 GPUs free`, `NVIDIA H100-80GB \(simulated\): [0-4] of 4 GPUs free`, `quad\s+4 GPUs`, `nojupyter\s+busybox`, `Default server\s+1 GPU, 0.3 CPUs, 1 GiB`} {
		if !regexp.MustCompile(want).MatchString(form) {
			t.Errorf("the spawn form lacks %q:\n%s", want, form)
		}
	}
	if v := js[string](browser, `document.querySelector('#voyager-cpu').value + '|' + document.querySelector('#voyager-memory').value`); v != "|" {
		t.Errorf("the form's CPU and memory fields are %q, want blank (the profile's)", v)
	}
	browser.shot(shots, "spawn-form")
	began := time.Now()
	browser.do("ask for 16 GPUs", chromedp.SetValue("#voyager-gpus", "16"), chromedp.Click(`#spawn_form input[type=submit]`))
	// The pending page shows it in its progress message, or (when the
	// refusal came first) is already the "Spawn failed" page.
	waitPage(browser, "Voyager's reason on the pending page", `document.body.innerText.includes('Voyager refused this server')`, 60*time.Second)
	if msg := js[string](browser, "document.body.innerText"); !strings.Contains(msg, "no node can ever hold 16") || time.Since(began) > 20*time.Second {
		t.Errorf("cy's pending page after asking 16 GPUs: %q after %s; want Voyager's reason at once", msg, time.Since(began))
	}
	browser.shot(shots, "refused")
	h.browse(browser, "/hub/spawn-pending/cy")
	waitPage(browser, "Voyager's reason after a reload", `document.body.innerText.includes('Voyager refused this server')`, 30*time.Second)
	browser.shot(shots, "refused-reloaded")

	// A profile whose image cannot run a JupyterHub server.
	if msg := h.failure("dee", map[string]any{"profile": "nojupyter"}); !strings.Contains(msg, "The image "+agentTestImage+" has no jupyterhub-singleuser") {
		t.Errorf("dee's spawn with an image without JupyterHub: %q", msg)
	}

	// Token renewal: the spawner's first token has expired (10 s) by the
	// time eve spawns; her spawn succeeds because the spawner minted new
	// ones. A token of that lifetime, minted as ada's spawn began, is
	// refused by now: Voyager does check expiry.
	// The condition is the clock itself: both tokens' expiry, and a second.
	expired := time.Unix(claims.Exp+1, 0)
	if t2 := firstToken.Add(11 * time.Second); t2.After(expired) {
		expired = t2
	}
	time.Sleep(time.Until(expired))
	req, _ := http.NewRequest("GET", "http://"+env.httpAddr+"/api/v1/profiles", nil)
	req.Header.Set("Authorization", "Bearer "+stale)
	req.Header.Set("X-Voyager-On-Behalf-Of", "eve")
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), "expired") {
			t.Errorf("a 10 s token after 12 s: %d %s; want 401 expired", resp.StatusCode, b)
		}
	}
	h.start("eve", map[string]any{})
	if msgs := h.mustProgress("eve", nil); !strings.HasPrefix(msgs[len(msgs)-1], "Server ready") {
		t.Errorf("eve's spawn after the first token expired: %q", msgs)
	}
	if code, b := h.call("DELETE", "/hub/api/users/eve/server", nil); code != 204 && code != 202 {
		t.Fatalf("stop eve's server: %d %s", code, b)
	}
	h.waitServer("eve", false)

	// The hub restarts and still knows ada's server.
	h.stop()
	startHub(t, h)
	h.waitServer("ada", true)
	// The hub puts its servers' routes back into the proxy as it starts,
	// not before it reports them ready: wait for the route.
	for deadline := time.Now().Add(30 * time.Second); ; {
		code, body := h.statusThroughProxy("ada")
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the hub restarted, /user/ada/api/status = %d %s (for 30 s)", code, body)
		}
		time.Sleep(200 * time.Millisecond) // polling the proxy, bounded by deadline
	}

	// bob asks for all 8 GPUs while ada holds four: he waits, with his
	// place; a reload of his page (a new reader) shows it again, with a
	// button to leave the queue. He leaves: the spawn fails at once saying
	// so, and his queued Voyager session is cancelled.
	h.start("bob", map[string]any{"gpus": 8})
	inLine := func(m string) bool { return strings.Contains(m, "ahead of you") || strings.Contains(m, "next in line") }
	for _, reader := range []string{"first", "reload"} {
		msgs := h.mustProgress("bob", inLine)
		if last := msgs[len(msgs)-1]; msgs[0] != "Server requested" || !strings.Contains(last, "8×") || !inLine(last) {
			t.Errorf("bob's progress (%s reader) %q does not show his place in the queue", reader, msgs)
		}
	}
	h.mu.Lock()
	leave := h.lastHTML["bob"]
	h.mu.Unlock()
	if !strings.Contains(leave, `action="/hub/voyager/cancel/bob"`) || !strings.Contains(leave, "Leave the queue") {
		t.Errorf("bob's queue message has no button to leave the queue: %q", leave)
	}
	// In Chromium, bob's pending page shows his place in line, again
	// after a reload, with the button; he clicks it, and the page says he
	// left the queue.
	h.browserLogin(browser, "bob")
	inLineJS := `(t => t.includes('next in line') || t.includes('ahead of you'))(document.querySelector('#progress-message').innerText)`
	for _, step := range []string{"open", "reload"} {
		h.browse(browser, "/hub/spawn-pending/bob") // step: open, then reload
		waitPage(browser, "bob's place in line ("+step+")", inLineJS, 30*time.Second)
	}
	browser.shot(shots, "queued")
	browser.do("leave the queue", chromedp.Click(`#progress-message form button`))
	waitPage(browser, "the page says bob left the queue", `document.body.innerText.includes('You left the queue')`, 30*time.Second)
	browser.shot(shots, "left-the-queue")
	if msgs := h.afterSpawn("bob"); msgs[len(msgs)-1] != "Spawn failed: You left the queue. Start your server again whenever you like." {
		t.Errorf("bob's progress after leaving the queue: %q", msgs)
	}
	h.waitServer("bob", false)
	if _, got := sessions("bob"); len(got) != 1 || got[0].Phase != state.PhaseStopped {
		t.Errorf("bob's session after he left the queue: %+v", got)
	}
	if resp, err := cli.Get(context.Background(), "/voyager/pending/", clientOpts()...); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("queue after bob left: %v (err %v), want empty", resp.Kvs, err)
	}
	// Someone else's queue is not his to leave.
	bob := h.login("bob")
	h.start("gus", map[string]any{"gpus": 8})
	h.mustProgress("gus", inLine)
	if code, _ := bob.post("/hub/voyager/cancel/gus", nil); code != http.StatusForbidden && code != http.StatusNotFound {
		t.Errorf("bob leaving gus's queue: %d, want 403 or 404", code)
	}
	gus := h.login("gus")
	if code, page := gus.post("/hub/voyager/cancel/gus", nil); code != http.StatusFound {
		t.Errorf("gus leaves the queue: %d\n%s", code, page)
	}
	h.waitServer("gus", false)

	// Stopping ada's server removes its container.
	if code, b := h.call("DELETE", "/hub/api/users/ada/server", nil); code != 204 && code != 202 {
		t.Fatalf("stop ada's server: %d %s", code, b)
	}
	h.waitServer("ada", false)
	deadline := time.Now().Add(30 * time.Second)
	for len(containers(t, rt)) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("containers left after the stop: %v", containers(t, rt))
		}
		time.Sleep(200 * time.Millisecond)
	}

	// Without the hub: a notebook session that names no command runs the
	// agent's default, which falls back to Jupyter Server in this image
	// (Debian packages no JupyterLab), and its URL answers Jupyter's API.
	dana := lcAPI{t: t, base: "http://" + env.httpAddr, token: binaryToken(t, environ, "-sub", "dana")}
	id := dana.create(map[string]any{"kind": "notebook", "image": "voyager.local/jupyter:latest", "resources": map[string]any{"gpus": 1, "cpuMilli": 500, "memoryMiB": 512}})
	var st state.Status
	deadline = time.Now().Add(90 * time.Second)
	for st.Phase != state.PhaseRunning {
		if st.Phase.Terminal() || time.Now().After(deadline) {
			t.Fatalf("default notebook command: status %+v\ndev stderr:\n%s", st, dev.stderr())
		}
		time.Sleep(200 * time.Millisecond)
		st, _, _ = state.Get[state.Status](context.Background(), cli, "/voyager/status/"+id)
	}
	// etcd's status has the URL without its token (operators read it); the
	// owner's view through the API has it (joined from secrets/).
	if strings.Contains(st.URLs["jupyter"], "token=") {
		t.Errorf("the status in etcd carries the token: %q", st.URLs["jupyter"])
	}
	code, view := dana.do("GET", "/api/v1/sessions/"+id, nil)
	var v api.SessionView
	if err := json.Unmarshal(view, &v); code != 200 || err != nil {
		t.Fatalf("dana's view: %d %s (%v)", code, view, err)
	}
	u, err := url.Parse(v.Status.URLs["jupyter"])
	if err != nil || u.Query().Get("token") == "" || u.Path != "/" {
		t.Fatalf("jupyter URL %q: want / with a token", v.Status.URLs["jupyter"])
	}
	code, body := httpGet(t, "http://127.0.0.1:"+u.Port()+"/api/status?token="+u.Query().Get("token"))
	if code != 200 || !strings.Contains(body, "last_activity") {
		t.Fatalf("the default notebook's /api/status: %d %s", code, body)
	}
	if code, out := dana.do("DELETE", "/api/v1/sessions/"+id, nil); code >= 300 {
		t.Fatalf("stop dana's notebook: %d %s", code, out)
	}
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}

	// Voyager down: the spawn fails at once, saying so.
	if msg := h.failure("fay", map[string]any{}); !strings.Contains(msg, "Voyager, which runs the servers, is not answering") {
		t.Errorf("fay's spawn with Voyager down: %q", msg)
	}
	// In Chromium, hal's spawn form says Voyager did not answer, and
	// starting anyway fails with the page saying why.
	h.browserLogin(browser, "hal")
	h.browse(browser, "/hub/spawn/hal")
	if form := js[string](browser, "document.body.innerText"); !strings.Contains(form, "Profiles unavailable") || !strings.Contains(form, "Voyager did not answer") {
		t.Errorf("hal's spawn form with Voyager down:\n%s", form)
	}
	browser.do("start anyway", chromedp.Click(`#spawn_form input[type=submit]`))
	waitPage(browser, "the page says Voyager is down", `document.body.innerText.includes('Voyager, which runs the servers, is not answering')`, 30*time.Second)
	browser.shot(shots, "voyager-down")
}

func randomHex(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func clientOpts() []clientv3.OpOption { return []clientv3.OpOption{clientv3.WithPrefix()} }
