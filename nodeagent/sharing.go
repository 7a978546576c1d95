package nodeagent

import (
	"crypto/sha256"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/voyager-gpu/voyager/state"
)

// Each GPU of a node is in one mode (state.GPU.Mode): whole, MIG (NVML
// says so: the operator partitioned it, and Voyager never changes a MIG
// layout) or shared (the operator's VOYAGER_AGENT_SHARED_GPUS names it:
// offered in fractions, each enforced by the GPU's MPS daemon, mps.go).

// SharedAll is the VOYAGER_AGENT_SHARED_GPUS value that shares every GPU
// of the node that is not MIG-enabled.
const SharedAll = "all"

// MarkShared returns gpus with the GPUs that setting names marked Shared:
// SharedAll, or a comma-separated list of GPU indexes or UUIDs ("" shares
// none). A MIG-enabled GPU is never shared; naming one is reported in
// warnings (it stays MIG). A name that is no GPU of gpus is an error that
// says which GPUs there are. gpus is not changed.
func MarkShared(gpus []state.GPU, setting string) (out []state.GPU, warnings []string, err error) {
	out = append([]state.GPU(nil), gpus...)
	setting = strings.TrimSpace(setting)
	if setting == "" {
		return out, nil, nil
	}
	want := map[int]bool{}
	if setting == SharedAll {
		for i := range out {
			want[i] = true
		}
	} else {
		for name := range strings.SplitSeq(setting, ",") {
			name = strings.TrimSpace(name)
			found := -1
			for i, g := range out {
				if g.UUID == name || strconv.Itoa(g.Index) == name {
					found = i
				}
			}
			if found < 0 {
				have := make([]string, 0, len(out))
				for _, g := range out {
					have = append(have, fmt.Sprintf("%d (%s)", g.Index, g.UUID))
				}
				return nil, nil, fmt.Errorf("share GPU %q: no such GPU on this node; want %s, or a list of these indexes or UUIDs: %s", name, SharedAll, strings.Join(have, ", "))
			}
			want[found] = true
		}
	}
	for i := range out {
		if !want[i] {
			continue
		}
		if out[i].MIGEnabled {
			if setting != SharedAll {
				warnings = append(warnings, fmt.Sprintf("GPU %d (%s) has MIG enabled: its MIG devices are offered, not fractions of it (Voyager never changes a MIG layout)", out[i].Index, out[i].UUID))
			}
			continue
		}
		out[i].Shared = true
	}
	return out, warnings, nil
}

var migProfileRE = regexp.MustCompile(`^([1-7])g\.(\d+)gb$`)

// simulatedMode applies a simulated GPU group's mode to g: "" (whole),
// "shared", or "mig=<profile>+<profile>…" with profiles such as 1g.10gb,
// whose simulated MIG devices get UUIDs stable per node and GPU and the
// profile's memory. The profiles' slices and memory must fit the GPU.
func simulatedMode(node string, g *state.GPU, mode string) error {
	switch {
	case mode == "":
		return nil
	case mode == "shared":
		g.Shared = true
		return nil
	case strings.HasPrefix(mode, "mig="):
		slices, mem := 0, int64(0)
		for j, p := range strings.Split(strings.TrimPrefix(mode, "mig="), "+") {
			m := migProfileRE.FindStringSubmatch(p)
			if m == nil {
				return fmt.Errorf("MIG profile %q: want <slices>g.<memory>gb such as 1g.10gb", p)
			}
			n, _ := strconv.Atoi(m[1])
			gb, _ := strconv.ParseInt(m[2], 10, 64)
			slices += n
			mem += gb * 1024
			sum := sha256.Sum256([]byte(node + "/" + g.UUID + "/mig/" + strconv.Itoa(j)))
			g.MIGDevices = append(g.MIGDevices, state.MIGDevice{
				UUID:      fmt.Sprintf("MIG-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16]),
				Profile:   p,
				MemoryMiB: gb * 1024,
			})
		}
		if slices > 7 || mem > g.MemoryMiB {
			return fmt.Errorf("MIG profiles %s take %d slices and %d MiB; a GPU has 7 slices and %d MiB", mode, slices, mem, g.MemoryMiB)
		}
		g.MIGEnabled = true
		return nil
	}
	return fmt.Errorf("GPU mode %q: want shared or mig=<profiles> such as mig=3g.40gb+1g.10gb", mode)
}
