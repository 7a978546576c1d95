package nodeagent

import (
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

func TestActivityChanged(t *testing.T) {
	t0 := time.Date(2026, 11, 22, 9, 0, 0, 0, time.UTC)
	idle := t0.Add(-time.Hour)
	base := func() *state.Activity {
		return &state.Activity{LastActive: t0, Sampled: t0,
			Jupyter: &state.JupyterActivity{LastActivity: t0, Kernels: 2, BusyKernels: 0, Connections: 1},
			GPUs: []state.GPUActivity{
				{UUID: "GPU-a", UtilizationPercent: 50, MemoryUsedMiB: 10000, Processes: 1},
				{UUID: "GPU-b", IdleSince: &idle},
			}}
	}
	for _, tc := range []struct {
		name   string
		change func(*state.Activity)
		want   bool
	}{
		{"nothing", func(*state.Activity) {}, false},
		{"only sampled later", func(a *state.Activity) { a.Sampled = t0.Add(time.Minute) }, false},
		{"connections", func(a *state.Activity) { a.Jupyter.Connections = 5 }, false},
		{"utilisation by 9 points", func(a *state.Activity) { a.GPUs[0].UtilizationPercent = 59 }, false},
		{"memory by 9%", func(a *state.Activity) { a.GPUs[0].MemoryUsedMiB = 10900 }, false},
		{"lastActive moved", func(a *state.Activity) { a.LastActive = t0.Add(time.Second) }, true},
		{"kernels", func(a *state.Activity) { a.Jupyter.Kernels = 3 }, true},
		{"busy kernels", func(a *state.Activity) { a.Jupyter.BusyKernels = 1 }, true},
		{"jupyter gone", func(a *state.Activity) { a.Jupyter = nil }, true},
		{"utilisation by 10 points", func(a *state.Activity) { a.GPUs[0].UtilizationPercent = 60 }, true},
		{"busy flag (9 → 10%)", func(a *state.Activity) { a.GPUs[0].UtilizationPercent = 9 }, true},
		{"memory by 10%", func(a *state.Activity) { a.GPUs[0].MemoryUsedMiB = 11100 }, true},
		{"processes", func(a *state.Activity) { a.GPUs[0].Processes = 2 }, true},
		{"went idle", func(a *state.Activity) { a.GPUs[0] = state.GPUActivity{UUID: "GPU-a", IdleSince: &t0} }, true},
		{"unused", func(a *state.Activity) { a.GPUs[1].Unused = true }, true},
		{"a GPU fewer", func(a *state.Activity) { a.GPUs = a.GPUs[:1] }, true},
	} {
		prev, cur := base(), base()
		tc.change(cur)
		if got := activityChanged(prev, cur, 10); got != tc.want {
			t.Errorf("%s: changed = %v; want %v", tc.name, got, tc.want)
		}
	}
	if !activityChanged(nil, base(), 10) {
		t.Error("the first sample is not a change")
	}
}
