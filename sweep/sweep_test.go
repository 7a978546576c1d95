package sweep_test

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/api/apitest"
	"github.com/voyager-gpu/voyager/history"
	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/lifecycle"
	"github.com/voyager-gpu/voyager/merger"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/sweep"
)

const secret = "sweep-test-secret-0123456789abcdef-0123"

// cluster is a whole Voyager on a real etcd: the API, a placer with its
// status merger and lifecycle controller, two array controllers (any
// number may run), and a real node agent with 16
// simulated GPUs on the in-memory runtime, whose jobs the test ends.
type cluster struct {
	t     *testing.T
	cli   *clientv3.Client
	keys  state.Keys
	fake  *runtime.Fake
	ctrls []*sweep.Controller
	url   string
	token string
	start int64 // the revision before the test wrote anything
}

func quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	cli := etcdtest.New(t)
	k := state.MustKeys(state.DefaultPrefix)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	run := func(name string, f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil && ctx.Err() == nil {
				t.Errorf("%s: %v", name, err)
			}
		})
	}
	r, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster{t: t, cli: cli, keys: k, fake: runtime.NewFake(nil, "busybox"), start: r.Header.Revision}

	a, err := api.New(cli, k, api.Config{Auth: api.AuthConfig{HS256Secret: []byte(secret)}, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	run("api", a.Run)
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	c.url = srv.URL
	c.token = apitest.Token(t, []byte(secret), "ada")

	p := placer.New(cli, placer.Config{Keys: k, Logger: quiet()})
	run("placer", p.Run)
	// The agent reports parts; the merger writes the statuses.
	run("merger", merger.New(cli, merger.Config{Keys: k, Logger: quiet()}).Run)
	// Restarts: the lifecycle controller re-queues failed OnFailure
	// elements after their back-off.
	run("lifecycle", lifecycle.NewController(cli, lifecycle.ControllerConfig{Keys: k, Every: 100 * time.Millisecond, Logger: quiet()}).Run)
	for i := 0; i < 2; i++ {
		ctrl := sweep.New(cli, sweep.Config{Keys: k, Logger: quiet()})
		c.ctrls = append(c.ctrls, ctrl)
		run("sweep", ctrl.Run)
	}
	gpus, err := nodeagent.SimulatedGPUs("sw-node", "16xA100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	ag := nodeagent.New(nodeagent.Config{
		Node: "sw-node", Address: "127.0.0.1", Keys: k, Client: cli, Runtime: c.fake,
		GPUs: gpus, Simulated: true, CPUMilli: 64000, MemoryMiB: 1 << 19,
		Ports: state.PortRange{First: 63000, Last: 63999}, LeaseTTL: 5 * time.Second,
		FenceAfter: 3500 * time.Millisecond, FenceGrace: time.Second,
		Image: "busybox", HomeDir: dir + "/home", LogDir: dir + "/logs", StopGrace: 500 * time.Millisecond,
		Logger: quiet(), Resync: time.Second,
	})
	run("agent", ag.Run)
	c.eventually("the node registered", 30*time.Second, func() bool {
		r, err := cli.Get(ctx, k.Node("sw-node"), clientv3.WithCountOnly())
		return err == nil && r.Count == 1
	})
	return c
}

// eventually polls cond until it holds, failing after within.
func (c *cluster) eventually(what string, within time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// call makes an API request as ada and decodes the answer into out.
func (c *cluster) call(method, path string, body, out any, want int) {
	c.t.Helper()
	apitest.Call(c.t, method, c.url+path, c.token, body, out, want)
}

// running returns the array's containers that run now, by container id,
// with the index each was given in its environment.
func (c *cluster) running(id string) map[string]int {
	c.t.Helper()
	ins, err := c.fake.List(context.Background(), nil)
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string]int{}
	for _, in := range ins {
		if in.State != runtime.StateRunning || !strings.HasPrefix(in.Labels[nodeagent.LabelSession], id+"-") {
			continue
		}
		spec, ok := c.fake.Spec(in.ID)
		if !ok {
			continue
		}
		n, err := strconv.Atoi(spec.Env[state.EnvArrayIndex])
		if err != nil || spec.Env[state.EnvArrayID] != id || in.Labels[nodeagent.LabelSession] != state.ElementID(id, n) {
			c.t.Fatalf("container %s of %s has index %q, array %q", in.ID, in.Labels[nodeagent.LabelSession], spec.Env[state.EnvArrayIndex], spec.Env[state.EnvArrayID])
		}
		if want := []string{"python", "train.py", "--seed", strconv.Itoa(n)}; !strings.HasSuffix(strings.Join(spec.Args, " "), strings.Join(want, " ")) {
			c.t.Fatalf("element %d runs %q, want %q", n, spec.Args, want)
		}
		out[in.ID] = n
	}
	return out
}

// waitRunning waits until exactly n of the array's containers run, and
// fails at once if more ever do.
func (c *cluster) waitRunning(id string, n, cap int) map[string]int {
	c.t.Helper()
	var got map[string]int
	c.eventually(strconv.Itoa(n)+" running elements", 60*time.Second, func() bool {
		got = c.running(id)
		if len(got) > cap {
			c.t.Fatalf("%d elements run at once, the cap is %d", len(got), cap)
		}
		return len(got) == n
	})
	return got
}

// checkHistory runs the history checker over every revision of the test.
func (c *cluster) checkHistory() history.Result {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := c.cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		c.t.Fatal(err)
	}
	res, err := history.Watch(ctx, c.cli, c.keys, history.Options{Start: c.start, End: r.Header.Revision})
	if err != nil {
		c.t.Fatal(err)
	}
	for _, v := range res.Violations {
		c.t.Errorf("history: %s", v)
	}
	return res
}

// sweepRequest is a 100-element array of 1-GPU jobs, at most 10 at once.
func sweepRequest() map[string]any {
	return map[string]any{"command": []string{"python", "train.py", "--seed", "{index}"},
		"resources": map[string]any{"gpus": 1, "cpuMilli": 1000, "memoryMiB": 1024},
		"indices":   "0-99", "maxRunning": 10}
}

// TestSweep100Cap10 is the acceptance test of job arrays: a 100-element
// sweep with a cap of 10 on a node of 16 simulated GPUs, under a real
// placer, a real agent and two array controllers. Ten elements run at a
// time (the node could hold 16), each ended by the test with a failure
// for indices ≡ 4 mod 9; every index runs exactly once, the summary
// counts the failures and their exit codes, and the history checker finds
// no revision, over etcd's whole history, with more than 10 unfinished.
func TestSweep100Cap10(t *testing.T) {
	c := newCluster(t)
	var v api.ArrayView
	c.call("POST", "/api/v1/arrays", sweepRequest(), &v, 201)
	if v.Summary.Size != 100 || v.MaxRunning != 10 || v.Summary.Waiting != 100 {
		t.Fatalf("created: %+v", v.Summary)
	}
	ran := map[int]int{} // index → exit code
	for len(ran) < 100 {
		n := min(10, 100-len(ran))
		for cid, idx := range c.waitRunning(v.ID, n, 10) {
			if _, again := ran[idx]; again {
				t.Fatalf("index %d ran twice", idx)
			}
			code := 0
			if idx%9 == 4 {
				code = 3
			}
			ran[idx] = code
			if err := c.fake.Finish(cid, code, ""); err != nil {
				t.Fatal(err)
			}
		}
	}
	c.eventually("the array done", 60*time.Second, func() bool {
		c.call("GET", "/api/v1/arrays/"+v.ID, nil, &v, 200)
		return v.Summary.Done
	})
	s := v.Summary
	if s.Size != 100 || s.Created != 100 || s.Succeeded != 89 || s.Failed != 11 || s.Running+s.Pending+s.Waiting+s.Skipped+s.Stopped != 0 {
		t.Errorf("summary %+v, want 89 succeeded and 11 failed of 100", s)
	}
	if len(v.Elements) != 100 {
		t.Fatalf("%d elements, want 100", len(v.Elements))
	}
	for i, e := range v.Elements {
		if e.Index != i || e.Session != state.ElementID(v.ID, i) || e.ExitCode == nil || *e.ExitCode != ran[i] || e.Attempt != 0 {
			t.Errorf("element %d: %+v, want index %d exit %d", i, e, i, ran[i])
		}
	}
	if got := c.fake.Starts(); got != 100 {
		t.Errorf("%d containers started, want 100: one per index", got)
	}
	// A controller counts what it wrote after its transaction returns, so
	// the array can read done a moment before the last count lands.
	var st sweep.Stats
	c.eventually("the controllers' counts", 10*time.Second, func() bool {
		st = sweep.Stats{}
		for _, ctrl := range c.ctrls {
			s := ctrl.Stats()
			st.Created += s.Created
			st.Finished += s.Finished
		}
		return st.Created >= 100 && st.Finished >= 100
	})
	if st.Created != 100 || st.Finished != 100 {
		t.Errorf("controllers created %d and recorded %d, want 100 each", st.Created, st.Finished)
	}
	res := c.checkHistory()
	t.Logf("history: %d revisions, %d binds checked", res.Revisions, res.Binds)
	if res.Binds != 100 {
		t.Errorf("history saw %d binds, want 100", res.Binds)
	}
}

// TestSweepStopStopsAll: stopping a running sweep stops its running and
// queued elements and creates no more; the summary says how many ended
// which way and how many were skipped.
func TestSweepStopStopsAll(t *testing.T) {
	c := newCluster(t)
	var v api.ArrayView
	c.call("POST", "/api/v1/arrays", sweepRequest(), &v, 201)
	first := c.waitRunning(v.ID, 10, 10)
	done := 0
	for cid := range first {
		if done == 4 {
			break
		}
		if err := c.fake.Finish(cid, 0, ""); err != nil {
			t.Fatal(err)
		}
		done++
	}
	// Four ended: four more are made and run.
	c.waitRunning(v.ID, 10, 10)
	var sr api.ArrayStopResult
	c.call("POST", "/api/v1/arrays/"+v.ID+"/stop", nil, &sr, 202)
	// The API stops what it finds unfinished; the controllers, seeing the
	// stop, race it to the same elements, so the API's count is at most 10.
	if sr.Array.Stop == nil || sr.Array.Stop.By != "ada" || sr.Stopping > 10 {
		t.Errorf("stop: %d stopping, stop %+v; want at most 10, by ada", sr.Stopping, sr.Array.Stop)
	}
	c.eventually("the stopped array done", 60*time.Second, func() bool {
		c.call("GET", "/api/v1/arrays/"+v.ID, nil, &v, 200)
		return v.Summary.Done
	})
	if n := len(c.running(v.ID)); n != 0 {
		t.Errorf("%d elements still run after the stop", n)
	}
	s := v.Summary
	if s.Created != 14 || s.Succeeded != 4 || s.Stopped+s.Failed != 10 || s.Skipped != 86 || s.Waiting != 0 {
		t.Errorf("summary %+v, want 14 created: 4 succeeded, 10 stopped, 86 skipped", s)
	}
	// No controller creates anything after the stop, however often it looks.
	for _, ctrl := range c.ctrls {
		if _, err := ctrl.ReconcileAll(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	r, err := c.cli.Get(context.Background(), c.keys.Session(v.ID+"-"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if r.Count != 14 {
		t.Errorf("%d element sessions exist, want the 14 made before the stop", r.Count)
	}
	c.checkHistory()
}

// TestSweepRestartsFollowPolicy: an element's retries follow its restart
// policy (OnFailure, one restart): element 1 fails once and then succeeds,
// element 3 fails twice and ends Failed; while an element waits to
// restart it keeps its place under the cap (the history checker holds
// the cap over every revision).
func TestSweepRestartsFollowPolicy(t *testing.T) {
	c := newCluster(t)
	req := sweepRequest()
	req["indices"], req["maxRunning"] = "0-3", 2
	req["restart"] = map[string]any{"policy": "OnFailure", "maxRestarts": 1, "backoff": "100ms"}
	var v api.ArrayView
	c.call("POST", "/api/v1/arrays", req, &v, 201)
	ended := map[string]bool{}
	runs := map[int]int{}
	c.eventually("the array done", 60*time.Second, func() bool {
		for cid, idx := range c.running(v.ID) {
			if ended[cid] {
				continue
			}
			if len(c.running(v.ID)) > 2 {
				t.Fatalf("more than 2 elements run at once")
			}
			code := 0
			if idx == 3 || (idx == 1 && runs[1] == 0) {
				code = 5
			}
			runs[idx]++
			ended[cid] = true
			if err := c.fake.Finish(cid, code, ""); err != nil {
				t.Fatal(err)
			}
		}
		c.call("GET", "/api/v1/arrays/"+v.ID, nil, &v, 200)
		return v.Summary.Done
	})
	if s := v.Summary; s.Succeeded != 3 || s.Failed != 1 {
		t.Errorf("summary %+v, want 3 succeeded and 1 failed", s)
	}
	for _, e := range v.Elements {
		wantAttempt, wantCode := 0, 0
		switch e.Index {
		case 1:
			wantAttempt = 1
		case 3:
			wantAttempt, wantCode = 1, 5
		}
		if e.Attempt != wantAttempt || e.ExitCode == nil || *e.ExitCode != wantCode {
			t.Errorf("element %d: attempt %d exit %v; want attempt %d exit %d", e.Index, e.Attempt, e.ExitCode, wantAttempt, wantCode)
		}
	}
	if runs[0] != 1 || runs[1] != 2 || runs[2] != 1 || runs[3] != 2 || c.fake.Starts() != 6 {
		t.Errorf("runs %v, %d starts; want 1, 2, 1, 2 and 6", runs, c.fake.Starts())
	}
	c.checkHistory()
}
