package nodeagent

import (
	"fmt"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// DefaultCDIKind is the CDI kind of NVIDIA GPUs, as nvidia-ctk writes it:
// a GPU is the CDI device nvidia.com/gpu=<its UUID>.
const DefaultCDIKind = "nvidia.com/gpu"

// DefaultGPURecheckEvery is how often an agent checks its GPUs' CDI devices
// again (Config.GPURecheckEvery), as a GPU's problem tells the operator.
const DefaultGPURecheckEvery = 30 * time.Second

// CheckCDIDevices marks unhealthy each GPU that a container could not be
// given: one whose device (or, on a GPU partitioned into MIG devices, any
// of whose MIG devices) the CDI specs do not define as <kind>=<UUID>. Its
// Problem says which device is missing from which spec directories and
// what makes it. missing is runtime.MissingCDIDevices over the agent's
// spec directories. It returns the GPUs, the marked ones changed (gpus
// itself is not), and the marked GPUs' problems, one line each, for the
// agent's log. A GPU already unhealthy keeps its first problem.
func CheckCDIDevices(gpus []state.GPU, kind string, dirs []string, missing func(devices []string) ([]string, error)) ([]state.GPU, []string) {
	var names []string
	for _, g := range gpus {
		names = append(names, cdiNames(g, kind)...)
	}
	if len(names) == 0 {
		return gpus, nil
	}
	absent, specErrs := missing(names)
	if len(absent) == 0 {
		return gpus, nil
	}
	gone := map[string]bool{}
	for _, n := range absent {
		gone[n] = true
	}
	out := append([]state.GPU(nil), gpus...)
	var problems []string
	for i, g := range out {
		var lacking []string
		for _, n := range cdiNames(g, kind) {
			if gone[n] {
				lacking = append(lacking, n)
			}
		}
		if len(lacking) == 0 {
			continue
		}
		p := fmt.Sprintf("no CDI device %s in %s, so no container can be given this GPU: on this node run `nvidia-ctk cdi generate --device-name-strategy=uuid --output=/etc/cdi/nvidia.yaml` (NVIDIA Container Toolkit); the agent looks again every %s",
			strings.Join(lacking, ", "), strings.Join(dirs, ","), DefaultGPURecheckEvery)
		if specErrs != nil {
			p += fmt.Sprintf(" (specs that could not be read: %v)", specErrs)
		}
		if g.Healthy {
			out[i].Healthy, out[i].Problem = false, p
		}
		problems = append(problems, fmt.Sprintf("GPU %d %s: %s", g.Index, g.UUID, p))
	}
	return out, problems
}

// cdiNames are the CDI devices a session on g is given: the GPU itself,
// or each of its MIG devices when it is partitioned.
func cdiNames(g state.GPU, kind string) []string {
	if !g.MIGEnabled {
		return []string{kind + "=" + g.UUID}
	}
	names := make([]string, 0, len(g.MIGDevices))
	for _, m := range g.MIGDevices {
		names = append(names, kind+"="+m.UUID)
	}
	return names
}
