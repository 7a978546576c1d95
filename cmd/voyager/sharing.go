package main

import (
	"fmt"
	"log/slog"
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
