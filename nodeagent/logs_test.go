package nodeagent_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentServesLogs: a running batch session's status carries a signed
// log URL; following it streams output as the container writes it and ends
// when the container exits; the URL outlives the container; a wrong key is
// refused.
func TestAgentServesLogs(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	srv := runLogsAgent(t, testConfig(t, cli, rt))

	b := bind(t, cli, state.Session{ID: "job1", Owner: "ada", Kind: state.KindBatch, Image: "busybox", Command: []string{"sh", "-c", "train"}},
		state.Binding{CPUMilli: 500, MemoryMiB: 256})
	st := waitPhase(t, cli, "job1", state.PhaseRunning, 10*time.Second)
	// The signed URL is under secrets/; the status has it without its key.
	logs := secretURL(t, cli, "job1", "logs")
	if !strings.HasPrefix(logs, srv.URL+nodeagent.LogsPath) || !strings.Contains(logs, "key=") || strings.Contains(st.URLs["logs"], "key=") {
		t.Fatalf("status.urls.logs = %q, secret %q; want the signed URL on the agent under secrets/ only", st.URLs["logs"], logs)
	}
	id := nodeagent.ContainerID(b)
	spec, _ := rt.Spec(id)
	appendLog(t, spec.LogPath, "epoch 1\n")

	// Follow from the start: the first line now, the rest as it comes.
	resp, err := http.Get(withQuery(logs, "tail", "0", "follow", "true"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("GET logs = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	r := bufio.NewReader(resp.Body)
	if line, _ := r.ReadString('\n'); line != "epoch 1\n" {
		t.Fatalf("first streamed line %q", line)
	}
	appendLog(t, spec.LogPath, "epoch 2\n")
	if line, _ := r.ReadString('\n'); line != "epoch 2\n" {
		t.Fatalf("second streamed line %q", line)
	}
	if err := rt.Finish(id, 3, "done\n"); err != nil {
		t.Fatal(err)
	}
	rest, err := io.ReadAll(r) // ends once the container has exited
	if err != nil || string(rest) != "done\n" {
		t.Fatalf("rest of the stream = %q, %v", rest, err)
	}

	final := waitPhase(t, cli, "job1", state.PhaseFailed, 10*time.Second)
	if !strings.HasPrefix(final.URLs["logs"], srv.URL+nodeagent.LogsPath) {
		t.Errorf("final status lost the log URL: %v", final.URLs)
	}
	if got := get(t, withQuery(logs, "tail", "2")); got != "epoch 2\ndone\n" {
		t.Errorf("tail=2 after the container is gone = %q", got)
	}
	bad := strings.Replace(logs, "key=", "key=0", 1)
	if resp, err := http.Get(bad); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("wrong key: %v %v, want 403", resp.StatusCode, err)
	}
	other := strings.Replace(logs, id, "other-q1", 1)
	if resp, err := http.Get(other); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("another container with this key: %v %v, want 403", resp.StatusCode, err)
	}
}

// runLogsAgent runs an agent whose log endpoint an HTTP test server
// serves, for the test's life, and returns the server.
func runLogsAgent(t *testing.T, cfg nodeagent.Config) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	cfg.LogsBaseURL = srv.URL
	a, _ := runAgent(t, cfg)
	mux.Handle(nodeagent.LogsPath, a.LogsHandler())
	return srv
}

func appendLog(t *testing.T, path, s string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o640)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(s); err != nil {
		t.Fatal(err)
	}
}

func withQuery(raw string, kv ...string) string {
	u, _ := url.Parse(raw)
	q := u.Query()
	for i := 0; i < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	u.RawQuery = q.Encode()
	return u.String()
}

func get(t *testing.T, u string) string {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestAgentPrunesOldLogs: with a log retention, the log files (and GPU
// topology files) of containers that are gone and were not written to for
// longer are removed; a recent one, a live container's old one and the log-URL key
// stay.
func TestAgentPrunesOldLogs(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	cfg.LogRetention = time.Hour
	if err := os.MkdirAll(cfg.LogDir, 0o700); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Hour)
	write := func(name string, mtime time.Time) string {
		p := filepath.Join(cfg.LogDir, name)
		if err := os.WriteFile(p, []byte("output\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, mtime, mtime); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gone := write("s-gone-q7.log", old)
	goneTopology := write("s-gone-q7.gpu-topology.json", old)
	recent := write("s-recent-q8.log", time.Now())
	key := write(".logs-key", old)
	_, stop := runAgent(t, cfg)
	waitGone := func(p string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, err := os.Stat(p); os.IsNotExist(err) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the old log %s of a gone container was not removed", filepath.Base(p))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitGone(gone)
	waitGone(goneTopology)
	// A quiet running job's log is old too, but its container lives: the
	// next agent's first prune (at its start) keeps it.
	b := bind(t, cli, state.Session{ID: "quiet", Owner: "ada", Kind: state.KindBatch, Image: "busybox", Command: []string{"sleep", "1d"}},
		state.Binding{CPUMilli: 500, MemoryMiB: 256})
	waitPhase(t, cli, "quiet", state.PhaseRunning, 10*time.Second)
	stop()
	liveLog := filepath.Join(cfg.LogDir, nodeagent.ContainerID(b)+".log")
	if err := os.Chtimes(liveLog, old, old); err != nil {
		t.Fatal(err)
	}
	gone2 := write("s-gone2-q9.log", old)
	runAgent(t, cfg)
	waitGone(gone2)
	for _, p := range []string{recent, key, liveLog} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v; want it kept", filepath.Base(p), err)
		}
	}
}

// TestLogURLsExpire: a log URL stops working when it expires, and the
// agent re-signs a running session's URL in its status before then.
func TestLogURLsExpire(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	cfg.LogURLTTL = 3 * time.Second
	runLogsAgent(t, cfg)

	bind(t, cli, state.Session{ID: "long", Owner: "ada", Kind: state.KindBatch, Image: "busybox", Command: []string{"sleep", "1d"}},
		state.Binding{CPUMilli: 500, MemoryMiB: 256})
	waitPhase(t, cli, "long", state.PhaseRunning, 10*time.Second)
	first := secretURL(t, cli, "long", "logs")
	status := func(u string) int {
		resp, err := http.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if got := status(first); got != http.StatusOK {
		t.Fatalf("fresh log URL: %d", got)
	}
	var fresh string
	waitFor(t, "a re-signed log URL in the secrets", 30*time.Second, func() (bool, string) {
		sec, _, _ := state.Get[state.Secrets](context.Background(), cli, keys.Secret(node, "long"))
		fresh = sec.URLs["logs"]
		return fresh != "" && fresh != first, fresh
	})
	waitFor(t, "the first URL to expire", 10*time.Second, func() (bool, string) {
		code := status(first)
		return code == http.StatusForbidden, fmt.Sprint(code)
	})
	if got := status(fresh); got != http.StatusOK {
		t.Errorf("re-signed log URL: %d", got)
	}
	// A forged expiry does not match the key.
	later := strings.Replace(fresh, "exp=", "exp=9", 1)
	if got := status(later); got != http.StatusForbidden {
		t.Errorf("URL with a forged expiry: %d, want 403", got)
	}
}
