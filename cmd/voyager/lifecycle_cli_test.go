package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// newLimitedCLIEnv is newCLIEnv with a cluster max runtime and cap.
func newLimitedCLIEnv(t *testing.T, maxRuntime, maxRuntimeCap time.Duration) (*cliEnv, string) {
	t.Helper()
	return newCLIEnvWith(t, func(c *api.Config) { c.MaxRuntime, c.MaxRuntimeCap = maxRuntime, maxRuntimeCap })
}

// lineWriter collects what is written and says when a line containing
// want has been.
type lineWriter struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	want string
	seen chan struct{}
	once sync.Once
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if strings.Contains(w.buf.String(), w.want) {
		w.once.Do(func() { close(w.seen) })
	}
	return len(p), nil
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

func TestCLISessionLifecycle(t *testing.T) {
	e, url := newLimitedCLIEnv(t, 8*time.Hour, 12*time.Hour)
	_, tok, _ := voyager(t, "token", "-sub", "ada")
	_, admin, _ := voyager(t, "token", "-sub", "root", "-admin")
	tok, admin = strings.TrimSpace(tok), strings.TrimSpace(admin)
	t.Setenv(envToken, tok)
	ctx := context.Background()

	code, out, errOut := voyager(t, "session", "create", "-o", "json", "-gpus", "1", "-image", "voyager/jupyter")
	if code != 0 {
		t.Fatalf("create: %d %s", code, errOut)
	}
	var v api.SessionView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	// Make it run on gpu-1 as placer and agent would, with one GPU unused.
	n := state.Node{Name: "gpu-1", Address: "10.0.0.1", CPUMilli: 64000, MemoryMiB: 1 << 19, Simulated: true, Registered: time.Now().UTC(),
		GPUs: []state.GPU{{UUID: "GPU-gpu-1-0", Model: "NVIDIA A100-SXM4-80GB", MemoryMiB: 81920, Healthy: true}}}
	if _, err := state.Put(ctx, e.cli, e.keys.Node("gpu-1"), n); err != nil {
		t.Fatal(err)
	}
	led := state.Ledger{Node: "gpu-1", Allocations: map[string]state.Allocation{v.ID: {Owner: "ada", Role: state.RoleSingle, GPUs: []string{"GPU-gpu-1-0"}}}}
	if _, err := state.Put(ctx, e.cli, e.keys.Ledger("gpu-1"), led); err != nil {
		t.Fatal(err)
	}
	if _, err := e.cli.Delete(ctx, e.keys.Pending(v.ID)); err != nil {
		t.Fatal(err)
	}
	started := time.Now().UTC().Add(-3 * time.Hour)
	idle := started.Add(time.Minute)
	running := state.Status{Session: v.ID, Phase: state.PhaseRunning, Reason: "Started", Message: "Jupyter answers", Nodes: []string{"gpu-1"}, Started: &started,
		Activity: &state.Activity{LastActive: idle, Sampled: time.Now().UTC(),
			Jupyter: &state.JupyterActivity{LastActivity: idle, Kernels: 2, Connections: 1},
			GPUs:    []state.GPUActivity{{UUID: "GPU-gpu-1-0", IdleSince: &idle, Unused: true, Simulated: true}}}}
	if _, err := state.Put(ctx, e.cli, e.keys.Status(v.ID), running); err != nil {
		t.Fatal(err)
	}
	stopAt := time.Now().UTC().Add(15 * time.Minute)
	w := state.Warning{Session: v.ID, Reason: state.ReasonIdle, Message: "idle since 3h ago (no Jupyter activity, no busy kernel, no busy GPU; idle timeout 2h0m0s)", Issued: time.Now().UTC(), StopAt: stopAt}
	if _, err := state.Put(ctx, e.cli, e.keys.Warning(v.ID), w); err != nil {
		t.Fatal(err)
	}

	code, out, errOut = voyager(t, "session", "get", v.ID)
	if code != 0 {
		t.Fatalf("get: %d %s", code, errOut)
	}
	for _, re := range []string{
		`Warning:\s+IdleTimeout: will be stopped at ` + regexp.QuoteMeta(stopAt.Format(timeLayout)) + ` \(in 1[45]m0s\)`,
		`Why:\s+` + regexp.QuoteMeta(w.Message),
		`Runs until:\s+` + regexp.QuoteMeta(started.Add(8*time.Hour).Format(timeLayout)),
		`Last active:\s+` + regexp.QuoteMeta(idle.Format(timeLayout)) + ` \(2h ago\)`,
		`Jupyter:\s+2 kernel\(s\), 0 busy, 1 connection\(s\)`,
		`GPU GPU-gpu-1-0:\s+UNUSED since ` + regexp.QuoteMeta(idle.Format(timeLayout)) + ` \(2h\): no process, no utilisation \(simulated\)`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("session get lacks %s:\n%s", re, out)
		}
	}

	// Extend: within the cap, then over it, then a bad duration.
	code, out, errOut = voyager(t, "session", "extend", v.ID, "2h")
	if want := v.ID + ": max runtime now 10h0m0s, runs until " + started.Add(10*time.Hour).Format(timeLayout) + "\n"; code != 0 || out != want {
		t.Errorf("extend: %d %q %q, want %q", code, out, errOut, want)
	}
	code, _, errOut = voyager(t, "session", "extend", v.ID, "5h")
	if code != 1 || errOut != "voyager session extend: the cluster caps max runtime at 12h0m0s and this session's limit is 10h0m0s, so at most 2h0m0s may still be added; got 5h0m0s\n  by: want at most 2h0m0s\n" {
		t.Errorf("extend over the cap: %d %q", code, errOut)
	}
	code, _, errOut = voyager(t, "session", "extend", v.ID, "soon")
	if code != 2 || !strings.Contains(errOut, `invalid duration "soon": want a positive Go duration such as 2h or 90m`) {
		t.Errorf("extend soon: %d %q", code, errOut)
	}
	code, _, errOut = voyager(t, "session", "extend", v.ID)
	if code != 2 || !strings.Contains(errOut, "want 2 argument(s) (ID DURATION), got 1") {
		t.Errorf("extend without a duration: %d %q", code, errOut)
	}

	// node list: the UNUSED column.
	eventually(t, "the unused GPU in node list", func() bool {
		_, out, _ := voyager(t, "node", "list", "-token", admin)
		return regexp.MustCompile(`(?m)^gpu-1\s+0/1\s+1\s`).MatchString(out)
	})
	_, out, _ = voyager(t, "node", "list")
	if !strings.Contains(out, "UNUSED") {
		t.Errorf("node list header:\n%s", out)
	}

	// wait prints the warning, and the stop after it.
	c, err := (&clientFlags{url: url, token: tok}).client()
	if err != nil {
		t.Fatal(err)
	}
	stderr := &lineWriter{want: "WARNING: ", seen: make(chan struct{})}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	res := make(chan int, 1)
	go func() { res <- waitSession(wctx, c, v.ID, "end", 0, &clientFlags{output: "table"}, io.Discard, stderr) }()
	select {
	case <-stderr.seen:
	case <-wctx.Done():
		t.Fatalf("no warning printed: %q", stderr.String())
	}
	stopped := state.Status{Session: v.ID, Phase: state.PhaseStopped, Reason: state.ReasonIdle, Message: "stopped after being idle past its idle timeout of 2h0m0s"}
	if _, err := state.Put(ctx, e.cli, e.keys.Status(v.ID), stopped); err != nil {
		t.Fatal(err)
	}
	if code := <-res; code != 0 {
		t.Errorf("wait: %d", code)
	}
	want := "Running: Jupyter answers\n" +
		"WARNING: will be stopped at " + stopAt.Format("15:04 UTC") + ": " + w.Message + "\n" +
		"Stopped: stopped after being idle past its idle timeout of 2h0m0s\n"
	if stopAt.YearDay() != time.Now().UTC().YearDay() {
		want = strings.Replace(want, stopAt.Format("15:04 UTC"), stopAt.Format(timeLayout), 1)
	}
	if got := stderr.String(); got != want {
		t.Errorf("wait printed\n%s\nwant\n%s", got, want)
	}
}

func TestCLIHelpNamesExtend(t *testing.T) {
	code, out, _ := voyager(t, "session", "--help")
	if code != 0 || !strings.Contains(out, "extend ") || !strings.Contains(out, "DURATION longer") {
		t.Errorf("session --help: %d\n%s", code, out)
	}
	code, out, _ = voyager(t, "session", "extend", "--help")
	if code != 0 || !strings.Contains(out, "voyager session extend ID DURATION [flags]") || !strings.Contains(out, "VOYAGER_MAX_RUNTIME_CAP") {
		t.Errorf("session extend --help: %d\n%s", code, out)
	}
}
