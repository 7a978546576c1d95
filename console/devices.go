package console

import (
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// The start form's device choices: beside whole GPUs of a model (the
// gpuModel select), the MIG devices and the shared GPUs (fractions of
// their memory, gpuShareMiB) that the nodes offer, each with what is free
// of it now and marked simulated where its inventory is made up. The
// values name what the form asks the API for: "mig:<profile>:<model>",
// "shared:<model>" (a profile has no colon, a model may).

// deviceChoice is one option of the form's device select.
type deviceChoice struct {
	Value, Label string
	Simulated    bool
}

// deviceChoices lists the MIG devices (by model and profile) and shared
// GPUs (by model) of the uncordoned nodes, with what is free of each for
// viewer: free healthy MIG devices; for shared GPUs, those whose
// fractions are none or the viewer's own (one user per shared GPU at a
// time) and the most memory free on one of them.
func deviceChoices(nodes []api.NodeSummary, viewer string) []deviceChoice {
	type mig struct {
		model, profile string
		free, all      int
		mib            int64
		sim            bool
	}
	type shared struct {
		model        string
		open, all    int
		most, memory int64
		sim          bool
	}
	migs, shares := map[[2]string]*mig{}, map[string]*shared{}
	for _, n := range nodes {
		if n.Cordon != nil {
			continue
		}
		for _, d := range n.Devices {
			sim := n.Simulated || d.Simulated
			switch {
			case d.MIGProfile != "":
				k := [2]string{d.Model, d.MIGProfile}
				m := migs[k]
				if m == nil {
					m = &mig{model: d.Model, profile: d.MIGProfile, mib: d.MemoryMiB}
					migs[k] = m
				}
				m.all++
				m.sim = m.sim || sim
				if d.Healthy && d.Owner == "" {
					m.free++
				}
			case d.Shared:
				s := shares[d.Model]
				if s == nil {
					s = &shared{model: d.Model}
					shares[d.Model] = s
				}
				s.all++
				s.sim = s.sim || sim
				s.memory = max(s.memory, d.MemoryMiB)
				free := d.FreeMiB
				if d.Fractions == 0 {
					free = d.MemoryMiB
				}
				if d.Healthy && (d.Owner == "" || d.Owner == viewer) && free > 0 {
					s.open++
					s.most = max(s.most, free)
				}
			}
		}
	}
	var out []deviceChoice
	for _, m := range migs {
		label := fmt.Sprintf("MIG %s of %s, %d MiB (%d of %d free)", m.profile, m.model, m.mib, m.free, m.all)
		out = append(out, deviceChoice{Value: "mig:" + m.profile + ":" + m.model, Label: simLabel(label, m.sim), Simulated: m.sim})
	}
	for _, s := range shares {
		label := fmt.Sprintf("a fraction of a shared %s (%d MiB each; %d of %d open to you, up to %d MiB free on one)", s.model, s.memory, s.open, s.all, s.most)
		if s.open == 0 {
			label = fmt.Sprintf("a fraction of a shared %s (%d MiB each; none of %d open to you now: your session will queue)", s.model, s.memory, s.all)
		}
		out = append(out, deviceChoice{Value: "shared:" + s.model, Label: simLabel(label, s.sim), Simulated: s.sim})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Value < out[j].Value })
	return out
}

// patternMeta escapes path.Match's metacharacters.
var patternMeta = strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)

// modelPattern is the gpuModel pattern (path.Match) that matches the
// model name m alone, as a device choice means it.
func modelPattern(m string) string { return patternMeta.Replace(m) }

func simLabel(label string, sim bool) string {
	if sim {
		return label + " — simulated"
	}
	return label
}

// wholeFree is freeByModel's whole GPUs only: what the gpuModel select
// offers (a MIG device or a shared GPU is chosen as a device).
func wholeFree(nodes []api.NodeSummary) []modelCount {
	var out []modelCount
	for _, f := range freeByModel(nodes) {
		if !strings.Contains(f.Model, " MIG ") {
			out = append(out, f)
		}
	}
	return out
}

// applyDevice sets res from the form's device choice (empty: whole GPUs)
// and, for a fraction, its gpuShareMiB and gpuComputePercent fields. It
// reports whether it set anything.
func applyDevice(res *state.Resources, get func(string) string) (bool, error) {
	v := get("device")
	switch {
	case v == "" || v == "whole":
		return false, nil
	case strings.HasPrefix(v, "mig:"):
		profile, model, ok := strings.Cut(strings.TrimPrefix(v, "mig:"), ":")
		if !ok || profile == "" || model == "" {
			return false, badField("device", fmt.Sprintf("got %q, want mig:<profile>:<model> such as mig:1g.10gb:A100", v))
		}
		res.MIGProfile, res.GPUModel = profile, modelPattern(model)
		if res.GPUs == 0 {
			res.GPUs = 1
		}
		return true, nil
	case strings.HasPrefix(v, "shared:"):
		model := strings.TrimPrefix(v, "shared:")
		m := strings.TrimSpace(get("gpuShareMiB"))
		mib, err := strconv.ParseInt(m, 10, 64)
		if err != nil || mib <= 0 {
			return false, badField("gpuShareMiB", fmt.Sprintf("got %q, want the fraction's memory in MiB, such as 10240", m))
		}
		res.GPUShareMiB, res.GPUModel = mib, modelPattern(model)
		if c := strings.TrimSpace(get("gpuComputePercent")); c != "" {
			p, err := strconv.Atoi(c)
			if err != nil {
				return false, badField("gpuComputePercent", fmt.Sprintf("got %q, want a whole percent from 1 to 100, or empty", c))
			}
			res.GPUComputePercent = p
		}
		if res.GPUs == 0 {
			res.GPUs = 1
		}
		return true, nil
	}
	return false, badField("device", fmt.Sprintf("got %q, want one of the form's choices: empty for whole GPUs, mig:<profile>:<model> or shared:<model>", v))
}
