package nodeagent

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/voyager-gpu/voyager/runtime"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// MPSPipePath is where a session on a fraction of a shared GPU finds its
// GPU's MPS pipe directory (CUDA_MPS_PIPE_DIRECTORY).
const MPSPipePath = "/run/voyager/mps"

// shareSpec gives the container of binding b, a fraction of a shared GPU
// (b.Share), its limits and its GPU's MPS daemon: the MPS client
// variables that cap its memory (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, for its
// one GPU, device 0 inside the container) and compute
// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE), set after the session's own
// environment so that it cannot ask for more at start, and the daemon's
// pipe directory, mounted. VOYAGER_GPU_SHARE_MIB and
// VOYAGER_GPU_COMPUTE_PERCENT say the same to the session's own code. A
// simulated GPU has no daemon (cfg.MPS nil): its limits are set and
// VOYAGER_GPU_SIMULATED=1 says nothing enforces them.
func (a *Agent) shareSpec(spec *runtime.Spec, b state.Binding) error {
	sh := b.Share
	if len(b.GPUs) != 1 {
		return fmt.Errorf("a fraction of a shared GPU holds one GPU, not %d", len(b.GPUs))
	}
	spec.Env["VOYAGER_GPU_SHARE_MIB"] = strconv.FormatInt(sh.MemoryMiB, 10)
	spec.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = "0=" + strconv.FormatInt(sh.MemoryMiB, 10) + "M"
	delete(spec.Env, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
	if sh.ComputePercent > 0 {
		spec.Env["VOYAGER_GPU_COMPUTE_PERCENT"] = strconv.Itoa(sh.ComputePercent)
		spec.Env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = strconv.Itoa(sh.ComputePercent)
	}
	if a.cfg.MPS == nil {
		delete(spec.Env, "CUDA_MPS_PIPE_DIRECTORY")
		if a.cfg.Simulated {
			spec.Env["VOYAGER_GPU_SIMULATED"] = "1"
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pipe, err := a.cfg.MPS.Ensure(ctx, b.GPUs[0])
	if err != nil {
		return err
	}
	spec.Mounts = append(spec.Mounts, runtime.Mount{Source: pipe, Target: MPSPipePath})
	spec.Env["CUDA_MPS_PIPE_DIRECTORY"] = MPSPipePath
	return nil
}

// reconcileMPS stops the MPS daemons of shared GPUs that no binding of
// this node (want) holds a fraction of any more; a daemon a new binding
// needs is started by its container's spec (shareSpec).
func (a *Agent) reconcileMPS(ctx context.Context, want map[string]watcher.Item[state.Binding]) {
	if a.cfg.MPS == nil {
		return
	}
	keep := map[string]bool{}
	for _, it := range want {
		if it.Value.Share != nil {
			for _, g := range it.Value.GPUs {
				keep[g] = true
			}
		}
	}
	if err := a.cfg.MPS.Keep(ctx, keep); err != nil {
		a.log.Warn("stop unneeded MPS daemons", "err", err)
	}
}
