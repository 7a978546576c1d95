package main

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/api/apitest"
	"github.com/voyager-gpu/voyager/state"
)

// lcAPI calls the API of a running voyager dev.
type lcAPI struct {
	t     *testing.T
	base  string
	token string
}

func (a lcAPI) do(method, path string, body any) (int, []byte) {
	a.t.Helper()
	return apitest.Do(a.t, method, a.base+path, a.token, body)
}

// create submits a session and returns its id.
func (a lcAPI) create(req map[string]any) string {
	a.t.Helper()
	code, out := a.do("POST", "/api/v1/sessions", req)
	if code != http.StatusCreated && code != http.StatusAccepted && code != http.StatusOK {
		a.t.Fatalf("create %v: %d %s", req, code, out)
	}
	var v struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(out, &v); err != nil || v.ID == "" {
		a.t.Fatalf("create: %s", out)
	}
	return v.ID
}

// warningLog records every warning the controller writes, in order.
type warningLog struct {
	mu   sync.Mutex
	revs map[string]int64 // session → revision of its first warning
	all  []state.Warning
}

func watchWarnings(t *testing.T, cli *clientv3.Client, k state.Keys) *warningLog {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	l := &warningLog{revs: map[string]int64{}}
	wch := cli.Watch(ctx, k.Warnings(), clientv3.WithPrefix())
	go func() {
		for resp := range wch {
			for _, ev := range resp.Events {
				if ev.Type != clientv3.EventTypePut {
					continue
				}
				w, err := state.Decode[state.Warning](ev.Kv.Value)
				if err != nil {
					continue
				}
				l.mu.Lock()
				if _, ok := l.revs[w.Session]; !ok {
					l.revs[w.Session] = ev.Kv.ModRevision
				}
				l.all = append(l.all, w)
				l.mu.Unlock()
			}
		}
	}()
	return l
}

func (l *warningLog) first(id string) (int64, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.revs[id]
	return r, ok
}

// TestLifecycleE2E runs the lifecycle rules against voyager dev with the
// real agent on real containerd (simulated GPUs, which are as busy as
// their container's CPUs): an idle notebook is warned then stopped while
// a busy one is not; a higher-priority job preempts the fewest
// preemptible jobs, which are re-queued; a drain stops the notebook at
// its deadline while the batch job runs to completion.
func TestLifecycleE2E(t *testing.T) {
	needBinary(t)
	env, environ, dev := devWithAgent(t, "voyager-lifecycle-e2e", "lc-e2e",
		"VOYAGER_AGENT_ACTIVITY_EVERY=300ms", "VOYAGER_IDLE_TIMEOUT=3s", "VOYAGER_STOP_WARNING=2s",
		"VOYAGER_PREEMPT_GRACE=1s", "VOYAGER_AGENT_PORTS=43000-43099")
	a := lcAPI{t: t, base: "http://" + env.httpAddr, token: binaryToken(t, environ, "-sub", "ada", "-role", "admin")}
	cli := etcdClient(t, env.clientAddr)
	k := state.MustKeys(state.DefaultPrefix)
	warnings := watchWarnings(t, cli, k)
	phase := func(id string, cond func(state.Status) bool, what string, within time.Duration) state.Status {
		t.Helper()
		var st state.Status
		deadline := time.Now().Add(within)
		for time.Now().Before(deadline) {
			var err error
			if st, _, err = state.Get[state.Status](context.Background(), cli, k.Status(id)); err == nil && cond(st) {
				return st
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s: not %s within %s; status %+v\ndev stderr:\n%s", id, what, within, st, dev.stderr())
		return st
	}
	isRunning := func(st state.Status) bool { return st.Phase == state.PhaseRunning }
	small := map[string]any{"cpuMilli": 100, "memoryMiB": 64}
	res := func(gpus int) map[string]any { return map[string]any{"gpus": gpus, "cpuMilli": 100, "memoryMiB": 64} }

	// 1. Idle culling: busy spins a CPU (its simulated GPU is busy), idle serves HTTP only.
	// A whole core: a simulated GPU is as busy as the container's CPU time
	// over wall time, and a cgroup quota of 0.1 core would cap it at 10%.
	busy := a.create(map[string]any{"kind": "notebook", "resources": map[string]any{"gpus": 1, "cpuMilli": 1000, "memoryMiB": 64},
		"command": []string{"sh", "-c", "httpd -p $PORT -h /tmp; while :; do :; done"}})
	idle := a.create(map[string]any{"kind": "notebook", "resources": res(1),
		"command": []string{"sh", "-c", "exec httpd -f -p $PORT -h /tmp"}})
	phase(busy, isRunning, "running", 60*time.Second)
	st := phase(idle, func(st state.Status) bool { return st.Phase.Terminal() }, "stopped for idleness", 60*time.Second)
	if st.Phase != state.PhaseStopped || st.Reason != state.ReasonIdle {
		t.Fatalf("idle notebook ended %s/%s (%s), want Stopped/%s", st.Phase, st.Reason, st.Message, state.ReasonIdle)
	}
	if _, ok := warnings.first(idle); !ok {
		t.Fatal("the idle notebook was stopped without a warning")
	}
	// Its samples follow the CPU it got: on a loaded machine one sample
	// may fall below the threshold; within a few the spin shows.
	for deadline := time.Now().Add(30 * time.Second); ; {
		st, _, _ := state.Get[state.Status](context.Background(), cli, k.Status(busy))
		if st.Phase != state.PhaseRunning || st.Activity == nil {
			t.Fatalf("the busy notebook: %+v", st)
		}
		if g := st.Activity.GPUs; len(g) == 1 && g[0].Simulated && g[0].UtilizationPercent >= 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the busy notebook's GPU activity %+v, want one simulated GPU above the busy threshold (for 30 s)", st.Activity.GPUs)
		}
		time.Sleep(100 * time.Millisecond) // polling its status, bounded by deadline
	}
	if _, ok := warnings.first(busy); ok {
		t.Fatal("the busy notebook was warned")
	}
	if code, out := a.do("DELETE", "/api/v1/sessions/"+busy, nil); code >= 300 {
		t.Fatalf("stop busy: %d %s", code, out)
	}
	phase(busy, func(st state.Status) bool { return st.Phase.Terminal() }, "stopped", 60*time.Second)

	// 2. Preemption: 8 GPUs held by preemptible priority-0 jobs of 4, 2
	// and 2; a priority-10 job of 4 GPUs preempts the one 4-GPU job.
	sleeper := []string{"sh", "-c", "sleep 600"}
	big := a.create(map[string]any{"kind": "batch", "resources": res(4), "command": sleeper, "preemptible": true})
	s1 := a.create(map[string]any{"kind": "batch", "resources": res(2), "command": sleeper, "preemptible": true})
	s2 := a.create(map[string]any{"kind": "batch", "resources": res(2), "command": sleeper, "preemptible": true})
	for _, id := range []string{big, s1, s2} {
		phase(id, isRunning, "running", 60*time.Second)
	}
	vip := a.create(map[string]any{"kind": "batch", "resources": res(4), "priority": 10,
		"command": []string{"sh", "-c", "sleep 2"}})
	phase(vip, isRunning, "running after the preemption", 60*time.Second)
	if _, ok := warnings.first(big); !ok {
		t.Fatal("the preempted job got no warning")
	}
	for _, id := range []string{s1, s2} {
		if _, ok := warnings.first(id); ok {
			t.Errorf("%s was warned; one victim was enough", id)
		}
	}
	st = phase(big, func(st state.Status) bool { return st.Phase == state.PhasePending || st.Phase == state.PhaseRunning }, "re-queued", 30*time.Second)
	// vip exits after 2s; the preempted job runs again on its GPUs.
	phase(vip, func(st state.Status) bool { return st.Phase == state.PhaseSucceeded }, "succeeded", 60*time.Second)
	phase(big, isRunning, "running again", 60*time.Second)
	for _, id := range []string{big, s1, s2} {
		a.do("DELETE", "/api/v1/sessions/"+id, nil)
	}
	for _, id := range []string{big, s1, s2} {
		phase(id, func(st state.Status) bool { return st.Phase.Terminal() }, "stopped", 60*time.Second)
	}

	// 3. Drain: the notebook stops at the deadline with a warning first;
	// the batch job outlives the deadline and succeeds.
	nb := a.create(map[string]any{"kind": "notebook", "resources": small,
		"command": []string{"sh", "-c", "exec httpd -f -p $PORT -h /tmp"}, "limits": map[string]any{"idleTimeout": "1h"}})
	job := a.create(map[string]any{"kind": "batch", "resources": small, "command": []string{"sh", "-c", "sleep 5"}})
	phase(nb, isRunning, "running", 60*time.Second)
	phase(job, isRunning, "running", 60*time.Second)
	if code, out := a.do("POST", "/api/v1/nodes/lc-e2e/drain", map[string]any{"deadline": "2s"}); code != http.StatusOK {
		t.Fatalf("drain: %d %s", code, out)
	}
	st = phase(nb, func(st state.Status) bool { return st.Phase.Terminal() }, "stopped by the drain", 30*time.Second)
	if st.Reason != state.ReasonDrained {
		t.Fatalf("drained notebook ended %s/%s: %s", st.Phase, st.Reason, st.Message)
	}
	if _, ok := warnings.first(nb); !ok {
		t.Fatal("the drained notebook got no warning")
	}
	st = phase(job, func(st state.Status) bool { return st.Phase.Terminal() }, "finished", 30*time.Second)
	if st.Phase != state.PhaseSucceeded {
		t.Fatalf("the batch job on the drained node ended %s (%s), want Succeeded", st.Phase, st.Message)
	}
	if _, ok := warnings.first(job); ok {
		t.Fatal("the batch job on the drained node was warned")
	}
	if code := dev.stop(); code != 0 {
		t.Errorf("dev exit code %d", code)
	}
}
