package nodeagent_test

import (
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

func TestReadNVMLUsage(t *testing.T) {
	s := dgx()
	for i, d := range s.Devices {
		dev := d.(*dgxa100.Device)
		dev.GetUtilizationRatesFunc = func() (nvml.Utilization, nvml.Return) {
			return nvml.Utilization{Gpu: uint32(10 * i)}, nvml.SUCCESS
		}
		dev.MemoryInfo.Used = uint64(i) << 30
	}
	us, err := nodeagent.ReadNVMLUsage(s)
	if err != nil || len(us) != 8 {
		t.Fatalf("ReadNVMLUsage = %v, %v", us, err)
	}
	if us[3].Utilization != 0.3 || us[3].MemoryUsedMiB != 3072 {
		t.Errorf("GPU 3 usage %+v; want 0.3 and 3072 MiB", us[3])
	}
}

func TestAgentMetrics(t *testing.T) {
	cli := etcdtest.New(t)
	cfg := testConfig(t, cli, newFake())
	cfg.Usage = func() ([]nodeagent.GPUUsage, error) {
		return []nodeagent.GPUUsage{{UUID: cfg.GPUs[0].UUID, Utilization: 0.5, MemoryUsedMiB: 1024}}, nil
	}
	a, _ := runAgent(t, cfg)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(a.Collectors()...)
	bind(t, cli, state.Session{ID: "m1", Owner: "ada", Kind: state.KindBatch, Command: []string{"true"}}, state.Binding{})
	waitPhase(t, cli, "m1", state.PhaseRunning, 10*time.Second)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			got[mf.GetName()] = v
		}
	}
	for name, want := range map[string]float64{
		"voyager_agent_container_starts_total": 1,
		"voyager_agent_registered":             1,
		"voyager_agent_sessions":               1,
		"voyager_agent_gpu_utilization_ratio":  0.5,
		"voyager_agent_gpu_memory_used_bytes":  1 << 30,
	} {
		if got[name] != want {
			t.Errorf("%s = %v; want %v", name, got[name], want)
		}
	}
}
