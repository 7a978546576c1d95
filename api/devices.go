package api

import (
	"github.com/voyager-gpu/voyager/state"
)

// GPUDevice is one allocatable device of a node as GET
// /api/v1/nodes?devices=true shows it: a whole GPU, or one MIG device of a
// partitioned GPU. The web console's cluster page draws it.
type GPUDevice struct {
	UUID      string `json:"uuid"`
	Index     int    `json:"index"`
	Model     string `json:"model"`
	MemoryMiB int64  `json:"memoryMiB"`
	Healthy   bool   `json:"healthy"`
	// Problem says why the agent offers the device as unhealthy and what
	// would mend it (the GPU's, for a MIG device).
	Problem string `json:"problem,omitempty"`
	// MIGProfile is set for a MIG device ("1g.10gb"); Parent is then the
	// UUID of its GPU.
	MIGProfile string `json:"migProfile,omitempty"`
	Parent     string `json:"parent,omitempty"`
	// Shared marks a GPU offered in fractions (gpuShareMiB): Fractions
	// are held of it, FreeMiB of its memory is free for more, and Owner
	// is the one user whose fractions it holds (one at a time); Session
	// stays empty.
	Shared    bool  `json:"shared,omitempty"`
	Fractions int   `json:"fractions,omitempty"`
	FreeMiB   int64 `json:"freeMiB,omitempty"`
	// Session and Owner hold the device; both empty when it is free.
	// Another user's read "(another user)" with no session, except for
	// admins, as in the queue.
	Session string `json:"session,omitempty"`
	Owner   string `json:"owner,omitempty"`
	// Sampled says the holder's agent reported this device's use;
	// UtilizationPercent and MemoryUsedMiB are meaningful only then.
	Sampled            bool  `json:"sampled,omitempty"`
	UtilizationPercent int   `json:"utilizationPercent,omitempty"`
	MemoryUsedMiB      int64 `json:"memoryUsedMiB,omitempty"`
	// Unused flags an allocated device that nothing runs on.
	Unused bool `json:"unused,omitempty"`
	// Simulated marks a device of a simulated inventory, or use numbers
	// made up for one.
	Simulated bool `json:"simulated,omitempty"`
}

// nodeDevices lists n's allocatable devices with their holders from
// ledger l and their use from the holders' statuses, as p may see them.
func nodeDevices(p Principal, n state.Node, l state.Ledger, status func(id string) (state.Status, bool)) []GPUDevice {
	owners := state.Holders(n, l) // a device whose GPU or MIG device is held is not free either
	use := map[string]state.GPUActivity{}
	for id := range l.Allocations {
		if st, ok := status(id); ok && st.Activity != nil && !st.Phase.Terminal() {
			for _, g := range st.Activity.GPUs {
				use[g.UUID] = g
			}
		}
	}
	out := make([]GPUDevice, 0, len(n.GPUs))
	add := func(d GPUDevice) {
		if id, held := owners[d.UUID]; held {
			d.Session, d.Owner = id, l.Allocations[id].Owner
			if !p.Admin && d.Owner != p.Subject {
				d.Session, d.Owner = "", "(another user)"
			}
			if g, ok := use[d.UUID]; ok {
				d.Sampled, d.UtilizationPercent, d.MemoryUsedMiB, d.Unused = true, g.UtilizationPercent, g.MemoryUsedMiB, g.Unused
				d.Simulated = d.Simulated || g.Simulated
			}
		}
		out = append(out, d)
	}
	for _, g := range n.GPUs {
		base := GPUDevice{Index: g.Index, Model: g.Model, Healthy: g.Healthy, Problem: g.Problem, Simulated: n.Simulated}
		if g.Shared && !g.MIGEnabled {
			d := base
			d.UUID, d.MemoryMiB, d.Shared, d.FreeMiB = g.UUID, g.MemoryMiB, true, g.MemoryMiB
			for _, a := range l.Allocations {
				if a.Share != nil && len(a.GPUs) == 1 && a.GPUs[0] == g.UUID {
					d.Fractions++
					d.FreeMiB -= a.Share.MemoryMiB
					d.Owner = a.Owner
					if !p.Admin && d.Owner != p.Subject {
						d.Owner = "(another user)"
					}
				}
			}
			out = append(out, d)
			continue
		}
		if !g.MIGEnabled {
			d := base
			d.UUID, d.MemoryMiB = g.UUID, g.MemoryMiB
			add(d)
			continue
		}
		for _, m := range g.MIGDevices {
			d := base
			d.UUID, d.MemoryMiB, d.MIGProfile, d.Parent = m.UUID, m.MemoryMiB, m.Profile, g.UUID
			add(d)
		}
	}
	return out
}

// attachDevices fills each summary's Devices, as p may see them.
func (a *API) attachDevices(p Principal, out []NodeSummary) {
	ledgers, statuses := a.ledgers.Snapshot(), a.status.Snapshot()
	byName := map[string]state.Node{}
	for _, n := range a.liveNodes() {
		byName[n.Name] = n
	}
	for i := range out {
		l, _ := ledgers.Get(a.keys.Ledger(out[i].Name))
		out[i].Devices = nodeDevices(p, byName[out[i].Name], l, func(id string) (state.Status, bool) {
			return statuses.Get(a.keys.Status(id))
		})
	}
}
