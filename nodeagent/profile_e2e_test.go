package nodeagent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/api/apitest"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// TestE2EProfileResources: an admin defines volumes and a profile with a
// /dev/shm size and both volumes; a user's batch session that names only
// the profile (as a JupyterHub user picking it does) is admitted by the
// API, bound, and run by the agent on a real containerd: its /dev/shm has
// the profile's size, the dataset is mounted read-only and readable, the
// per-user results volume is the user's own and writable.
func TestE2EProfileResources(t *testing.T) {
	cli := etcdtest.New(t)
	rt := runtimetest.New(t, runtime.ContainerdOptions{})
	cfg := testConfig(t, cli, rt)
	cfg.Image = runtimetest.ImageRef
	runAgent(t, cfg)

	secret := []byte("pt-profile-e2e-secret")
	a, err := api.New(cli, keys, api.Config{Auth: api.AuthConfig{HS256Secret: secret}, Rate: 1000, Burst: 1000,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	apitest.Run(t, a)
	mux := http.NewServeMux()
	a.Mount(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	token := func(sub string, roles ...string) string { return apitest.Token(t, secret, sub, roles...) }
	call := func(method, path, tok string, body any, want int) []byte {
		t.Helper()
		return apitest.Call(t, method, srv.URL+path, tok, body, nil, want)
	}

	datasets, results := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(datasets, "train.csv"), []byte("4,5,6\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	admin, ada := token("root", "admin"), token("ada")
	call("PUT", "/api/v1/volumes/pt-datasets", admin, map[string]any{"hostPath": datasets, "readOnly": true}, http.StatusOK)
	call("PUT", "/api/v1/volumes/pt-results", admin, map[string]any{"hostPath": results + "/{user}", "perUser": true}, http.StatusOK)
	call("PUT", "/api/v1/profiles/pt-train", admin, map[string]any{
		"kind": "batch", "resources": map[string]any{"cpuMilli": 500, "memoryMiB": 512}, "shmMiB": 300,
		"volumes": []any{
			map[string]any{"name": "pt-datasets", "mountPath": "/data"},
			map[string]any{"name": "pt-results", "mountPath": "/results"},
		},
	}, http.StatusOK)
	script := strings.Join([]string{
		"df -k /dev/shm | tail -n 1",
		"cat /data/train.csv",
		"if touch /data/x 2>/dev/null; then echo ro-written; else echo ro-refused; fi",
		"echo mine > /results/out && cat /results/out",
	}, "\n")
	var v api.SessionView
	if err := json.Unmarshal(call("POST", "/api/v1/sessions", ada, map[string]any{"profile": "pt-train", "command": []string{"sh", "-c", script}}, http.StatusCreated), &v); err != nil {
		t.Fatal(err)
	}
	s, _, err := state.Get[state.Session](context.Background(), cli, keys.Session(v.ID))
	if err != nil {
		t.Fatal(err)
	}
	bind(t, cli, s, state.Binding{CPUMilli: 500, MemoryMiB: 512})
	st := waitPhase(t, cli, s.ID, state.PhaseSucceeded, 60*time.Second)
	out := jobLog(t, cfg, s.ID)
	for _, want := range []string{fmt.Sprintf(" %d ", 300<<10), "4,5,6", "ro-refused", "mine"} {
		if !strings.Contains(out, want) {
			t.Errorf("the job's output lacks %q (status %+v):\n%s", want, st, out)
		}
	}
	if b, err := os.ReadFile(filepath.Join(results, "ada", "out")); err != nil || string(b) != "mine\n" {
		t.Errorf("ada's results volume holds %q, %v; want mine", b, err)
	}
}
