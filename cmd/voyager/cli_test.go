package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

const cliTestSecret = "cli-test-secret-0123456789abcdef0123"

// cliEnv is an API on a real etcd, with VOYAGER_URL pointing at it.
type cliEnv struct {
	t    *testing.T
	cli  *clientv3.Client
	keys state.Keys
}

func newCLIEnv(t *testing.T) *cliEnv {
	t.Helper()
	e, _ := newCLIEnvWith(t, nil)
	return e
}

// newCLIEnvWith is newCLIEnv with the API's config changed by edit (when
// not nil); it also returns the API's URL.
func newCLIEnvWith(t *testing.T, edit func(*api.Config)) (*cliEnv, string) {
	t.Helper()
	cli := etcdtest.New(t)
	k := state.MustKeys(state.DefaultPrefix)
	cfg := api.Config{
		Auth:   api.AuthConfig{HS256Secret: []byte(cliTestSecret)},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if edit != nil {
		edit(&cfg)
	}
	a, err := api.New(cli, k, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	mux := http.NewServeMux()
	a.Mount(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	t.Setenv(envURL, srv.URL)
	t.Setenv("VOYAGER_JWT_SECRET", cliTestSecret)
	t.Setenv(envToken, "")
	return &cliEnv{t: t, cli: cli, keys: k}, srv.URL
}

// voyager runs the CLI in-process and returns its exit code and output.
func voyager(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	code := run(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// fakeAgent plays placer and node agent for every session queued while it
// runs: it binds the session, marks it Running with a log endpoint, runs
// its command with /bin/sh on this machine, serves the output there, and
// reports the exit code — through the same etcd keys and the same log
// contract (status.urls.logs) as the real agent.
type fakeAgent struct {
	env *cliEnv
	srv *httptest.Server

	mu   sync.Mutex
	runs map[string]*fakeRun
}

type fakeRun struct {
	done     chan struct{}
	out      bytes.Buffer
	read     chan struct{} // closed once the whole output was served
	readOnce sync.Once
}

func startFakeAgent(e *cliEnv) *fakeAgent {
	f := &fakeAgent{env: e, runs: map[string]*fakeRun{}}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serveLogs))
	e.t.Cleanup(f.srv.Close)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	e.t.Cleanup(func() { cancel(); wg.Wait() })
	wch := e.cli.Watch(ctx, e.keys.PendingDir(), clientv3.WithPrefix())
	wg.Go(func() {
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				id, _ := e.keys.SessionID(string(ev.Kv.Key))
				wg.Go(func() { f.run(ctx, id, ev.Kv.ModRevision) })
			}
		}
	})
	return f
}

func (f *fakeAgent) serveLogs(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/logs/")
	f.mu.Lock()
	fr := f.runs[id]
	f.mu.Unlock()
	if fr == nil {
		http.NotFound(w, r)
		return
	}
	if r.URL.Query().Get("follow") == "true" {
		<-fr.done
	}
	select {
	case <-fr.done:
		_, _ = w.Write(fr.out.Bytes())
		fr.readOnce.Do(func() { close(fr.read) })
	default:
		// not finished and not following: nothing to show yet
	}
}

func (f *fakeAgent) run(ctx context.Context, id string, pendingRev int64) {
	e := f.env
	s, _, err := state.Get[state.Session](ctx, e.cli, e.keys.Session(id))
	if err != nil {
		return
	}
	prev, _, _ := state.Get[state.Status](ctx, e.cli, e.keys.Status(id))
	attempt := prev.Attempt // a re-queued session's next attempt
	run := fmt.Sprintf("%s/%d", id, attempt)
	now := time.Now().UTC()
	bound := state.Status{Session: id, Phase: state.PhaseBound, Reason: "Bound", Message: "bound to fake-1", Nodes: []string{"fake-1"}, Created: s.Created, Updated: now, Attempt: attempt}
	bv, _ := state.Encode(bound)
	resp, err := e.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(e.keys.Pending(id)), "=", pendingRev)).
		Then(clientv3.OpDelete(e.keys.Pending(id)), clientv3.OpPut(e.keys.Status(id), bv)).Commit()
	if err != nil || !resp.Succeeded {
		return
	}
	fr := &fakeRun{done: make(chan struct{}), read: make(chan struct{})}
	f.mu.Lock()
	f.runs[run] = fr
	f.mu.Unlock()
	running := bound
	running.Phase, running.Reason, running.Message = state.PhaseRunning, "Started", "the command runs on fake-1"
	running.URLs = map[string]string{"logs": f.srv.URL + "/logs/" + run}
	if _, err := state.Put(ctx, e.cli, e.keys.Status(id), running); err != nil {
		return
	}
	if s.Kind != state.KindBatch {
		return
	}
	cmd := exec.CommandContext(ctx, s.Command[0], s.Command[1:]...)
	cmd.Stdout, cmd.Stderr = &fr.out, &fr.out
	err = cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	}
	close(fr.done)
	end := running
	end.Phase, end.Reason, end.Message, end.ExitCode = state.PhaseSucceeded, "Exited", "the command exited", &code
	if code != 0 {
		end.Phase = state.PhaseFailed
	}
	if code != 0 && s.Restart.Policy == state.RestartOnFailure && attempt < s.Restart.MaxRestarts {
		// As the agent does: wait to restart; then, as the lifecycle
		// controller does, re-queue the next attempt. The back-off lasts
		// until the attempt's output was read (a real one lasts seconds,
		// VOYAGER_RESTART_BACKOFF), so a reader sees every attempt.
		end.Phase, end.Reason, end.RetryAt = state.PhasePending, state.ReasonBackOff, &now
		statusRev, err := state.Put(ctx, e.cli, e.keys.Status(id), end)
		if err != nil {
			return
		}
		select {
		case <-fr.read:
		case <-ctx.Done():
			return
		}
		_, specRev, err := state.Get[state.Session](ctx, e.cli, e.keys.Session(id))
		if err != nil {
			return
		}
		_, _ = state.Requeue(ctx, e.cli, e.keys, s, specRev, end, statusRev, attempt+1, "re-queued after a failure", time.Now())
		return
	}
	_, _ = state.Put(ctx, e.cli, e.keys.Status(id), end)
}

// eventually polls cond until it holds (a cache catching up), failing
// after 10s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond) // polling a condition, with a deadline
	}
}

// loginAs sets VOYAGER_TOKEN, for the rest of the test, to a token of sub
// made by voyager token.
func loginAs(t *testing.T, sub string) {
	t.Helper()
	code, tok, stderr := voyager(t, "token", "-sub", sub)
	if code != 0 {
		t.Fatalf("token: %d %s", code, stderr)
	}
	t.Setenv(envToken, strings.TrimSpace(tok))
}

func TestCLIRunExitsWithJobCode(t *testing.T) {
	e := newCLIEnv(t)
	startFakeAgent(e)
	loginAs(t, "ada")

	code, stdout, stderr := voyager(t, "run", "-image", "busybox", "--", "sh", "-c", "echo hi; exit 3")
	if code != 3 || stdout != "hi\n" {
		t.Fatalf("voyager run: exit %d, stdout %q, want 3 and \"hi\\n\"\nstderr:\n%s", code, stdout, stderr)
	}
	for _, s := range []string{"submitted", "Failed: the command exited (exit code 3)"} {
		if !strings.Contains(stderr, s) {
			t.Errorf("progress lacks %q:\n%s", s, stderr)
		}
	}
	code, stdout, _ = voyager(t, "run", "-q", "-image", "busybox", "--", "sh", "-c", "echo ok")
	if code != 0 || stdout != "ok\n" {
		t.Errorf("successful run: exit %d, stdout %q", code, stdout)
	}
	// Refused before anything runs, with the field named.
	code, _, stderr = voyager(t, "run", "-priority", "1000", "--", "true")
	if code != 1 || !strings.Contains(stderr, "priority: got 1000, want -100 to 100") {
		t.Errorf("run with a bad priority: exit %d, stderr %q", code, stderr)
	}
}

func TestCLICommands(t *testing.T) {
	e := newCLIEnv(t)
	ctx := context.Background()
	_, tok, _ := voyager(t, "token", "-sub", "ada")
	_, admin, _ := voyager(t, "token", "-sub", "root", "-admin")
	t.Setenv(envToken, strings.TrimSpace(tok))

	n := state.Node{Name: "gpu-1", Address: "10.0.0.1", CPUMilli: 32000, MemoryMiB: 262144, Simulated: true,
		GPUs: []state.GPU{{UUID: "GPU-a", Model: "NVIDIA A100", MemoryMiB: 81920, Healthy: true}, {Index: 1, UUID: "GPU-b", Model: "NVIDIA A100", MemoryMiB: 81920, Healthy: true}}}
	if _, err := state.Put(ctx, e.cli, e.keys.Node("gpu-1"), n); err != nil {
		t.Fatal(err)
	}

	eventually(t, "the node in the API's view", func() bool {
		_, out, _ := voyager(t, "node", "list", "-o", "json")
		return strings.Contains(out, `"gpu-1"`)
	})
	code, out, errOut := voyager(t, "session", "create", "-o", "json", "-gpus", "1", "-image", "voyager/jupyter", "-env", "A=b")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errOut)
	}
	var v api.SessionView
	if err := json.Unmarshal([]byte(out), &v); err != nil || v.Owner != "ada" || v.Env["A"] != "b" {
		t.Fatalf("create -o json: %v %s", err, out)
	}
	code, out, _ = voyager(t, "session", "list")
	if code != 0 || !strings.Contains(out, "ID") || !strings.Contains(out, v.ID) || !strings.Contains(out, "Pending") {
		t.Errorf("list table:\n%s", out)
	}
	code, out, _ = voyager(t, "session", "list", "-o", "json")
	var list []api.SessionView
	if code != 0 || json.Unmarshal([]byte(out), &list) != nil || len(list) != 1 {
		t.Errorf("list json: %s", out)
	}
	code, out, _ = voyager(t, "session", "get", v.ID)
	if code != 0 || !strings.Contains(out, "Phase:") || !strings.Contains(out, v.ID) {
		t.Errorf("get:\n%s", out)
	}
	eventually(t, "the session in the queue view", func() bool {
		_, out, _ := voyager(t, "queue")
		return strings.Contains(out, v.ID)
	})
	code, out, _ = voyager(t, "queue")
	if code != 0 || !strings.Contains(out, v.ID) {
		t.Errorf("queue:\n%s", out)
	}
	code, _, errOut = voyager(t, "session", "get", "s00000000000000000")
	if code != 1 || !strings.Contains(errOut, `no session "s00000000000000000"`) {
		t.Errorf("get unknown: %d %q", code, errOut)
	}
	code, _, errOut = voyager(t, "session", "create", "-gpus", "9", "-gpu-model", "*A100*", "-image", "x")
	if code != 1 || !strings.Contains(errOut, "no node can ever hold 9×A100") {
		t.Errorf("impossible create: %d %q", code, errOut)
	}

	// wait: a fake agent step to Running while wait follows.
	go func() {
		st, _ := state.Encode(state.Status{Session: v.ID, Phase: state.PhaseRunning, Message: "Jupyter answers"})
		_, _ = e.cli.Txn(ctx).Then(clientv3.OpDelete(e.keys.Pending(v.ID)), clientv3.OpPut(e.keys.Status(v.ID), st)).Commit()
	}()
	code, _, errOut = voyager(t, "session", "wait", "-timeout", "20s", v.ID)
	if code != 0 || !strings.Contains(errOut, "Running: Jupyter answers") {
		t.Errorf("wait: %d %q", code, errOut)
	}
	code, out, _ = voyager(t, "session", "stop", v.ID)
	if code != 0 || !strings.Contains(out, "stopping") {
		t.Errorf("stop: %d %q", code, out)
	}
	code, _, errOut = voyager(t, "session", "logs", v.ID)
	if code != 1 || !strings.Contains(errOut, "no node agent serves logs") {
		t.Errorf("logs without agent: %d %q", code, errOut)
	}

	// Nodes.
	code, out, _ = voyager(t, "node", "list")
	if code != 0 || !strings.Contains(out, "gpu-1") || !strings.Contains(out, "2/2") || !strings.Contains(out, "(simulated)") {
		t.Errorf("node list:\n%s", out)
	}
	code, _, errOut = voyager(t, "node", "cordon", "gpu-1")
	if code != 1 || !strings.Contains(errOut, `needs the "admin" role`) {
		t.Errorf("cordon as user: %d %q", code, errOut)
	}
	t.Setenv(envToken, strings.TrimSpace(admin))
	for _, sub := range []string{"cordon", "uncordon", "drain"} {
		if code, out, errOut := voyager(t, "node", sub, "-reason", "test", "gpu-1"); code != 0 && sub != "uncordon" {
			t.Errorf("node %s: %d %s %s", sub, code, out, errOut)
		}
	}
	eventually(t, "the drain in the API's view", func() bool {
		_, out, _ := voyager(t, "node", "list", "-o", "json")
		return strings.Contains(out, `"drain": true`)
	})
	code, out, _ = voyager(t, "node", "list", "-o", "json")
	var nodes []api.NodeSummary
	if code != 0 || json.Unmarshal([]byte(out), &nodes) != nil || len(nodes) != 1 || nodes[0].Cordon == nil || !nodes[0].Cordon.Drain {
		t.Errorf("node list json after drain: %s", out)
	}

	// Usage errors.
	t.Setenv(envToken, "")
	code, _, errOut = voyager(t, "session", "list")
	if code != 2 || !strings.Contains(errOut, "no API token: set VOYAGER_TOKEN") {
		t.Errorf("no token: %d %q", code, errOut)
	}
	code, out, _ = voyager(t, "help", "run")
	if code != 0 || !strings.Contains(out, "voyager run [flags] -- COMMAND") {
		t.Errorf("help run: %q", out)
	}
	_ = fmt.Sprint
}

// binaryToken runs the built binary's `voyager token args…` in environ
// and returns the token.
func binaryToken(t *testing.T, environ []string, args ...string) string {
	t.Helper()
	c := exec.Command(binary, append([]string{"token"}, args...)...)
	c.Env = environ
	out, err := c.Output()
	if err != nil {
		t.Fatalf("voyager token: %v", err)
	}
	return strings.TrimSpace(string(out))
}

// runHiExit3 runs the built binary's `voyager run [runArgs] -- sh -c
// 'echo hi; exit 3'` against the API at httpAddr and checks that it prints
// hi and exits 3, the job's code.
func runHiExit3(t *testing.T, environ []string, httpAddr, token string, runArgs ...string) {
	t.Helper()
	args := append(append([]string{"run"}, runArgs...), "--", "sh", "-c", "echo hi; exit 3")
	if code, stdout, stderr := runBinaryAs(t, environ, httpAddr, token, args...); code != 3 || stdout != "hi\n" {
		t.Fatalf("voyager run: exit %d, stdout %q\nstderr:\n%s", code, stdout, stderr)
	}
}

// runBinaryAs runs the built binary with args against the API at httpAddr
// as token, and returns its exit code, stdout and stderr.
func runBinaryAs(t *testing.T, environ []string, httpAddr, token string, args ...string) (int, string, string) {
	t.Helper()
	return runBinary(t, append(slices.Clone(environ), envURL+"=http://"+httpAddr, envToken+"="+token), args...)
}

// devWithAgent starts the built binary's `voyager dev` with its real agent
// (node name node) on a private containerd whose namespace is namespace,
// with the settings extra adds (VAR=value: a later one wins), and waits
// for the node to register. It returns dev's environment (extra
// included) and the process.
func devWithAgent(t *testing.T, namespace, node string, extra ...string) (devEnv, []string, *proc) {
	t.Helper()
	return devOn(t, privateContainerd(t, namespace), node, extra...)
}

// devOn is devWithAgent on rt, a containerd namespace the test prepared
// (an image imported).
func devOn(t *testing.T, rt *runtime.Containerd, node string, extra ...string) (devEnv, []string, *proc) {
	t.Helper()
	env := newDevEnv(t)
	environ := append(env.environ(),
		"VOYAGER_AGENT_NODE="+node, "VOYAGER_AGENT_CONTAINERD="+rt.Address(), "VOYAGER_AGENT_NAMESPACE="+rt.Namespace(),
		"VOYAGER_AGENT_IMAGE="+agentTestImage, "VOYAGER_AGENT_STOP_GRACE=1s")
	environ = append(environ, extra...)
	dev := start(t, environ, "dev")
	dev.waitFor(`msg="node registered"`, 60*time.Second)
	return env, environ, dev
}

// TestRunAgainstDevE2E runs the built binary: `voyager dev`, then
// `voyager token` reading dev's generated secret, then `voyager run` as a
// separate process, with the fake agent standing in for the node agent on
// dev's etcd.
func TestRunAgainstDevE2E(t *testing.T) {
	needBinary(t)
	env := newDevEnv(t)
	dev := start(t, env.environ(), "dev")
	dev.waitFor(`msg="voyager dev ready"`, 30*time.Second)
	startFakeAgent(&cliEnv{t: t, cli: etcdClient(t, env.clientAddr), keys: state.MustKeys(state.DefaultPrefix)})

	runHiExit3(t, env.environ(), env.httpAddr, binaryToken(t, env.environ(), "-sub", "ada"), "-image", "busybox")
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}

// TestRunRealAgentE2E is the experiment runner's path end to end with
// nothing faked: `voyager dev` with its real agent on a real containerd,
// and `voyager run -- sh -c 'echo hi; exit 3'` prints hi (through the API
// from the agent's log endpoint) and exits 3.
func TestRunRealAgentE2E(t *testing.T) {
	needBinary(t)
	env, environ, dev := devWithAgent(t, "voyager-run-e2e", "run-e2e")

	runHiExit3(t, environ, env.httpAddr, binaryToken(t, environ, "-sub", "ada"))
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}

// TestCLIRunPrintsWarnings: a job's owner running it with voyager run sees
// the lifecycle controller's warning (here written by the test) before
// the job ends.
func TestCLIRunPrintsWarnings(t *testing.T) {
	e := newCLIEnv(t)
	startFakeAgent(e)
	loginAs(t, "ada")
	gate := filepath.Join(t.TempDir(), "go")
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		c, o, s := voyager(t, "run", "-image", "busybox", "--", "sh", "-c", "while [ ! -e "+gate+" ]; do sleep 0.05; done; echo done")
		done <- result{c, o, s}
	}()
	// The job runs: warn it, then let it finish.
	var id string
	eventually(t, "the job running", func() bool {
		r, err := e.cli.Get(context.Background(), e.keys.StatusDir(), clientv3.WithPrefix())
		if err != nil || len(r.Kvs) != 1 {
			return false
		}
		st, err := state.Decode[state.Status](r.Kvs[0].Value)
		id = st.Session
		return err == nil && st.Phase == state.PhaseRunning
	})
	w := state.Warning{Session: id, Reason: state.ReasonPreempted, Message: "preempted by s-vip; stops in 2m and is re-queued",
		Issued: time.Now().UTC(), StopAt: time.Now().UTC().Add(2 * time.Minute)}
	if _, err := state.Put(context.Background(), e.cli, e.keys.Warning(id), w); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.code != 0 || r.stdout != "done\n" {
		t.Fatalf("voyager run: exit %d, stdout %q\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	wi, si := strings.Index(r.stderr, "warning: "), strings.Index(r.stderr, "Succeeded")
	if wi < 0 || !strings.Contains(r.stderr, "preempted by s-vip") || si < wi {
		t.Fatalf("voyager run did not print the warning before the end:\n%s", r.stderr)
	}
}
