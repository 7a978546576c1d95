package nodeagent_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/runtime"
)

func TestNVMLSamplerReadsGPUsByUUID(t *testing.T) {
	busy, idle := &mockGPU{}, &mockGPU{}
	busy.util.Store(90)
	busy.procs.Store(2)
	busy.memMiB.Store(1024)
	lib := nvmlWith(busy, idle)
	// A MIG device has no utilisation counter: NVML says not supported.
	lib.Devices[1].(*dgxa100.Device).GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
		return nvml.Utilization{}, nvml.ERROR_NOT_SUPPORTED
	}
	idle.procs.Store(1)
	u0, _ := lib.Devices[0].GetUUID()
	u1, _ := lib.Devices[1].GetUUID()
	s := nodeagent.NewNVMLSampler(lib)
	defer s.Close()
	got, err := s.SampleGPUs(context.Background(), "c", []string{u0, u1, "GPU-nowhere"})
	if err == nil {
		t.Error("no error for an unknown UUID")
	}
	if g := got[u0]; g != (nodeagent.GPUSample{UtilizationPercent: 90, MemoryUsedMiB: 1024, Processes: 2}) {
		t.Errorf("GPU 0: %+v", g)
	}
	if g := got[u1]; g != (nodeagent.GPUSample{Processes: 1}) {
		t.Errorf("GPU 1 (no utilisation counter): %+v; want 0%% and its process", g)
	}
	if _, ok := got["GPU-nowhere"]; ok || len(got) != 2 {
		t.Errorf("samples %v; want the two readable GPUs", got)
	}
}

func TestNVMLSamplerWithoutDriver(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	if _, err := nodeagent.NewNVMLSampler(lib).SampleGPUs(context.Background(), "c", []string{"GPU-a"}); !errors.Is(err, nodeagent.ErrNoNVML) {
		t.Fatalf("SampleGPUs without a driver: %v; want ErrNoNVML", err)
	}
}

func TestSimulatedSamplerFollowsCPUTime(t *testing.T) {
	ctx := context.Background()
	rt := runtime.NewFake(nil, "busybox")
	if err := rt.Start(ctx, runtime.Spec{ID: "c", Image: "busybox"}); err != nil {
		t.Fatal(err)
	}
	s := nodeagent.NewSimulatedSampler(rt)
	idle := nodeagent.GPUSample{Simulated: true}
	if got, err := s.SampleGPUs(ctx, "c", []string{"a", "b"}); err != nil || got["a"] != idle || got["b"] != idle {
		t.Fatalf("an idle container's GPUs: %v, %v; want 0%%, no process, simulated", got, err)
	}
	// More CPU time than wall time since the last sample: capped at 100%.
	rt.SetCPUUsage("c", time.Hour)
	got, err := s.SampleGPUs(ctx, "c", []string{"a"})
	if want := (nodeagent.GPUSample{UtilizationPercent: 100, Processes: 1, Simulated: true}); err != nil || got["a"] != want {
		t.Fatalf("a busy container's GPU: %v, %v; want %+v", got, err, want)
	}
	// No CPU since: idle again.
	if got, _ := s.SampleGPUs(ctx, "c", []string{"a"}); got["a"] != idle {
		t.Fatalf("after the CPU stopped: %+v; want idle", got["a"])
	}
	if _, err := s.SampleGPUs(ctx, "gone", []string{"a"}); !errors.Is(err, runtime.ErrNotFound) {
		t.Fatalf("a gone container: %v; want ErrNotFound", err)
	}
}
