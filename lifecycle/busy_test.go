package lifecycle

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// gpuBoard is an NVML mock whose GPUs are as busy as the test says.
type gpuBoard struct {
	mu   sync.Mutex
	util map[string]uint32 // by UUID; absent: idle
}

func (b *gpuBoard) set(uuid string, util uint32) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.util[uuid] = util
}

func (b *gpuBoard) lib() nvml.Interface {
	return &mock.Interface{
		InitFunc:        func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:    func() nvml.Return { return nvml.SUCCESS },
		ErrorStringFunc: func(r nvml.Return) string { return fmt.Sprintf("nvml error %d", r) },
		DeviceGetHandleByUUIDFunc: func(uuid string) (nvml.Device, nvml.Return) {
			return &mock.Device{
				GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
					b.mu.Lock()
					defer b.mu.Unlock()
					return nvml.Utilization{Gpu: b.util[uuid]}, nvml.SUCCESS
				},
				GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
					b.mu.Lock()
					defer b.mu.Unlock()
					if b.util[uuid] > 0 {
						return nvml.Memory{Total: 80 << 30, Used: 60 << 30}, nvml.SUCCESS
					}
					return nvml.Memory{Total: 80 << 30}, nvml.SUCCESS
				},
				GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
					b.mu.Lock()
					defer b.mu.Unlock()
					if b.util[uuid] > 0 {
						return []nvml.ProcessInfo{{Pid: 4242}}, nvml.SUCCESS
					}
					return nil, nvml.SUCCESS
				},
			}, nvml.SUCCESS
		},
	}
}

// serveJupyter answers HTTP on session id's Jupyter port once it is bound,
// standing in for the notebook server the Fake runtime does not run. Its
// /api/status reports no activity since start.
func (c *chain) serveJupyter(id string) state.Binding {
	c.t.Helper()
	b, _ := waitKey(c.t, c.cli, keys.Binding(chainNode, id), id+"'s binding", func(_ state.Binding, found bool) bool { return found })
	ports, err := nodeagent.SplitPorts(state.KindNotebook, b.Role, b.Ports)
	if err != nil {
		c.t.Fatal(err)
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", ports.Jupyter))
	if err != nil {
		c.t.Fatal(err)
	}
	started := time.Now().UTC().Format(time.RFC3339Nano)
	mux := http.NewServeMux()
	mux.HandleFunc("/api/status", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `{"started":%q,"last_activity":%q,"connections":0,"kernels":1}`, started, started)
	})
	mux.HandleFunc("/api/kernels", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `[{"id":"k1","execution_state":"idle","last_activity":%q}]`, started)
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "jupyter stand-in") })
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	c.t.Cleanup(func() { srv.Close() })
	return b
}

// TestBusyGPUIsNotCulled: two notebooks whose Jupyter servers report no
// activity since they started; one's GPU computes at 90% (NVML), the
// other's is idle. The idle one is warned and stopped; the busy one —
// a training run started from a notebook and left alone — is never warned.
func TestBusyGPUIsNotCulled(t *testing.T) {
	board := &gpuBoard{util: map[string]uint32{}}
	c := newChain(t, ControllerConfig{IdleTimeout: 1500 * time.Millisecond, StopWarning: 500 * time.Millisecond},
		func(cfg *nodeagent.Config) {
			cfg.GPUSampler = nodeagent.NewNVMLSampler(board.lib())
			cfg.ActivityEvery = 100 * time.Millisecond
		})
	notebook := func(s *state.Session) { s.Kind, s.Command = state.KindNotebook, []string{"jupyter-stand-in"} }
	c.submit("train", 1, 0, false, notebook)
	c.submit("idle", 1, 0, false, notebook)
	b := c.serveJupyter("train")
	board.set(b.GPUs[0], 90)
	c.serveJupyter("idle")
	c.running("train")
	c.running("idle")

	st := c.status("idle", "stopped as idle", func(st state.Status) bool { return st.Phase.Terminal() })
	if st.Phase != state.PhaseStopped || st.Reason != state.ReasonIdle {
		t.Fatalf("idle notebook ended %s/%s: %s", st.Phase, st.Reason, st.Message)
	}
	// By now the busy one has been idle by Jupyter's account for longer
	// than the idle one was; its GPU kept it.
	tr, _, err := state.Get[state.Status](context.Background(), c.cli, keys.Status("train"))
	if err != nil {
		t.Fatal(err)
	}
	if tr.Phase != state.PhaseRunning || warned(t, c.cli, "train") {
		t.Fatalf("the busy notebook: phase %s, warned %v", tr.Phase, warned(t, c.cli, "train"))
	}
	a := tr.Activity
	if a == nil || a.Jupyter == nil || len(a.GPUs) != 1 || a.GPUs[0].UtilizationPercent != 90 || a.GPUs[0].Processes != 1 || a.GPUs[0].Simulated {
		t.Fatalf("the busy notebook's activity %+v, want Jupyter's and one NVML GPU at 90%% with a process", a)
	}
	if !a.LastActive.After(a.Jupyter.LastActivity.Add(time.Second)) {
		t.Fatalf("lastActive %s does not follow the GPU past Jupyter's %s", a.LastActive, a.Jupyter.LastActivity)
	}
	// Once its GPU goes quiet, it is culled like any other.
	board.set(b.GPUs[0], 0)
	st = c.status("train", "stopped after its GPU went idle", func(st state.Status) bool { return st.Phase.Terminal() })
	if st.Reason != state.ReasonIdle {
		t.Fatalf("train ended %s/%s: %s", st.Phase, st.Reason, st.Message)
	}
}
