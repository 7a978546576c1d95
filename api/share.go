package api

import (
	"fmt"

	"github.com/voyager-gpu/voyager/state"
)

// validateShare checks a request for a fraction of a shared GPU
// (gpuShareMiB, gpuComputePercent): of one GPU, not a MIG device, and a
// compute percent only with a fraction. Whether a node has a shared GPU
// large enough is the admission check's (feasibility).
func validateShare(prefix string, r state.Resources, add func(field, format string, args ...any)) {
	switch {
	case r.GPUShareMiB < 0:
		add(prefix+".gpuShareMiB", "got %d, want MiB of one shared GPU's memory above 0, e.g. 10240", r.GPUShareMiB)
	case r.GPUShareMiB > 0 && r.GPUs != 1:
		add(prefix+".gpus", "is %d with gpuShareMiB set; a fraction is of one GPU: want 1", r.GPUs)
	case r.GPUShareMiB > 0 && r.MIGProfile != "":
		add(prefix+".migProfile", "is set with gpuShareMiB; want a MIG device (migProfile) or a fraction of a shared GPU (gpuShareMiB), not both")
	}
	if r.GPUComputePercent < 0 || r.GPUComputePercent > 100 {
		add(prefix+".gpuComputePercent", "got %d, want 1 to 100 (percent of the GPU's compute), or 0 for no cap", r.GPUComputePercent)
	} else if r.GPUComputePercent > 0 && r.GPUShareMiB == 0 {
		add(prefix+".gpuComputePercent", "is set without gpuShareMiB; a compute share is of a fraction of a shared GPU: set gpuShareMiB too")
	}
}

// shareWords says what fraction r asks for: "a 10240 MiB fraction of a
// shared GPU, 25% compute".
func shareWords(r state.Resources) string {
	s := fmt.Sprintf("a %d MiB fraction of a shared GPU", r.GPUShareMiB)
	if r.GPUModel != "" {
		s += " " + r.GPUModel
	}
	if r.GPUComputePercent > 0 {
		s += fmt.Sprintf(", %d%% compute", r.GPUComputePercent)
	}
	return s
}
