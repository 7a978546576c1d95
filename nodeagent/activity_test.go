package nodeagent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/runtime/runtimetest"
	"github.com/voyager-gpu/voyager/state"
)

// metric returns the value of the sample of name whose labels include
// labels, and whether there is one.
func metric(t testing.TB, reg prometheus.Gatherer, name string, labels map[string]string) (float64, bool) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			have := map[string]string{}
			for _, lp := range m.GetLabel() {
				have[lp.GetName()] = lp.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue next
				}
			}
			return m.GetGauge().GetValue() + m.GetCounter().GetValue(), true
		}
	}
	return 0, false
}

// registry registers the agent's collectors in a fresh registry.
func registry(a *nodeagent.Agent) *prometheus.Registry {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.Collectors()...)
	return reg
}

// waitActivity waits until session id's status has activity that ok
// accepts, and returns the status.
func waitActivity(t testing.TB, cli *clientv3.Client, id, what string, d time.Duration, ok func(*state.Activity) bool) state.Status {
	t.Helper()
	var st state.Status
	waitFor(t, id+": "+what, d, func() (bool, string) {
		var err error
		st, _, err = state.Get[state.Status](context.Background(), cli, keys.Status(id))
		if err != nil {
			return false, err.Error()
		}
		b, _ := json.Marshal(st.Activity)
		return st.Activity != nil && ok(st.Activity), string(b)
	})
	return st
}

// fakeJupyter answers /api/status and /api/kernels under prefix to
// requests with the token, as jupyter_server does.
type fakeJupyter struct {
	prefix, token string

	mu           sync.Mutex
	lastActivity time.Time
	kernels      []string // execution states
	connections  int
	tracked      int // API requests that would count as the user's activity
}

func (j *fakeJupyter) set(last time.Time, kernels ...string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.lastActivity, j.kernels = last, kernels
}

func (j *fakeJupyter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, j.prefix)
	if !ok || (rest != "api/status" && rest != "api/kernels") {
		http.NotFound(w, r)
		return
	}
	if r.Header.Get("Authorization") != "token "+j.token {
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if rest == "api/kernels" && r.URL.Query().Get("no_track_activity") == "" {
		j.tracked++
	}
	w.Header().Set("Content-Type", "application/json")
	if rest == "api/status" {
		fmt.Fprintf(w, `{"connections": %d, "kernels": %d, "last_activity": %q, "started": "2020-01-01T00:00:00.000000Z"}`,
			j.connections, len(j.kernels), j.lastActivity.Format("2006-01-02T15:04:05.000000Z"))
		return
	}
	var ks []map[string]any
	for i, st := range j.kernels {
		ks = append(ks, map[string]any{"id": strconv.Itoa(i), "name": "python3", "execution_state": st, "connections": 1,
			"last_activity": j.lastActivity.Format(time.RFC3339Nano)})
	}
	json.NewEncoder(w).Encode(ks)
}

// serveJupyter serves j on a free loopback port and returns the port.
func serveJupyter(t *testing.T, j *fakeJupyter) int {
	srv := httptest.NewServer(j)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	p, _ := strconv.Atoi(u.Port())
	return p
}

func TestAgentSamplesJupyterActivity(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		jup  *fakeJupyter
	}{
		{"jupyter with its token", map[string]string{"JUPYTER_TOKEN": "tok-1"}, &fakeJupyter{prefix: "/", token: "tok-1"}},
		// jupyterhub-singleuser: under the hub's prefix, refusing the
		// container's own token, accepting the hub server's.
		{"hub single-user server", map[string]string{"JUPYTERHUB_SERVICE_PREFIX": "/user/ada/", "JUPYTERHUB_API_TOKEN": "hub-tok"},
			&fakeJupyter{prefix: "/user/ada/", token: "hub-tok"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cli := etcdtest.New(t)
			cfg := testConfig(t, cli, newFake())
			cfg.ActivityEvery = 100 * time.Millisecond
			a, _ := runAgent(t, cfg)
			reg := registry(a)
			j := tc.jup
			j.connections = 3
			long := time.Now().Add(-time.Hour)
			j.set(long, "busy", "idle")
			port := serveJupyter(t, j)
			bind(t, cli, state.Session{ID: "nb", Owner: "ada", Kind: state.KindNotebook, Command: []string{"jupyterhub-singleuser"}, Env: tc.env},
				state.Binding{CPUMilli: 100, MemoryMiB: 64, Ports: []int{port}})
			running := waitPhase(t, cli, "nb", state.PhaseRunning, 10*time.Second)

			// A busy kernel is activity: LastActive is now, at every sample.
			st := waitActivity(t, cli, "nb", "a busy kernel", 10*time.Second, func(a *state.Activity) bool {
				return a.Jupyter != nil && a.Jupyter.BusyKernels == 1
			})
			if jp := st.Activity.Jupyter; jp.Kernels != 2 || jp.Connections != 3 || !jp.LastActivity.Equal(long.UTC().Truncate(time.Microsecond)) {
				t.Errorf("jupyter activity %+v; want 2 kernels, 3 connections, last activity %v", jp, long)
			}
			first := st.Activity.LastActive
			if first.Before(running.Started.Truncate(time.Second)) {
				t.Errorf("lastActive %v before the start %v", first, running.Started)
			}
			waitActivity(t, cli, "nb", "lastActive to advance while the kernel is busy", 10*time.Second, func(a *state.Activity) bool {
				return a.LastActive.After(first)
			})

			// Idle kernels: LastActive is Jupyter's last activity, and
			// stays there; the unchanged samples are not written.
			quiet := time.Now().UTC()
			j.set(quiet, "idle", "idle")
			st = waitActivity(t, cli, "nb", "no busy kernel", 10*time.Second, func(a *state.Activity) bool {
				return a.Jupyter != nil && a.Jupyter.BusyKernels == 0
			})
			settled := st.Activity.LastActive
			if !settled.Equal(quiet.Truncate(time.Second)) {
				t.Errorf("lastActive %v; want Jupyter's last activity %v", settled, quiet.Truncate(time.Second))
			}
			// The status key's revision, not the writes counter: the sample
			// that wrote the idle status counts its write only after the
			// write committed, so a counter read here could miss it.
			before, err := cli.Get(context.Background(), keys.Status("nb"))
			if err != nil || len(before.Kvs) == 0 {
				t.Fatalf("read status: %v", err)
			}
			samples, _ := metric(t, reg, "voyager_agent_activity_samples_total", nil)
			waitFor(t, "ten more samples", 10*time.Second, func() (bool, string) {
				n, _ := metric(t, reg, "voyager_agent_activity_samples_total", nil)
				return n >= samples+10, fmt.Sprint(n)
			})
			after, err := cli.Get(context.Background(), keys.Status("nb"))
			if err != nil || len(after.Kvs) == 0 {
				t.Fatalf("read status: %v", err)
			}
			if after.Kvs[0].ModRevision != before.Kvs[0].ModRevision {
				t.Errorf("the status was written over ten unchanged samples (revision %d → %d); want no write", before.Kvs[0].ModRevision, after.Kvs[0].ModRevision)
			}
			st, _, _ = state.Get[state.Status](context.Background(), cli, keys.Status("nb"))
			if !st.Activity.LastActive.Equal(settled) {
				t.Errorf("lastActive moved from %v to %v without activity", settled, st.Activity.LastActive)
			}
			j.mu.Lock()
			defer j.mu.Unlock()
			if j.tracked != 0 {
				t.Errorf("%d of the agent's requests counted as the user's activity (no no_track_activity)", j.tracked)
			}
		})
	}
}

// mockGPU is what the NVML mock reports for one GPU; the test changes it.
type mockGPU struct {
	util, procs atomic.Int32
	memMiB      atomic.Int64
}

// nvmlWith returns the DGX A100 mock with GPUs 0 and 1 reporting from gs.
func nvmlWith(gs ...*mockGPU) *dgxa100.Server {
	s := dgx()
	s.ErrorStringFunc = func(r nvml.Return) string { return fmt.Sprintf("NVML error %d", r) }
	for i, g := range gs {
		dev := s.Devices[i].(*dgxa100.Device)
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(g.util.Load())}, nvml.SUCCESS
		}
		dev.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
			return nvml.Memory{Total: 40 << 30, Used: uint64(g.memMiB.Load()) << 20}, nvml.SUCCESS
		}
		dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
			return make([]nvml.ProcessInfo, g.procs.Load()), nvml.SUCCESS
		}
	}
	return s
}

func TestAgentSamplesGPUsThroughNVML(t *testing.T) {
	cli := etcdtest.New(t)
	busy, idle := &mockGPU{}, &mockGPU{}
	busy.util.Store(90)
	busy.procs.Store(1)
	busy.memMiB.Store(20000)
	lib := nvmlWith(busy, idle)
	uuids := []string{}
	for _, d := range lib.Devices[:2] {
		u, _ := d.GetUUID()
		uuids = append(uuids, u)
	}
	cfg := testConfig(t, cli, newFake())
	cfg.GPUSampler = nodeagent.NewNVMLSampler(lib)
	cfg.ActivityEvery = 100 * time.Millisecond
	cfg.GPUUnusedAfter = 2 * time.Second
	a, _ := runAgent(t, cfg)
	reg := registry(a)
	bind(t, cli, state.Session{ID: "train", Owner: "ada", Kind: state.KindBatch, Command: []string{"python", "train.py"}},
		state.Binding{GPUs: uuids, CPUMilli: 100, MemoryMiB: 64})
	waitPhase(t, cli, "train", state.PhaseRunning, 10*time.Second)

	// GPU 0 at 90%: activity. GPU 1 idle from the first sample, unused
	// after 2s.
	st := waitActivity(t, cli, "train", "a GPU at 90%", 10*time.Second, func(a *state.Activity) bool { return len(a.GPUs) == 2 })
	g0, g1 := st.Activity.GPUs[0], st.Activity.GPUs[1]
	if g0.UUID != uuids[0] || g0.UtilizationPercent != 90 || g0.Processes != 1 || g0.MemoryUsedMiB != 20000 || g0.IdleSince != nil || g0.Unused || g0.Simulated {
		t.Errorf("busy GPU %+v", g0)
	}
	if g1.UtilizationPercent != 0 || g1.Processes != 0 || g1.IdleSince == nil || g1.Unused {
		t.Errorf("idle GPU %+v; want idle since the first sample, not yet unused", g1)
	}
	first := st.Activity.LastActive
	st = waitActivity(t, cli, "train", "lastActive to advance while GPU 0 is busy, and GPU 1 flagged unused", 10*time.Second, func(a *state.Activity) bool {
		return a.LastActive.After(first) && a.GPUs[1].Unused
	})
	if st.Activity.GPUs[0].Unused {
		t.Error("the busy GPU is flagged unused")
	}
	if v, _ := metric(t, reg, "voyager_agent_session_gpu_utilization_ratio", map[string]string{"gpu": uuids[0], "session": "train", "node": node}); v != 0.9 {
		t.Errorf("utilisation metric of GPU 0 = %v; want 0.9", v)
	}
	if v, _ := metric(t, reg, "voyager_agent_session_gpu_memory_used_bytes", map[string]string{"gpu": uuids[0], "session": "train"}); v != 20000<<20 {
		t.Errorf("memory metric of GPU 0 = %v; want %d", v, 20000<<20)
	}
	if v, ok := metric(t, reg, "voyager_agent_session_gpu_unused", map[string]string{"gpu": uuids[1], "session": "train", "simulated": "false"}); !ok || v != 1 {
		t.Errorf("unused metric of GPU 1 = %v, %v; want 1", v, ok)
	}

	// The job stops using GPU 0: LastActive stops; it is idle, then unused.
	busy.util.Store(0)
	busy.procs.Store(0)
	st = waitActivity(t, cli, "train", "GPU 0 idle", 10*time.Second, func(a *state.Activity) bool { return a.GPUs[0].IdleSince != nil })
	stopped := st.Activity.LastActive
	if st.Activity.GPUs[0].Unused {
		t.Error("GPU 0 unused as soon as it went idle")
	}
	st = waitActivity(t, cli, "train", "GPU 0 unused", 10*time.Second, func(a *state.Activity) bool { return a.GPUs[0].Unused })
	if !st.Activity.LastActive.Equal(stopped) {
		t.Errorf("lastActive moved from %v to %v while both GPUs were idle", stopped, st.Activity.LastActive)
	}
	if v, _ := metric(t, reg, "voyager_agent_session_gpu_unused", map[string]string{"gpu": uuids[0], "session": "train"}); v != 1 {
		t.Errorf("unused metric of GPU 0 = %v; want 1", v)
	}
}

// TestAgentActivityWritesAreThrottled: an unchanged session is written
// once, however often it is sampled; a change is written at the next
// sample.
func TestAgentActivityWritesAreThrottled(t *testing.T) {
	cli := etcdtest.New(t)
	rt := newFake()
	cfg := testConfig(t, cli, rt) // a simulated inventory: the simulated sampler
	cfg.ActivityEvery = 10 * time.Millisecond
	a, _ := runAgent(t, cfg)
	reg := registry(a)
	b := bind(t, cli, state.Session{ID: "calm", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}},
		state.Binding{GPUs: []string{cfg.GPUs[0].UUID, cfg.GPUs[1].UUID}, CPUMilli: 100, MemoryMiB: 64})
	waitPhase(t, cli, "calm", state.PhaseRunning, 10*time.Second)
	resp, err := cli.Get(context.Background(), keys.Status("calm"))
	if err != nil {
		t.Fatal(err)
	}
	var puts atomic.Int64
	wctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wch := cli.Watch(wctx, keys.Status("calm"), clientv3.WithRev(resp.Header.Revision+1))
	go func() {
		for r := range wch {
			puts.Add(int64(len(r.Events)))
		}
	}()
	const n = 100
	waitFor(t, fmt.Sprintf("%d samples", n), 30*time.Second, func() (bool, string) {
		v, _ := metric(t, reg, "voyager_agent_activity_samples_total", nil)
		return v >= n, fmt.Sprint(v)
	})
	first := waitActivity(t, cli, "calm", "the first sample", 5*time.Second, func(*state.Activity) bool { return true })
	for _, g := range first.Activity.GPUs {
		if !g.Simulated || g.UtilizationPercent != 0 || g.IdleSince == nil {
			t.Errorf("simulated GPU of an idle container: %+v", g)
		}
	}
	if w, _ := metric(t, reg, "voyager_agent_activity_writes_total", nil); w != 1 {
		t.Errorf("%v activity writes over %d samples of an unchanged session; want 1", w, n)
	}
	if p := puts.Load(); p > 1 {
		t.Errorf("%d status writes over %d samples; want at most 1", p, n)
	}

	// The container gets busy (the fake's CPU time keeps growing): a
	// sample is written at once.
	cpu := time.Duration(0)
	st := waitActivity(t, cli, "calm", "the busy container's GPUs", 10*time.Second, func(a *state.Activity) bool {
		cpu += time.Hour
		if err := rt.SetCPUUsage(nodeagent.ContainerID(b), cpu); err != nil {
			t.Fatal(err)
		}
		return len(a.GPUs) == 2 && a.GPUs[0].UtilizationPercent == 100 && a.GPUs[0].Processes == 1
	})
	if !st.Activity.LastActive.Equal(st.Activity.Sampled) {
		t.Errorf("lastActive %v after a busy sample at %v; want the sample's time", st.Activity.LastActive, st.Activity.Sampled)
	}
	if st.Activity.GPUs[0].IdleSince != nil {
		t.Errorf("a busy GPU is idle since %v", st.Activity.GPUs[0].IdleSince)
	}
}

// TestAgentSimulatedGPUsFollowContainerCPU: on real containerd, the
// simulated GPU of a container spinning a CPU is busy and keeps the
// session active; that of a sleeping container is idle.
func TestAgentSimulatedGPUsFollowContainerCPU(t *testing.T) {
	cli := etcdtest.New(t)
	gpus, _ := nodeagent.SimulatedGPUs(node, "2xA100-80GB")
	rt := runtimetest.New(t, runtime.ContainerdOptions{CDISpecDirs: []string{writeCDISpec(t, gpus)}})
	cfg := testConfig(t, cli, rt)
	cfg.Image = runtimetest.ImageRef
	cfg.ActivityEvery = 500 * time.Millisecond
	runAgent(t, cfg)
	bind(t, cli, state.Session{ID: "spin", Owner: "ada", Kind: state.KindBatch, Command: []string{"sh", "-c", "while :; do :; done"}},
		state.Binding{GPUs: []string{gpus[0].UUID}, CPUMilli: 500, MemoryMiB: 64})
	bind(t, cli, state.Session{ID: "nap", Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "3600"}},
		state.Binding{GPUs: []string{gpus[1].UUID}, CPUMilli: 500, MemoryMiB: 64})
	defer func() {
		for _, id := range []string{"spin", "nap"} {
			updateSession(t, cli, id, func(s *state.Session) { s.Desired = state.DesiredStopped })
		}
		for _, id := range []string{"spin", "nap"} {
			waitPhase(t, cli, id, state.PhaseStopped, 30*time.Second)
		}
	}()
	waitPhase(t, cli, "spin", state.PhaseRunning, 30*time.Second)
	napRunning := waitPhase(t, cli, "nap", state.PhaseRunning, 30*time.Second)

	st := waitActivity(t, cli, "spin", "a busy simulated GPU", 30*time.Second, func(a *state.Activity) bool {
		return len(a.GPUs) == 1 && a.GPUs[0].UtilizationPercent > 0
	})
	g := st.Activity.GPUs[0]
	t.Logf("a busy loop capped at 0.5 CPU: simulated GPU at %d%%", g.UtilizationPercent)
	if !g.Simulated || g.Processes != 1 || g.IdleSince != nil {
		t.Errorf("busy simulated GPU %+v; want simulated, one process, not idle", g)
	}
	first := st.Activity.LastActive
	waitActivity(t, cli, "spin", "lastActive to advance", 30*time.Second, func(a *state.Activity) bool { return a.LastActive.After(first) })

	st = waitActivity(t, cli, "nap", "an idle simulated GPU", 30*time.Second, func(a *state.Activity) bool { return len(a.GPUs) == 1 })
	g = st.Activity.GPUs[0]
	if !g.Simulated || g.UtilizationPercent != 0 || g.Processes != 0 || g.IdleSince == nil {
		t.Errorf("idle simulated GPU %+v; want simulated, 0%%, no process, idle", g)
	}
	if want := napRunning.Started.UTC().Truncate(time.Second); !st.Activity.LastActive.Equal(want) {
		t.Errorf("the sleeping session's lastActive %v; want its start %v", st.Activity.LastActive, want)
	}
}
