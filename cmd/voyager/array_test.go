package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/sweep"
)

// runBinary runs the built binary with environ and returns its exit code,
// stdout and stderr.
func runBinary(t *testing.T, environ []string, args ...string) (int, string, string) {
	t.Helper()
	c := exec.Command(binary, args...)
	c.Env = environ
	var stdout, stderr bytes.Buffer
	c.Stdout, c.Stderr = &stdout, &stderr
	_ = c.Run()
	return c.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

// TestRunSummaryAndArrayRealAgentE2E runs, with nothing faked, `voyager
// dev` (its real agent on a real containerd, 8 simulated GPUs, its array
// controller) and the built CLI: voyager run's end-of-job summary line and
// its -o json object, then a 6-element sweep with a cap of 2 whose odd
// elements fail: voyager run -array waits for it, exits 1 and prints the
// summary, and voyager array get shows every element's exit code; then a
// parameter file; and the history checker finds no revision of dev's etcd
// with more unfinished elements than the cap. The 100-element scale test
// (sweep/) runs the same agent on the in-memory runtime; this is the
// contract on real containers.
func TestRunSummaryAndArrayRealAgentE2E(t *testing.T) {
	needBinary(t)
	env, environ, dev := devWithAgent(t, "voyager-sw-e2e", "sw-e2e", "VOYAGER_AGENT_SIMULATE_GPUS=8xA100-80GB")
	environ = append(environ, envURL+"=http://"+env.httpAddr, envToken+"="+binaryToken(t, environ, "-sub", "ada"))

	// One job: its output on stdout, the summary last on stderr.
	code, stdout, stderr := runBinary(t, environ, "run", "-gpus", "2", "--", "sh", "-c", "echo hi; sleep 1; exit 3")
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	last := lines[len(lines)-1]
	if code != 3 || stdout != "hi\n" {
		t.Fatalf("voyager run: exit %d, stdout %q\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"Failed on sw-e2e", "2 GPU(s)", "GPU-hours", "exit 3"} {
		if !strings.Contains(last, want) {
			t.Errorf("summary line %q lacks %q", last, want)
		}
	}
	// -o json: stdout is the summary alone; the job's output is on stderr.
	code, stdout, stderr = runBinary(t, environ, "run", "-o", "json", "-gpus", "1", "--", "sh", "-c", "echo out; sleep 2")
	var sum RunSummary
	if err := json.Unmarshal([]byte(stdout), &sum); err != nil || code != 0 {
		t.Fatalf("run -o json: exit %d, stdout %q: %v\nstderr:\n%s", code, stdout, err, stderr)
	}
	if sum.Phase != state.PhaseSucceeded || len(sum.Nodes) != 1 || sum.Nodes[0] != "sw-e2e" || sum.GPUs != 1 || sum.ExitCode == nil || *sum.ExitCode != 0 ||
		sum.WallSeconds < 1 || sum.GPUHours < 1.0/3600 || sum.Started == nil || sum.Finished == nil || !strings.Contains(stderr, "out\n") {
		t.Errorf("summary %+v; stderr:\n%s", sum, stderr)
	}

	// A sweep of 6, 2 at a time; odd indices fail with their index.
	code, stdout, stderr = runBinary(t, environ, "run", "-array", "0-5", "-max-running", "2", "-gpus", "1", "-o", "json",
		"--", "sh", "-c", `echo "el $VOYAGER_ARRAY_INDEX of $VOYAGER_ARRAY_SIZE"; exit $(( {index} % 2 * {index} ))`)
	var v api.ArrayView
	if err := json.Unmarshal([]byte(stdout), &v); err != nil || code != 1 {
		t.Fatalf("run -array: exit %d (want 1), stdout %q: %v\nstderr:\n%s", code, stdout, err, stderr)
	}
	if s := v.Summary; s.Size != 6 || s.Succeeded != 3 || s.Failed != 3 || !s.Done || len(v.Elements) != 6 {
		t.Fatalf("summary %+v, %d elements\nstderr:\n%s", s, len(v.Elements), stderr)
	}
	for i, e := range v.Elements {
		if e.Index != i || e.ExitCode == nil || *e.ExitCode != i%2*i {
			t.Errorf("element %d: %+v, want exit %d", i, e, i%2*i)
		}
	}
	if !strings.Contains(stderr, "6 elements, at most 2 at once") || !strings.Contains(stderr, "6/6 ended (3 succeeded, 3 failed, 0 stopped)") {
		t.Errorf("progress:\n%s", stderr)
	}
	// The element's own output, through the API.
	code, stdout, _ = runBinary(t, environ, "session", "logs", state.ElementID(v.ID, 5))
	if code != 0 || stdout != "el 5 of 6\n" {
		t.Errorf("logs of element 5: exit %d, %q", code, stdout)
	}
	code, stdout, _ = runBinary(t, environ, "array", "get", v.ID)
	if code != 0 || !strings.Contains(stdout, "6/6 ended") || !strings.Contains(stdout, state.ElementID(v.ID, 3)) {
		t.Errorf("array get: exit %d\n%s", code, stdout)
	}
	code, stdout, _ = runBinary(t, environ, "array", "list", "-o", "name")
	if code != 0 || strings.TrimSpace(stdout) != v.ID {
		t.Errorf("array list -o name: exit %d, %q", code, stdout)
	}

	// A parameter file: one element per line, {param} in the command.
	params := filepath.Join(t.TempDir(), "params")
	if err := os.WriteFile(params, []byte("alpha\nbeta\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runBinary(t, environ, "run", "-params", params, "--", "sh", "-c", `test "$VOYAGER_ARRAY_PARAM" = "{param}"`)
	if code != 0 || !strings.Contains(stderr, "2/2 ended (2 succeeded") {
		t.Errorf("run -params: exit %d\n%s", code, stderr)
	}
	// The cap held at every revision of the whole history, on real
	// containers as in the 100-element test on the in-memory runtime.
	cli := etcdClient(t, env.clientAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	res, err := history.Watch(ctx, cli, state.MustKeys(state.DefaultPrefix), history.Options{Start: 1, End: r.Header.Revision})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res.Violations {
		t.Errorf("history: %s", v)
	}
	if res.Binds != 10 { // two single jobs, six elements, two params
		t.Errorf("history saw %d binds, want 10", res.Binds)
	}
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}

// TestRunArrayInterruptedStopsIt: Ctrl-C during voyager run -array stops
// the array: its queued elements are cancelled and no more are made.
func TestRunArrayInterruptedStopsIt(t *testing.T) {
	e := newCLIEnv(t)
	loginAs(t, "ada")
	ctrl := sweep.New(e.cli, sweep.Config{Keys: e.keys, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	rctx, interrupt := context.WithCancel(context.Background())
	defer interrupt()
	stderr := &lineWriter{want: "0 running, 3 pending, 7 waiting", seen: make(chan struct{})}
	codec := make(chan int, 1)
	go func() {
		codec <- run(rctx, []string{"run", "-array", "0-9", "-max-running", "3", "--", "true"}, io.Discard, stderr)
	}()
	select {
	case <-stderr.seen: // no node: three queued, seven held back
	case <-time.After(30 * time.Second):
		t.Fatalf("no progress line with three pending:\n%s", stderr.String())
	}
	interrupt()
	if code := <-codec; code != exitRunInterrupted {
		t.Fatalf("exit %d, want %d\n%s", code, exitRunInterrupted, stderr.String())
	}
	if !strings.Contains(stderr.String(), "interrupted; array") || !strings.Contains(stderr.String(), "stopped (") {
		t.Errorf("stderr:\n%s", stderr.String())
	}
	r, err := e.cli.Get(ctx, e.keys.Arrays(), clientv3.WithPrefix())
	if err != nil || len(r.Kvs) != 1 {
		t.Fatalf("arrays: %v", err)
	}
	a, err := state.Decode[state.Array](r.Kvs[0].Value)
	if err != nil || a.Stop == nil || a.Next != 3 {
		t.Fatalf("record %+v, %v; want stopped with 3 made", a, err)
	}
	for i := 0; i < 3; i++ {
		st, _, err := state.Get[state.Status](ctx, e.cli, e.keys.Status(state.ElementID(a.ID, i)))
		if err != nil || st.Phase != state.PhaseStopped {
			t.Errorf("element %d: %s, %v; want Stopped", i, st.Phase, err)
		}
	}
}

// TestRunArrayIdempotencyKey: two voyager run -array invocations with one
// --idempotency-key submit one array; the second follows the first's.
func TestRunArrayIdempotencyKey(t *testing.T) {
	e := newCLIEnv(t)
	loginAs(t, "ada")
	submitted := regexp.MustCompile(`array (\S+) submitted`)
	var ids []string
	for i := range 2 {
		rctx, interrupt := context.WithCancel(context.Background())
		stderr := &lineWriter{want: "submitted", seen: make(chan struct{})}
		codec := make(chan int, 1)
		go func() {
			codec <- run(rctx, []string{"run", "-array", "0-2", "--idempotency-key", "arr-cli-key", "--", "true"}, io.Discard, stderr)
		}()
		select {
		case <-stderr.seen:
		case <-time.After(30 * time.Second):
			t.Fatalf("run %d: never submitted:\n%s", i, stderr.String())
		}
		interrupt() // no controller runs: the array would never end
		if code := <-codec; code != exitRunInterrupted {
			t.Fatalf("run %d: exit %d, want %d\n%s", i, code, exitRunInterrupted, stderr.String())
		}
		m := submitted.FindStringSubmatch(stderr.String())
		if m == nil {
			t.Fatalf("run %d printed no array id:\n%s", i, stderr.String())
		}
		ids = append(ids, m[1])
	}
	if ids[0] != ids[1] {
		t.Errorf("one key submitted arrays %s and %s", ids[0], ids[1])
	}
	r, err := e.cli.Get(context.Background(), e.keys.Arrays(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || r.Count != 1 {
		t.Fatalf("%d arrays (%v), want 1", r.Count, err)
	}
}
