package placer

import "time"

// Pack places new work on the fewest machines, for sites that power down
// what stands empty when load is low (issue 40): like Binpack it never
// starts a node that runs nothing while a node in use fits, and among the
// nodes in use (every bucket of free GPUs, not only the fullest, up to
// PlanOptions.Candidates of them) it prefers the one whose sessions run
// longest past the new part's end, so that the part adds least to the
// time the node must stay on and nodes whose sessions end soon are left
// to empty. How long a session runs is its max runtime
// (state.Allocation.Ends); a session without one runs for an unknown
// time, so a node that holds one is taken to stay on, and a part without
// one goes first to such a node.
const Pack Strategy = "pack"

// scorePack is 0 for a node that runs nothing, else half of how full the
// node is after the placement (scoreBinpack) and half of how little the
// part extends the time the node stays on: 1/(1 + hours the part's end
// lies past the node's drain time).
func scorePack(p *part, n *nodeState, devs []int) float64 {
	if n.sessions() == 0 {
		return 0
	}
	return 0.5*scoreBinpack(p, n, devs) + 0.5*alignment(p.ends, drainBy(n, p.now))
}

// alignment is 1 when a part ending at ends adds nothing to the time a
// node that drains at drain stays on, falling with the hours it adds
// (either zero: no max runtime, so no known end).
func alignment(ends, drain time.Time) float64 {
	switch {
	case drain.IsZero():
		return 1 // the node stays on for a session of unknown length anyway
	case ends.IsZero():
		return 0 // a part of unknown length keeps a node on that would drain
	case !ends.After(drain):
		return 1
	}
	return 1 / (1 + ends.Sub(drain).Hours())
}
