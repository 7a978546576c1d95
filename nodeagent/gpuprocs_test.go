package nodeagent_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
)

// sharedGPU is what the NVML mock reports of one GPU shared under MPS:
// the MPS server in the compute list, the sessions' processes as MPS
// clients, and per-process utilisation samples. The test changes it.
type sharedGPU struct {
	mu      sync.Mutex
	clients []nvml.ProcessInfo
	samples []nvml.ProcessUtilizationSample
	// utilRet is what GetProcessUtilization returns when no sample is
	// newer than the last seen (NVML: NOT_FOUND), or always where the
	// driver keeps none (NOT_SUPPORTED).
	utilRet nvml.Return
	seen    []uint64 // the lastSeenTimestamp of every call
}

const mpsServerPid = 50

// sharedNVML returns the DGX A100 mock whose GPU 0 reports from g, busy
// as a whole (90%, every process) whatever its clients do.
func sharedNVML(g *sharedGPU) (*dgxa100.Server, string) {
	s := nvmlWith(&mockGPU{})
	dev := s.Devices[0].(*dgxa100.Device)
	dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) { return nvml.Utilization{Gpu: 90}, nvml.SUCCESS }
	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		return []nvml.ProcessInfo{{Pid: mpsServerPid, UsedGpuMemory: 300 << 20}}, nvml.SUCCESS
	}
	dev.GetMPSComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		return append([]nvml.ProcessInfo(nil), g.clients...), nvml.SUCCESS
	}
	dev.GetProcessUtilizationFunc = func(last uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.seen = append(g.seen, last)
		if g.utilRet == nvml.ERROR_NOT_SUPPORTED {
			return nil, g.utilRet
		}
		var out []nvml.ProcessUtilizationSample
		for _, u := range g.samples {
			if u.TimeStamp > last {
				out = append(out, u)
			}
		}
		if len(out) == 0 {
			return nil, nvml.ERROR_NOT_FOUND
		}
		return out, nvml.SUCCESS
	}
	u, _ := dev.GetUUID()
	return s, u
}

// TestNVMLSamplerReadsAContainersOwnProcesses: on one GPU shared under
// MPS, busy as a whole, each container reads only its own processes: the
// one with a busy client its utilisation and memory, the one with an idle
// client its process and memory at 0%, and one with no process there an
// idle GPU. Each container reads the per-process samples since its own
// last read. Without a process lister SampleProcesses refuses.
func TestNVMLSamplerReadsAContainersOwnProcesses(t *testing.T) {
	ctx := context.Background()
	g := &sharedGPU{
		clients: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 10 << 30}, {Pid: 200, UsedGpuMemory: 5 << 30}, {Pid: 201, UsedGpuMemory: 1 << 30}},
		samples: []nvml.ProcessUtilizationSample{{Pid: 100, TimeStamp: 5, SmUtil: 40}, {Pid: 100, TimeStamp: 10, SmUtil: 70}, {Pid: 200, TimeStamp: 10}, {Pid: 201, TimeStamp: 10}},
	}
	lib, u := sharedNVML(g)
	rt := runtime.NewFake(nil, "busybox")
	for id, pids := range map[string][]uint32{"busy": {100, 101}, "idle": {200, 201}, "none": {300}} {
		if err := rt.Start(ctx, runtime.Spec{ID: id, Image: "busybox"}); err != nil {
			t.Fatal(err)
		}
		if err := rt.SetPids(id, pids...); err != nil {
			t.Fatal(err)
		}
	}
	s := nodeagent.NewNVMLSampler(lib)
	defer s.Close()
	if _, err := s.SampleProcesses(ctx, "busy", []string{u}); !errors.Is(err, nodeagent.ErrNoProcessLister) {
		t.Fatalf("SampleProcesses without a process lister: %v; want ErrNoProcessLister", err)
	}
	s.WithProcesses(rt)
	// The whole GPU is busy for everyone: what the sampler of whole GPUs says.
	whole, err := s.SampleGPUs(ctx, "none", []string{u})
	if err != nil || whole[u].UtilizationPercent != 90 || whole[u].Processes != 1 {
		t.Fatalf("whole-GPU sample %+v, %v; want 90%% and the MPS server", whole, err)
	}
	for _, tc := range []struct {
		id   string
		want nodeagent.GPUSample
	}{
		{"busy", nodeagent.GPUSample{UtilizationPercent: 70, MemoryUsedMiB: 10 << 10, Processes: 1}},
		{"idle", nodeagent.GPUSample{MemoryUsedMiB: 6 << 10, Processes: 2}},
		{"none", nodeagent.GPUSample{}},
	} {
		got, err := s.SampleProcesses(ctx, tc.id, []string{u})
		if err != nil || got[u] != tc.want {
			t.Errorf("%s: %+v, %v; want %+v", tc.id, got[u], err, tc.want)
		}
	}
	// No newer sample: "busy" reads 0% (its process stays), from the
	// newest timestamp it saw; every container read from 0 at first.
	got, err := s.SampleProcesses(ctx, "busy", []string{u})
	if want := (nodeagent.GPUSample{MemoryUsedMiB: 10 << 10, Processes: 1}); err != nil || got[u] != want {
		t.Errorf("busy with no newer sample: %+v, %v; want %+v", got[u], err, want)
	}
	if want := []uint64{0, 0, 0, 10}; !slices.Equal(g.seen, want) {
		t.Errorf("lastSeenTimestamps %v; want %v", g.seen, want)
	}
	// A driver that keeps no per-process samples: the processes decide.
	g.mu.Lock()
	g.utilRet = nvml.ERROR_NOT_SUPPORTED
	g.mu.Unlock()
	if got, err := s.SampleProcesses(ctx, "idle", []string{u}); err != nil || got[u].Processes != 2 || got[u].UtilizationPercent != 0 {
		t.Errorf("idle without per-process samples: %+v, %v; want its 2 processes at 0%%", got[u], err)
	}
	if _, err := s.SampleProcesses(ctx, "gone", []string{u}); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("a gone container: %v; want ErrNotFound", err)
	}
}

// TestAgentFlagsAnIdleFractionBesideABusyOne: three sessions hold
// fractions of one shared GPU that NVML reports 90% busy as a whole. The
// session whose own process is busy stays active (its last activity
// advances); the one whose process does nothing reads 0% with its process
// and memory, and its last activity stays where it was (so idle culling
// can end it); the one with no process on the GPU is flagged unused. Read
// from the whole GPU, as before, all three looked 90% busy: none would
// ever be culled or flagged.
func TestAgentFlagsAnIdleFractionBesideABusyOne(t *testing.T) {
	cli := etcdtest.New(t)
	g := &sharedGPU{
		clients: []nvml.ProcessInfo{{Pid: 100, UsedGpuMemory: 10 << 30}, {Pid: 200, UsedGpuMemory: 5 << 30}},
	}
	lib, u := sharedNVML(g)
	// Fresh samples at every read: pid 100 at 70%, pid 200 at 0%.
	lib.Devices[0].(*dgxa100.Device).GetProcessUtilizationFunc = func(last uint64) ([]nvml.ProcessUtilizationSample, nvml.Return) {
		return []nvml.ProcessUtilizationSample{{Pid: 100, TimeStamp: last + 1, SmUtil: 70}, {Pid: 200, TimeStamp: last + 1}}, nvml.SUCCESS
	}
	rt := newFake()
	cfg := testConfig(t, cli, rt)
	cfg.GPUSampler = nodeagent.NewNVMLSampler(lib).WithProcesses(rt)
	cfg.ActivityEvery = 100 * time.Millisecond
	cfg.GPUUnusedAfter = 2 * time.Second
	runAgent(t, cfg)
	share := &state.GPUShare{MemoryMiB: 10240, GPUMemoryMiB: 40960}
	pids := map[string]uint32{"train": 100, "nb": 200, "empty": 300}
	var ss []state.Session
	var bs []state.Binding
	for _, id := range []string{"train", "nb", "empty"} {
		ss = append(ss, state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Command: []string{"sleep", "1d"}})
		bs = append(bs, state.Binding{GPUs: []string{u}, Share: share, CPUMilli: 100, MemoryMiB: 64})
	}
	bindAll(t, cli, ss, bs)
	for id, pid := range pids {
		waitPhase(t, cli, id, state.PhaseRunning, 10*time.Second)
		waitFor(t, id+"'s container", 10*time.Second, func() (bool, string) {
			for _, c := range mustList(t, rt) {
				if c.Labels[nodeagent.LabelSession] == id {
					return rt.SetPids(c.ID, pid) == nil, ""
				}
			}
			return false, "no container"
		})
	}
	st := waitActivity(t, cli, "empty", "the fraction without a process flagged unused", 15*time.Second, func(a *state.Activity) bool {
		return len(a.GPUs) == 1 && a.GPUs[0].Unused && a.GPUs[0].Processes == 0
	})
	waitActivity(t, cli, "nb", "the idle fraction read by its own process", 15*time.Second, func(a *state.Activity) bool {
		return len(a.GPUs) == 1 && a.GPUs[0].Processes == 1 && a.GPUs[0].MemoryUsedMiB == 5<<10 && a.GPUs[0].UtilizationPercent == 0
	})
	first := st.Activity.Sampled
	tr := waitActivity(t, cli, "train", "the busy fraction at its own 70%, active since", 15*time.Second, func(a *state.Activity) bool {
		return len(a.GPUs) == 1 && a.GPUs[0].UtilizationPercent == 70 && a.LastActive.After(first)
	})
	if gpu := tr.Activity.GPUs[0]; gpu.Unused || gpu.IdleSince != nil || gpu.MemoryUsedMiB != 10<<10 {
		t.Errorf("busy fraction %+v; want in use, 10240 MiB", gpu)
	}
	// The idle notebook's last activity is still its start, though its
	// busy neighbour's advanced.
	nb, _, err := state.Get[state.Status](context.Background(), cli, keys.Status("nb"))
	if err != nil {
		t.Fatal(err)
	}
	if nb.Started == nil || nb.Activity == nil || !nb.Activity.LastActive.Equal(nb.Started.UTC().Truncate(time.Second)) {
		t.Errorf("idle fraction's activity %+v, started %v: want its last activity its start; its neighbour's work counted as its own", nb.Activity, nb.Started)
	}
}

func mustList(t *testing.T, rt runtime.Runtime) []runtime.Info {
	t.Helper()
	cs, err := rt.List(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}
