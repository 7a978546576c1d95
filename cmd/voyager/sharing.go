package main

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/nodeagent"
	"github.com/voyager-gpu/voyager/state"
)

// shareGPUs marks the GPUs VOYAGER_AGENT_SHARED_GPUS names as shared
// (nodeagent.MarkShared): a name that is no GPU of the node stops the
// agent, saying which GPUs there are; a MIG-enabled GPU named stays MIG,
// with a warning.
func shareGPUs(gpus []state.GPU, cfg config.Config, log *slog.Logger) ([]state.GPU, error) {
	out, warnings, err := nodeagent.MarkShared(gpus, cfg.AgentSharedGPUs)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", config.EnvAgentSharedGPUs, err)
	}
	for _, w := range warnings {
		log.Warn(w, "env", config.EnvAgentSharedGPUs)
	}
	n := 0
	for _, g := range out {
		if g.Shared {
			n++
		}
	}
	if n > 0 {
		log.Info("GPUs offered in fractions", "shared", n)
	}
	return out, nil
}

// gpuModeNote is what dev's start block adds to a GPU's model: its mode
// when it is not whole ("shared", "MIG 3g.40gb+1g.10gb").
func gpuModeNote(g state.GPU) string {
	switch g.Mode() {
	case state.GPUModeShared:
		return " shared in fractions"
	case state.GPUModeMIG:
		ps := make([]string, 0, len(g.MIGDevices))
		for _, m := range g.MIGDevices {
			ps = append(ps, m.Profile)
		}
		return " MIG " + strings.Join(ps, "+")
	}
	return ""
}

// newMPS is the manager of the MPS daemons of the node's shared GPUs
// (VOYAGER_AGENT_MPS_CONTROL, directories under <data dir>/mps); nil
// where no GPU is shared, and for simulated GPUs, which have no daemon.
func newMPS(gpus []state.GPU, simulated bool, cfg config.Config, log *slog.Logger) *nodeagent.MPS {
	if simulated {
		return nil
	}
	for _, g := range gpus {
		if g.Shared {
			return nodeagent.NewMPS(cfg.AgentMPSControl, filepath.Join(cfg.DataDir, "mps"), log)
		}
	}
	return nil
}
