package main

import (
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestRunSummaryCountsAFraction: a job on a fraction of a shared GPU
// counts its share of the GPU in GPU-hours, not a GPU.
func TestRunSummaryCountsAFraction(t *testing.T) {
	start := time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC)
	end := start.Add(2 * time.Hour)
	spec := state.Session{ID: "s", Resources: state.Resources{GPUs: 1, GPUShareMiB: 20480}}
	st := state.Status{Phase: state.PhaseSucceeded, Nodes: []string{"n1"}, Started: &start, Finished: &end,
		GPUShare: &state.GPUShare{MemoryMiB: 20480, GPUMemoryMiB: 81920}}
	sum := summarize(spec, st)
	if sum.GPUShare != 0.25 || sum.GPUHours != 0.5 {
		t.Fatalf("summary %+v; want a quarter GPU for 2 hours: 0.5 GPU-hours", sum)
	}
	if l := sum.line(); !strings.Contains(l, "0.25 of a shared GPU") || !strings.Contains(l, "0.500 GPU-hours") {
		t.Errorf("line %q", l)
	}
	st.GPUShare = nil
	if sum := summarize(spec, st); sum.GPUHours != 2 {
		t.Errorf("whole GPU: %v GPU-hours; want 2", sum.GPUHours)
	}
}
