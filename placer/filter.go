package placer

import (
	"fmt"
	"path"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// Shortfall is why one node cannot take one part of a session: a result,
// not an error. Reasons of all nodes become the session's pending message.
type Shortfall struct {
	// Filter names the filter that refused, e.g. "gpus", "cpu", "cordon".
	Filter string
	// Requested, Free and Capacity quantify numeric shortfalls (GPUs in
	// devices, CPU in milli-cores, memory in MiB); zero for others.
	Requested, Free, Capacity int64
	// Message says it in plain words.
	Message string
}

// part is one node's share of a session being placed.
type part struct {
	req   *state.Resources
	role  state.Role
	ports int
	id    string // session id, for reservations
	owner string // the session's owner: a shared GPU holds one owner's fractions
	// ends is when the part's session is planned to end: the plan's
	// clock plus its owner's recent run time of its size where that is
	// shorter than its max runtime (expects), else plus its max runtime
	// (bound); zero: no max runtime. A part that ends by the time a held
	// node drains may run there (backfill) if backfill is set: its owner
	// is below its fair share.
	ends     time.Time
	bound    time.Time
	backfill bool
	// now is the plan's clock (zero on parts placed outside NewPlan's
	// queue): a ledger's expected ends are read against it (planEnd).
	now time.Time
	// below is set when the part's owner may take a node of the standing
	// reserve (reserve.go: below its fair share and an equal split).
	below bool
}

// filter is one feasibility check. It is a pure function of the part and
// the node: it returns nil when the node is feasible. refuses, where set,
// is check's answer without its reason (check(p, n) != nil), for fits.
type filter struct {
	name    string
	check   func(p *part, n *nodeState) *Shortfall
	refuses func(p *part, n *nodeState) bool
}

// filters run cheapest and most selective first: a cordon or a label
// mismatch is decided without looking at devices.
var filters = []filter{
	{name: "cordon", check: filterCordon},
	{name: "reserved", check: filterReserved, refuses: reservedAgainst},
	{name: "labels", check: filterLabels},
	{name: "sessions", check: filterSessions},
	{name: "cpu", check: filterCPU, refuses: func(p *part, n *nodeState) bool { return p.req.CPUMilli > n.freeCPU }},
	{name: "memory", check: filterMemory, refuses: func(p *part, n *nodeState) bool { return p.req.MemoryMiB > n.freeMem }},
	{name: "gpus", check: filterGPUs, refuses: func(p *part, n *nodeState) bool { return !gpusFit(p, n) }},
	{name: "ports", check: filterPorts, refuses: func(p *part, n *nodeState) bool { return !n.hasFreePorts(p.ports) }},
}

// fits reports whether every filter passes n for p (feasible(p, n) ==
// nil) without writing the reason of a refusal where the filter can say
// so without it: a search ranking candidates throws the reason away, and
// at 2,000 nodes a held node's reason was a string built for each search
// that passed it.
func fits(p *part, n *nodeState) bool {
	for i := range filters {
		f := &filters[i]
		if f.refuses != nil {
			if f.refuses(p, n) {
				return false
			}
		} else if f.check(p, n) != nil {
			return false
		}
	}
	return true
}

// feasible runs every filter and returns the first shortfall, or nil.
func feasible(p *part, n *nodeState) *Shortfall {
	for i := range filters {
		if s := filters[i].check(p, n); s != nil {
			return s
		}
	}
	return nil
}

func filterCordon(_ *part, n *nodeState) *Shortfall {
	if c := n.view.Cordon; c != nil {
		msg := "node " + n.name + " is cordoned"
		if c.Reason != "" {
			msg += " (" + c.Reason + ")"
		}
		return &Shortfall{Filter: "cordon", Message: msg}
	}
	return nil
}

func filterReserved(p *part, n *nodeState) *Shortfall {
	if reservedAgainst(p, n) {
		return &Shortfall{Filter: "reserved", Message: reservedMessage(p, n)}
	}
	return nil
}

// reservedAgainst reports whether n is held or kept for another than p,
// which p may not backfill or take (filterReserved's test).
func reservedAgainst(p *part, n *nodeState) bool {
	return n.reservedFor != "" && n.reservedFor != p.id && !backfills(p, n) && !takesReserve(p, n)
}

func filterLabels(p *part, n *nodeState) *Shortfall {
	if len(p.req.NodeSelector) == 0 {
		return nil // most requests: no walk of a nil map (the holds' scans call this for every node)
	}
	for k, v := range p.req.NodeSelector {
		if got, ok := n.view.Node.Labels[k]; !ok || got != v {
			return &Shortfall{Filter: "labels", Message: fmt.Sprintf("node %s lacks label %s=%s", n.name, k, v)}
		}
	}
	return nil
}

func filterSessions(_ *part, n *nodeState) *Shortfall {
	if n.maxSessions > 0 && n.sessions() >= n.maxSessions {
		return &Shortfall{Filter: "sessions", Requested: 1, Free: 0, Capacity: int64(n.maxSessions),
			Message: fmt.Sprintf("node %s holds its maximum of %d sessions", n.name, n.maxSessions)}
	}
	return nil
}

func filterCPU(p *part, n *nodeState) *Shortfall {
	if p.req.CPUMilli > n.freeCPU {
		return &Shortfall{Filter: "cpu", Requested: p.req.CPUMilli, Free: n.freeCPU, Capacity: n.view.Node.CPUMilli,
			Message: fmt.Sprintf("node %s has %s free, needs %s", n.name, milli(n.freeCPU), milli(p.req.CPUMilli))}
	}
	return nil
}

func filterMemory(p *part, n *nodeState) *Shortfall {
	if p.req.MemoryMiB > n.freeMem {
		return &Shortfall{Filter: "memory", Requested: p.req.MemoryMiB, Free: n.freeMem, Capacity: n.view.Node.MemoryMiB,
			Message: fmt.Sprintf("node %s has %d MiB memory free, needs %d MiB", n.name, n.freeMem, p.req.MemoryMiB)}
	}
	return nil
}

// gpusFit reports whether n has free the devices p asks for: filterGPUs
// without the reason, for searches that throw the reason away.
func gpusFit(p *part, n *nodeState) bool {
	switch {
	case p.req.GPUs == 0:
		return true
	case p.req.Fraction():
		fits, _, _ := shareScan(p, n)
		return fits
	}
	return n.freeDevices(p.req) >= p.req.GPUs
}

func filterGPUs(p *part, n *nodeState) *Shortfall {
	if p.req.GPUs > 0 && p.req.Fraction() {
		return filterShare(p, n) // one scan of the shared GPUs, fit or not
	}
	if gpusFit(p, n) {
		return nil
	}
	free := n.freeDevices(p.req)
	return &Shortfall{Filter: "gpus", Requested: int64(p.req.GPUs), Free: int64(free), Capacity: int64(n.capacityDevices(p.req)),
		Message: fmt.Sprintf("node %s has %d free, needs %d", n.name, free, p.req.GPUs)}
}

func filterPorts(p *part, n *nodeState) *Shortfall {
	if !n.hasFreePorts(p.ports) {
		return &Shortfall{Filter: "ports", Requested: int64(p.ports),
			Message: fmt.Sprintf("node %s has no %d free ports in %d-%d", n.name, p.ports, n.view.Node.Ports.First, n.view.Node.Ports.Last)}
	}
	return nil
}

// deviceMatches says whether device d can serve request r: healthy, of a
// matching model and memory, and a whole GPU, a MIG device of the asked
// profile, or a shared GPU at least as large as the asked fraction
// (whether the fraction has room there now is nodeState.roomFor's).
func deviceMatches(d *device, r *state.Resources) bool {
	return deviceMatchesWith(d, r, nil)
}

// deviceMatchesWith is deviceMatches with the model matched by m (for
// r.GPUModel; nil: the memo of modelmatch.go).
func deviceMatchesWith(d *device, r *state.Resources, m *modelMatcher) bool {
	if !d.healthy {
		return false
	}
	if d.mig != r.MIGProfile || d.shared != r.Fraction() {
		return false
	}
	if r.GPUShareMiB > d.memoryMiB {
		return false
	}
	if r.GPUMemoryMiB > 0 && d.memoryMiB < r.GPUMemoryMiB {
		return false
	}
	if r.GPUModel != "" {
		if m != nil {
			if !m.match(d.model) {
				return false
			}
		} else if !modelMatches(r.GPUModel, d.model) { // memoized path.Match (modelmatch.go)
			return false
		}
	}
	return true
}

// ValidateModelPattern checks a GPU model pattern. A request with a bad
// pattern would match nothing forever; the API refuses it up front.
func ValidateModelPattern(p string) error {
	if _, err := path.Match(p, ""); err != nil {
		return fmt.Errorf("parse GPU model pattern %q: want a shell pattern such as \"*A100*\": %w", p, err)
	}
	return nil
}

func milli(m int64) string {
	if m%1000 == 0 {
		return fmt.Sprintf("%d cores", m/1000)
	}
	return fmt.Sprintf("%.1f cores", float64(m)/1000)
}
