package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// jupyterImage builds (once, cached outside the repository) the notebook
// image from Debian's packages and returns the path of its archive.
func jupyterImage(t *testing.T) string {
	t.Helper()
	cache := os.Getenv("VOYAGER_IMAGE_CACHE")
	if cache == "" {
		home, _ := os.UserHomeDir()
		cache = filepath.Join(home, ".cache", "voyager", "images")
	}
	out := filepath.Join(cache, "voyager.local-jupyter.tar") // as make image names it
	if _, err := os.Stat(out); err == nil {
		return out
	}
	root, _ := filepath.Abs("../..")
	cmd := exec.Command(filepath.Join(root, "deploy", "images", "jupyter", "build.sh"), out)
	var log bytes.Buffer
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Run(); err != nil {
		t.Fatalf("build the Jupyter image (deploy/images/jupyter/build.sh): %v\n%s", err, log.String())
	}
	return out
}

// hub is a running JupyterHub with the VoyagerSpawner.
type hub struct {
	t                  *testing.T
	dir, config, token string
	hubURL, proxyURL   string
	proc               *exec.Cmd
	log                *lockedBuffer
}

// lockedBuffer is a log that a process writes while the test reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func startHub(t *testing.T, h *hub) {
	t.Helper()
	h.log = &lockedBuffer{}
	h.proc = exec.Command("jupyterhub", "-f", h.config)
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

// progress reads the hub's progress stream of user's server until it
// reports ready or failed, or until stop returns true for a message.
func (h *hub) progress(user string, stop func(msg string) bool) []string {
	req, _ := http.NewRequest("GET", h.hubURL+"/hub/api/users/"+user+"/server/progress", nil)
	req.Header.Set("Authorization", "token "+h.token)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		h.t.Fatalf("progress of %s: %v", user, err)
	}
	defer resp.Body.Close()
	var msgs []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data:") {
			continue
		}
		var ev struct {
			Message string `json:"message"`
			Ready   bool   `json:"ready"`
			Failed  bool   `json:"failed"`
		}
		if json.Unmarshal([]byte(strings.TrimSpace(line[5:])), &ev) != nil {
			continue
		}
		msgs = append(msgs, ev.Message)
		if ev.Ready || ev.Failed || (stop != nil && stop(ev.Message)) {
			break
		}
	}
	return msgs
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

// port is the port of a host:port address.
func port(addr string) string { return addr[strings.LastIndex(addr, ":")+1:] }

// TestJupyterHubE2E: a real JupyterHub (Debian's) with the VoyagerSpawner
// and a dummy authenticator, against `voyager dev` with its real agent on a
// real containerd. A user's server starts through the hub's REST API in a
// container from the image built from Debian's packages; the hub proxies
// to it; progress arrives in order; the hub restarts and still knows the
// server; a second user who asks for more GPUs than are free waits with a
// queue position, and when the hub gives up on the spawn his queued session
// is cancelled; stopping removes the container.
func TestJupyterHubE2E(t *testing.T) {
	needBinary(t)
	if _, err := exec.LookPath("jupyterhub"); err != nil {
		t.Fatalf("jupyterhub not found: install Debian's jupyterhub (.ci/run does): %v", err)
	}
	rt := privateContainerd(t, "voyager-hub-e2e")
	archive := jupyterImage(t)
	f, err := os.Open(archive)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Import(context.Background(), f); err != nil {
		t.Fatalf("import %s: %v", archive, err)
	}
	f.Close()

	// The hub's API listens on the machine's own address, which sessions
	// (in their own network namespaces) reach only because the agent is
	// told to allow it: single-user servers call the hub back.
	hubIP := runtimetest.MachineAddr(t)
	hubPort := net.JoinHostPort(hubIP, port(freeAddr(t)))
	env := newDevEnv(t)
	environ := append(env.environ(),
		"VOYAGER_AGENT_NETWORK_ALLOW="+hubPort,
		"VOYAGER_AGENT_NODE=hub-e2e", "VOYAGER_AGENT_CONTAINERD="+rt.Address(), "VOYAGER_AGENT_NAMESPACE="+rt.Namespace(),
		"VOYAGER_AGENT_SIMULATE_GPUS=8xA100-80GB", "VOYAGER_AGENT_STOP_GRACE=2s", "VOYAGER_AGENT_ACTIVITY_EVERY=1s",
		"VOYAGER_AGENT_PORTS=44000-44099") // apart from the ports other packages' containerd tests use at the same time
	dev := start(t, environ, "dev")
	dev.waitFor(`msg="node registered"`, 60*time.Second)
	svcTok := binaryToken(t, environ, "-sub", "jupyterhub", "-role", "service")

	root, _ := filepath.Abs("../..")
	dir := t.TempDir()
	adminTok := randomHex(t)
	proxyPort, apiPort := freeAddr(t), freeAddr(t)
	config := filepath.Join(dir, "jupyterhub_config.py")
	if err := os.WriteFile(config, []byte(fmt.Sprintf(`
import sys
sys.path.insert(0, %q)
c.JupyterHub.spawner_class = "voyager_spawner.VoyagerSpawner"
c.JupyterHub.authenticator_class = "dummy"
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = %s
c.JupyterHub.hub_ip = %q
c.JupyterHub.hub_port = %s
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:%s"
c.JupyterHub.db_url = "sqlite:///%s/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "%s/cookie_secret"
c.JupyterHub.cleanup_servers = False
c.JupyterHub.api_tokens = {%q: "admin"}
c.Authenticator.admin_users = {"admin"}
# The REST API answers at once (202) so the test reads every progress event.
c.JupyterHub.tornado_settings = {"slow_spawn_timeout": 0}
# JupyterHub 3.0 refuses to stop a pending spawn through its API ("pending
# spawn, please wait"); it cancels one by giving up after start_timeout and
# stopping the spawner, which cancels the queued Voyager session.
c.Spawner.start_timeout = 30
c.Spawner.http_timeout = 60
c.VoyagerSpawner.voyager_url = "http://%s"
c.VoyagerSpawner.voyager_token = %q
c.VoyagerSpawner.gpus = 1
c.VoyagerSpawner.cpu_milli = 1000
c.VoyagerSpawner.memory_mib = 1024
`, filepath.Join(root, "deploy", "jupyterhub"), port(proxyPort), hubIP, port(hubPort), port(apiPort), dir, dir, adminTok,
		env.httpAddr, svcTok)), 0o600); err != nil {
		t.Fatal(err)
	}
	h := &hub{t: t, dir: dir, config: config, token: adminTok, hubURL: "http://" + hubPort, proxyURL: "http://" + proxyPort}
	startHub(t, h)
	t.Cleanup(func() {
		h.stop()
		if t.Failed() {
			t.Logf("jupyterhub log:\n%s", h.log.String())
		}
	})

	// ada's server: started through the hub's REST API.
	if code, b := h.call("POST", "/hub/api/users/ada", nil); code != 201 && code != 409 {
		t.Fatalf("create user ada: %d %s", code, b)
	}
	if code, b := h.call("POST", "/hub/api/users/ada/server", map[string]any{}); code != 201 && code != 202 {
		t.Fatalf("start ada's server: %d %s", code, b)
	}
	msgs := h.progress("ada", nil)
	t.Logf("ada's progress: %q", msgs)
	// Events come in the order of the session's life. The stream starts at
	// the session's status when the spawner connects, so a fast placer can
	// make it begin past Waiting or GPUs assigned; never out of order.
	rank := []string{"Waiting for GPUs", "GPUs assigned", "Starting", "Server running", "Server ready"}
	last, seen := -1, map[int]bool{}
	for _, m := range msgs {
		for r, prefix := range rank {
			if strings.HasPrefix(m, prefix) {
				if r < last {
					t.Errorf("progress %q goes back from %q to %q", msgs, rank[last], prefix)
				}
				last, seen[r] = r, true
			}
		}
	}
	if !seen[3] || !seen[4] {
		t.Errorf("progress %q lacks %q or %q", msgs, rank[3], rank[4])
	}
	h.waitServer("ada", true)
	if code, body := h.statusThroughProxy("ada"); code != 200 || !strings.Contains(body, "last_activity") {
		t.Fatalf("GET /user/ada/api/status through the proxy = %d %s", code, body)
	}
	sessions := func(owner string) []state.Status {
		cli := etcdClient(t, env.clientAddr)
		var out []state.Status
		resp, err := cli.Get(context.Background(), "/voyager/sessions/", clientOpts()...)
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range resp.Kvs {
			s, _ := state.Decode[state.Session](kv.Value)
			if s.Owner == owner {
				st, _, _ := state.Get[state.Status](context.Background(), cli, "/voyager/status/"+s.ID)
				out = append(out, st)
			}
		}
		return out
	}
	if got := sessions("ada"); len(got) != 1 || got[0].Phase != state.PhaseRunning {
		t.Fatalf("ada's Voyager sessions: %+v", got)
	}
	// The agent samples the single-user server under the hub's prefix with
	// the hub server's token (it refuses JUPYTER_TOKEN): the status gains
	// Jupyter's activity, and the simulated GPU's, marked so.
	var act *state.Activity
	for deadline := time.Now().Add(30 * time.Second); act == nil; {
		if got := sessions("ada"); len(got) == 1 && got[0].Activity != nil && got[0].Activity.Jupyter != nil {
			act = got[0].Activity
		} else if time.Now().After(deadline) {
			t.Fatalf("ada's session has no Jupyter activity after 30s: %+v", got)
		} else {
			time.Sleep(200 * time.Millisecond) // polling, bounded by deadline
		}
	}
	if act.LastActive.IsZero() || act.Jupyter.LastActivity.IsZero() || len(act.GPUs) != 1 || !act.GPUs[0].Simulated {
		t.Errorf("ada's activity %+v (jupyter %+v); want lastActive, Jupyter's last activity and one simulated GPU", act, act.Jupyter)
	}

	// An impossible request fails at once, with Voyager's reason on the
	// hub's spawn page (its progress stream), not after start_timeout.
	if code, b := h.call("POST", "/hub/api/users/cy", nil); code != 201 && code != 409 {
		t.Fatalf("create user cy: %d %s", code, b)
	}
	began := time.Now()
	if code, b := h.call("POST", "/hub/api/users/cy/server", map[string]any{"gpus": 16}); code != 202 && code != 201 && code != 500 {
		t.Fatalf("start cy's server: %d %s", code, b)
	}
	cyMsgs := h.progress("cy", nil)
	if last := cyMsgs[len(cyMsgs)-1]; !strings.Contains(last, "Spawn failed") || !strings.Contains(last, "16") || time.Since(began) > 15*time.Second {
		t.Errorf("impossible request: progress %q after %s; want a failure naming the request, at once", cyMsgs, time.Since(began))
	}
	t.Logf("cy's progress: %q", cyMsgs)

	// The hub restarts and still knows ada's server.
	h.stop()
	startHub(t, h)
	h.waitServer("ada", true)
	if code, body := h.statusThroughProxy("ada"); code != 200 {
		t.Fatalf("after the hub restarted, /user/ada/api/status = %d %s", code, body)
	}

	// bob asks for all 8 GPUs while ada holds one: he waits, with his place.
	if code, b := h.call("POST", "/hub/api/users/bob", nil); code != 201 && code != 409 {
		t.Fatalf("create user bob: %d %s", code, b)
	}
	if code, b := h.call("POST", "/hub/api/users/bob/server", map[string]any{"gpus": 8}); code != 202 && code != 201 {
		t.Fatalf("start bob's server: %d %s", code, b)
	}
	msgs = h.progress("bob", func(m string) bool { return strings.Contains(m, "ahead of you") || strings.Contains(m, "next in line") })
	if last := msgs[len(msgs)-1]; !strings.Contains(last, "8×") || !(strings.Contains(last, "ahead of you") || strings.Contains(last, "next in line")) {
		t.Errorf("bob's progress %q does not show his place in the queue", msgs)
	}
	// The hub gives up on bob's spawn after start_timeout and stops his
	// spawner: the queued Voyager session is cancelled, nothing is left.
	h.waitServer("bob", false)
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := sessions("bob")
		if len(got) == 1 && got[0].Phase == state.PhaseStopped {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("bob's session after the hub cancelled it: %+v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if resp, err := etcdClient(t, env.clientAddr).Get(context.Background(), "/voyager/pending/", clientOpts()...); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("queue after the cancel: %v (err %v), want empty", resp.Kvs, err)
	}

	// Stopping ada's server removes its container.
	if code, b := h.call("DELETE", "/hub/api/users/ada/server", nil); code != 204 && code != 202 {
		t.Fatalf("stop ada's server: %d %s", code, b)
	}
	h.waitServer("ada", false)
	deadline = time.Now().Add(30 * time.Second)
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
	cli := etcdClient(t, env.clientAddr)
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
}

func randomHex(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func clientOpts() []clientv3.OpOption { return []clientv3.OpOption{clientv3.WithPrefix()} }
