package api

import (
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// NodePower is what the node view says of a node that runs nothing: an
// operator's hook for powering machines down when load is low (Voyager
// powers nothing itself).
type NodePower struct {
	// EmptySince is since when the node has held no session: the later of
	// its emptied/<node> record (written with the release that deleted its
	// ledger) and its agent's registration. Absent while the node holds a
	// session (has a ledger).
	EmptySince *time.Time `json:"emptySince,omitempty"`
	// EmptyFor is how long that is, as of the answer ("1h5m0s").
	EmptyFor string `json:"emptyFor,omitempty"`
	// PowerDown is true once the node has been empty for at least
	// VOYAGER_NODE_POWER_DOWN_AFTER: an operator's tooling may power it
	// down (and should cordon it first, so that nothing is placed there
	// meanwhile).
	PowerDown bool `json:"powerDown"`
	// PowerDownAfter is the threshold, for the reader of one answer.
	PowerDownAfter string `json:"powerDownAfter,omitempty"`
}

// nodePower is node n's NodePower at now: ledger tells whether its ledger
// exists, rec and ok its emptied/<node> record.
func (a *API) nodePower(n state.Node, ledger bool, rec state.Emptied, ok bool, now time.Time) NodePower {
	p := NodePower{PowerDownAfter: a.cfg.PowerDownAfter.String()}
	since, empty := state.EmptySince(ledger, rec, ok, n.Registered)
	if !empty || since.IsZero() {
		return p
	}
	since = since.UTC()
	p.EmptySince = &since
	d := max(now.Sub(since), 0).Round(time.Second)
	p.EmptyFor = d.String()
	p.PowerDown = d >= a.cfg.PowerDownAfter
	return p
}
