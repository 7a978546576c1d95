package nodeagent_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// TestAgentPublishesGoodputReport: an elastic job's container gets its
// report directory at /run/voyager and VOYAGER_GOODPUT_FILE; the report it
// writes there reaches its status in etcd (the activity, and the elastic
// record of each size), a changed report replaces it, and a symbolic link
// planted in its place is never published: the activity says why. A fixed-size job gets no
// report directory.
func TestAgentPublishesGoodputReport(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	cfg.ActivityEvery = 50 * time.Millisecond
	runAgent(t, cfg)
	gpus := []string{cfg.GPUs[0].UUID, cfg.GPUs[1].UUID}

	// Every value the status takes, from before the bind on.
	resp, err := cli.Get(context.Background(), "/")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []string
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wch := cli.Watch(wctx, keys.Status("train"), clientv3.WithRev(resp.Header.Revision+1))
	go func() {
		for r := range wch {
			mu.Lock()
			for _, ev := range r.Events {
				seen = append(seen, string(ev.Kv.Value))
			}
			mu.Unlock()
		}
	}()

	b := bind(t, cli, state.Session{ID: "train", Owner: "ada", Kind: state.KindBatch, Command: []string{"python", "train.py"},
		Elastic: &state.Elastic{Min: 1, Max: 2}}, state.Binding{GPUs: gpus, CPUMilli: 100, MemoryMiB: 64})
	waitPhase(t, cli, "train", state.PhaseRunning, 10*time.Second)
	spec, ok := rt.Spec(nodeagent.ContainerID(b))
	if !ok {
		t.Fatal("no container")
	}
	dir := filepath.Join(cfg.LogDir, "reports", nodeagent.ContainerID(b))
	if !slices.ContainsFunc(spec.Mounts, func(m runtime.Mount) bool {
		return m.Source == dir && m.Target == nodeagent.ReportsPath && m.Create && m.Private && !m.ReadOnly
	}) {
		t.Fatalf("mounts %+v: want %s at %s, made for the job, private", spec.Mounts, dir, nodeagent.ReportsPath)
	}
	if spec.Env["VOYAGER_GOODPUT_FILE"] != state.GoodputFile {
		t.Fatalf("VOYAGER_GOODPUT_FILE=%q, want %s", spec.Env["VOYAGER_GOODPUT_FILE"], state.GoodputFile)
	}
	file := filepath.Join(dir, "goodput.json")

	// A link to a file of the agent's that holds a valid report: refused
	// for as many samples as it takes.
	planted := filepath.Join(t.TempDir(), "agent.json")
	if err := os.WriteFile(planted, []byte(`{"size":2,"samplesPerSecond":666}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(planted, file); err != nil {
		t.Fatal(err)
	}
	st := waitActivity(t, cli, "train", "the link refused", 10*time.Second, func(a *state.Activity) bool { return a.GoodputError != "" })
	if !strings.Contains(st.Activity.GoodputError, "not a regular file") || st.Activity.Goodput != nil {
		t.Errorf("activity %+v, want no report and an error saying the file is not a regular file", st.Activity)
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}

	report := func(x float64) {
		b, _ := json.Marshal(state.GoodputReport{Size: 2, SamplesPerSecond: x, Efficiency: 0.9})
		tmp := file + ".tmp"
		if err := os.WriteFile(tmp, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, file); err != nil { // as a job replaces its report
			t.Fatal(err)
		}
	}
	published := func(x float64) state.Status {
		t.Helper()
		var st state.Status
		waitFor(t, "the report in the status", 20*time.Second, func() (bool, string) {
			var err error
			st, _, err = state.Get[state.Status](context.Background(), cli, keys.Status("train"))
			if err != nil {
				return false, err.Error()
			}
			b, _ := json.Marshal(st.Elastic)
			return st.Elastic != nil && len(st.Elastic.Goodput) == 1 && st.Elastic.Goodput[0].SamplesPerSecond == x &&
				st.Activity != nil && st.Activity.Goodput != nil && st.Activity.Goodput.SamplesPerSecond == x, string(b)
		})
		return st
	}
	report(500)
	st = published(500)
	if st.Activity.GoodputError != "" {
		t.Errorf("the refusal stayed after a good report: %q", st.Activity.GoodputError)
	}
	if g := st.Elastic.Goodput[0]; g.Size != 2 || g.Efficiency != 0.9 || g.At.IsZero() {
		t.Errorf("published %+v, want size 2, efficiency 0.9, a time", g)
	}
	report(800)
	published(800)

	mu.Lock()
	for _, v := range seen {
		if strings.Contains(v, `"samplesPerSecond":666`) {
			t.Errorf("the linked file's report was published: %s", v)
		}
	}
	mu.Unlock()

	// A fixed-size job: no report directory.
	fb := bind(t, cli, state.Session{ID: "fixed", Owner: "ada", Kind: state.KindBatch, Command: []string{"true"}},
		state.Binding{CPUMilli: 100, MemoryMiB: 64})
	waitPhase(t, cli, "fixed", state.PhaseRunning, 10*time.Second)
	fs, _ := rt.Spec(nodeagent.ContainerID(fb))
	if _, ok := fs.Env["VOYAGER_GOODPUT_FILE"]; ok || slices.ContainsFunc(fs.Mounts, func(m runtime.Mount) bool { return m.Target == nodeagent.ReportsPath }) {
		t.Errorf("a fixed-size job got a report directory: %+v", fs.Mounts)
	}
}
