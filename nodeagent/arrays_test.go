package nodeagent_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
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
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/sweep"
)

// gangCluster is simulated machines (network namespaces, real
// containerd, isolated networks) with the rest of Voyager in process: the
// API, a placer, the lifecycle controller (restarts), the array controller
// and, beside every agent, a status merger.
type gangCluster struct {
	cli    *clientv3.Client
	ms     []machine
	agents map[string]nodeagent.Config
	url    string
	token  string
	start  int64 // the revision before the test's own writes
}

const gangSecret = "arr-gang-test-secret-0123456789abcdef"

// rendezvousDone is what rank 0 of a 3-part job prints once every rank
// reached it and it reached every rank. The other ranks may not print
// their own end: rank 0's exit ends the job, and its end stops them.
const rendezvousDone = "rank 0 of 3: connected to every other rank and every other rank to it"

// Its jobs are CPU-only: the simulated machines' GPUs share UUIDs and no
// CDI spec names them, so a container with one would not start.
func newGangCluster(t *testing.T, n int) *gangCluster {
	t.Helper()
	cli := etcdtest.New(t)
	ms := machines(t, n)
	agents := machineAgents(t, cli, ms, "arr", 47200, 47399)
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
	a, err := api.New(cli, keys, api.Config{Auth: api.AuthConfig{HS256Secret: []byte(gangSecret)}, Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run("api", a.Run)
	srv := httptest.NewServer(a.Handler())
	t.Cleanup(srv.Close)
	run("placer", placer.New(cli, placer.Config{Keys: keys, Tick: 200 * time.Millisecond, Logger: quietLogger()}).Run)
	run("lifecycle", lifecycle.NewController(cli, lifecycle.ControllerConfig{Keys: keys, Every: 100 * time.Millisecond, Logger: quietLogger()}).Run)
	run("sweep", sweep.New(cli, sweep.Config{Keys: keys, Logger: quietLogger()}).Run)
	tok := apitest.Token(t, []byte(gangSecret), "ada")
	r, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return &gangCluster{cli: cli, ms: ms, agents: agents, url: srv.URL, token: tok, start: r.Header.Revision}
}

// call makes an API request as ada, requires status want and decodes the
// answer into out.
func (g *gangCluster) call(t *testing.T, method, path string, body, out any, want int) {
	t.Helper()
	apitest.Call(t, method, g.url+path, g.token, body, out, want)
}

// logs returns the log files of session id's containers on every
// machine, one after another.
func (g *gangCluster) logs(id string) string {
	all := ""
	for _, cfg := range g.agents {
		files, _ := filepath.Glob(filepath.Join(cfg.LogDir, id+"-q*.log"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			all += string(b)
		}
	}
	return all
}

// checkHistory runs the history checker over every revision since the
// cluster started.
func (g *gangCluster) checkHistory(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	last, err := g.cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	res, err := history.Watch(ctx, g.cli, keys, history.Options{Start: g.start, End: last.Header.Revision})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range res.Violations {
		t.Errorf("history: %s", v)
	}
}

// TestGangRestartsAsAWhole: a 3-part job with restart policy OnFailure on
// three machines whose rank 2 fails on its first run. The job waits to
// restart (Pending, BackOff), its other parts are stopped and released,
// and only then is the whole gang queued and bound again, all parts with
// the next attempt (VOYAGER_ATTEMPT 1): they rendezvous and the job
// succeeds. No part of the second run is bound while one of the first is.
func TestGangRestartsAsAWhole(t *testing.T) {
	g := newGangCluster(t, 3)
	ctx := context.Background()
	script := `echo "attempt $VOYAGER_ATTEMPT rank $NODE_RANK"
if [ "$VOYAGER_ATTEMPT" = 0 ] && [ "$NODE_RANK" = 2 ]; then sleep 2; echo failing; exit 7; fi
exec rendezvous -timeout 60s`
	var v api.SessionView
	g.call(t, "POST", "/api/v1/sessions", map[string]any{
		"kind": "batch", "nodes": 3, "command": []string{"sh", "-c", script},
		"resources": map[string]any{"cpuMilli": 200, "memoryMiB": 128},
		"restart":   map[string]any{"policy": "OnFailure", "maxRestarts": 2, "backoff": "500ms"},
	}, &v, http.StatusCreated)
	id := v.ID

	// Every status and binding write of the job, in order: statuses until
	// the job ends, bindings until etcd says the watch has delivered every
	// revision up to that end (a progress notification).
	type bindingEvent struct {
		rev     int64
		put     bool
		attempt int
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	statuses := g.cli.Watch(wctx, keys.Status(id), clientv3.WithRev(g.start+1))
	bindings := g.cli.Watch(wctx, keys.AllBindings(), clientv3.WithPrefix(), clientv3.WithRev(g.start+1), clientv3.WithPrevKV())
	var seen []state.Status
	var bevs []bindingEvent
	var endRev int64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	deadline := time.After(3 * time.Minute)
	for caughtUp := false; !caughtUp; {
		select {
		case resp := <-statuses:
			for _, ev := range resp.Events {
				st, err := state.Decode[state.Status](ev.Kv.Value)
				if err != nil {
					t.Fatal(err)
				}
				seen = append(seen, st)
				if st.Phase.Terminal() && endRev == 0 {
					endRev = ev.Kv.ModRevision
				}
			}
		case resp := <-bindings:
			for _, ev := range resp.Events {
				_, sid, ok := keys.BindingKey(string(ev.Kv.Key))
				if !ok || sid != id {
					continue
				}
				v := ev.Kv.Value
				if ev.Type == clientv3.EventTypeDelete {
					v = ev.PrevKv.Value
				}
				b, err := state.Decode[state.Binding](v)
				if err != nil {
					t.Fatal(err)
				}
				bevs = append(bevs, bindingEvent{rev: ev.Kv.ModRevision, put: ev.Type == clientv3.EventTypePut, attempt: b.Attempt})
			}
			caughtUp = endRev > 0 && resp.IsProgressNotify() && resp.Header.Revision >= endRev
		case <-tick.C:
			if endRev > 0 {
				_ = g.cli.RequestProgress(wctx)
			}
		case <-deadline:
			t.Fatalf("the job did not end; statuses seen: %+v", seen)
		}
	}
	final := seen[len(seen)-1]
	if final.Phase != state.PhaseSucceeded || final.Attempt != 1 || final.ExitCode == nil || *final.ExitCode != 0 {
		t.Fatalf("final status %s attempt %d exit %v (%s), want Succeeded after 1 restart with exit 0", final.Phase, final.Attempt, final.ExitCode, final.Message)
	}
	backoff := slices.IndexFunc(seen, func(st state.Status) bool {
		return st.Phase == state.PhasePending && st.Reason == state.ReasonBackOff
	})
	if backoff < 0 || !strings.Contains(seen[backoff].Message, "part 2 on") || !strings.Contains(seen[backoff].Message, "restart 1 of 2") {
		t.Errorf("no BackOff status naming part 2's failure and restart 1 of 2 before the restart: %+v", seen)
	}
	if len(final.Nodes) != 3 || final.Nodes[0] == final.Nodes[1] || final.Nodes[1] == final.Nodes[2] || final.Nodes[0] == final.Nodes[2] {
		t.Errorf("the restarted job ran on %v, want three machines", final.Nodes)
	}

	// The bindings: the second run's first bind comes after the first
	// run's last release, and each run binds its three parts at one
	// revision.
	var lastRelease0, firstBind1 int64
	bound := map[int]map[int64]int{} // attempt → bind revision → parts
	for _, e := range bevs {
		switch {
		case e.put:
			if bound[e.attempt] == nil {
				bound[e.attempt] = map[int64]int{}
			}
			bound[e.attempt][e.rev]++
			if e.attempt == 1 && firstBind1 == 0 {
				firstBind1 = e.rev
			}
		case e.attempt == 0:
			lastRelease0 = max(lastRelease0, e.rev)
		}
	}
	for attempt := 0; attempt <= 1; attempt++ {
		if len(bound[attempt]) != 1 {
			t.Errorf("attempt %d bound at revisions %v, want its three parts in one transaction", attempt, bound[attempt])
		}
		for _, n := range bound[attempt] {
			if n != 3 {
				t.Errorf("attempt %d bound %d parts, want 3", attempt, n)
			}
		}
	}
	if lastRelease0 == 0 || firstBind1 <= lastRelease0 {
		t.Errorf("the restart bound at revision %d, the first run's last part was released at %d: want the whole gang released first", firstBind1, lastRelease0)
	}

	// The logs: rank 2 failed on the first run; every rank rendezvoused
	// on the second, told it was attempt 1.
	waitFor(t, "the second run's logs", 20*time.Second, func() (bool, string) {
		all := g.logs(id)
		for r := 0; r < 3; r++ {
			if !strings.Contains(all, fmt.Sprintf("attempt 1 rank %d", r)) || !strings.Contains(all, fmt.Sprintf("rank %d of 3: all 3 ranks arrived", r)) {
				return false, all
			}
		}
		return strings.Contains(all, rendezvousDone) && strings.Count(all, "failing") == 1 && strings.Contains(all, "attempt 0 rank 2"), all
	})
	// Nothing of either run is left on the machines.
	for _, b := range g.ms {
		waitFor(t, "the job's bindings on "+b.name+" to be released", 30*time.Second, func() (bool, string) {
			return gone(t, g.cli, keys.Binding(b.name, id)), ""
		})
	}
	g.checkHistory(t)
}

// TestArrayOfGangs: a job array whose template is a 3-part job, cap 2, on
// three machines: every element is a gang on the three machines, the cap
// counts elements (two gangs, two parts a machine starting at once, each
// on the machine's isolated network with its mesh), every index runs once,
// and an element whose rank 1 fails ends Failed with that part's exit code
// while the others succeed; the history checker (array-over-cap among its
// rules) passes every revision.
func TestArrayOfGangs(t *testing.T) {
	g := newGangCluster(t, 3)
	script := `if [ "$VOYAGER_ARRAY_INDEX" = 3 ] && [ "$NODE_RANK" = 1 ]; then echo "index 3 rank 1 failing"; exit 5; fi
exec rendezvous -timeout 60s`
	var v api.ArrayView
	g.call(t, "POST", "/api/v1/arrays", map[string]any{
		"nodes": 3, "command": []string{"sh", "-c", script}, "indices": "0-3", "maxRunning": 2,
		"resources": map[string]any{"cpuMilli": 200, "memoryMiB": 128},
	}, &v, http.StatusCreated)
	if v.Template.Nodes != 3 || v.Template.OnPartFailure != state.PartFailureStopAll || v.MaxRunning != 2 {
		t.Fatalf("array template nodes %d onPartFailure %q cap %d; want 3, StopAll, 2", v.Template.Nodes, v.Template.OnPartFailure, v.MaxRunning)
	}
	deadline := time.Now().Add(4 * time.Minute)
	for !v.Summary.Done {
		if time.Now().After(deadline) {
			t.Fatalf("array not done: %+v", v.Summary)
		}
		time.Sleep(200 * time.Millisecond) // polling the API, bounded by deadline
		id := v.ID
		v = api.ArrayView{} // decode afresh: a reused map would keep old keys
		g.call(t, "GET", "/api/v1/arrays/"+id, nil, &v, http.StatusOK)
	}
	// The cap counts elements, not parts: two gangs (six parts) were
	// unfinished at once.
	most := 0
	wctx, stop := context.WithCancel(context.Background())
	defer stop()
	records := g.cli.Watch(wctx, keys.Array(v.ID), clientv3.WithRev(g.start+1))
	for finished := false; !finished; {
		select {
		case resp := <-records:
			for _, ev := range resp.Events {
				a, err := state.Decode[state.Array](ev.Kv.Value)
				if err != nil {
					t.Fatal(err)
				}
				most, finished = max(most, a.Unfinished()), a.Finished != nil
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the array's writes did not show its end")
		}
	}
	if most != 2 {
		t.Errorf("at most %d elements were unfinished at once, want the cap, 2", most)
	}
	s := v.Summary
	if s.Size != 4 || s.Created != 4 || s.Succeeded != 3 || s.Failed != 1 || s.Running+s.Pending+s.Waiting+s.Skipped != 0 {
		t.Errorf("summary %+v, want 4 created, 3 succeeded, 1 failed", s)
	}
	if len(v.Elements) != 4 {
		t.Fatalf("%d elements, want 4: %+v", len(v.Elements), v.Elements)
	}
	for i, e := range v.Elements {
		want, phase := 0, state.PhaseSucceeded
		if i == 3 {
			want, phase = 5, state.PhaseFailed
		}
		if e.Index != i || e.Phase != phase || e.ExitCode == nil || *e.ExitCode != want || e.Attempt != 0 {
			t.Errorf("element %d: index %d %s exit %v attempt %d; want %s with %d, never restarted", i, e.Index, e.Phase, e.ExitCode, e.Attempt, phase, want)
		}
		st, _, err := state.Get[state.Status](context.Background(), g.cli, keys.Status(e.Session))
		if err != nil || len(st.Nodes) != 3 || st.Nodes[0] == st.Nodes[1] || st.Nodes[1] == st.Nodes[2] || st.Nodes[0] == st.Nodes[2] {
			t.Errorf("element %d ran on %v (%v), want a gang on three machines", i, st.Nodes, err)
		}
		if i == 3 {
			if !strings.Contains(st.Message, "part 1 on") {
				t.Errorf("element 3's message %q does not name its failed part", st.Message)
			}
			continue
		}
		waitFor(t, fmt.Sprintf("element %d's ranks to rendezvous", i), 20*time.Second, func() (bool, string) {
			all := g.logs(e.Session)
			for r := 0; r < 3; r++ {
				if !strings.Contains(all, fmt.Sprintf("rank %d of 3: all 3 ranks arrived", r)) {
					return false, all
				}
			}
			return strings.Contains(all, rendezvousDone), all
		})
	}
	g.checkHistory(t)
}
