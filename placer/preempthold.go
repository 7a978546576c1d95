package placer

import (
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// A node a preemption frees stays held for its preemptor until the
// preemptor binds (issue 36: a team gets back what it is owed within its
// victims' grace and one pass, not two).
//
// While the victims stop, their warnings (warnings/<victim>, Node and By)
// hold the node (SnapshotOf). Those warnings go once the victims have
// stopped and are queued again, which can be before any placer's pass has
// bound the preemptor there; from then on the freed room would go to
// whoever came first in the order (an older request of the same team, or
// a higher priority), and the preemptor would preempt again, a second
// round of grace. So the lifecycle controller writes the node into the
// preemptor's own queue entry (state.QueueEntry.Hold) in the transaction
// that warns the victims, and every placer holds the node for it while
// the entry stands: until it binds (the bind deletes the entry), it is
// cancelled, or the hold's Until passes (a preemptor that no longer fits
// there must not keep a node idle for ever). The rule reads only etcd
// state that every placer sees and the pass's clock, so placers agree.

// HoldOf is the node whose room e's preemption keeps for it at now, or ""
// when it holds none (no hold, or one that lapsed).
func HoldOf(e *state.QueueEntry, now time.Time) string {
	if e == nil || e.Hold == nil || e.Hold.Node == "" || !now.Before(e.Hold.Until) {
		return ""
	}
	return e.Hold.Node
}

// addEntryHolds adds to held (node → session, nil allowed) the node each
// queue entry of pending holds at now (HoldOf), where no warning holds it
// already; two entries holding one node (which the controller never
// writes) leave it to the smaller session id, whatever the queue's order.
// It returns held, nil when nothing is held.
func addEntryHolds(held map[string]string, pending []Pending, now time.Time) map[string]string {
	var mine map[string]string
	for i := range pending {
		if pending[i].Pinned {
			continue
		}
		e := pending[i].Entry
		n := HoldOf(e, now)
		if n == "" {
			continue
		}
		if _, ok := held[n]; ok {
			continue // a standing warning's preemptor keeps it
		}
		if mine == nil {
			mine = map[string]string{}
		}
		if id, ok := mine[n]; !ok || e.Session < id {
			mine[n] = e.Session
		}
	}
	if len(mine) > 0 && held == nil {
		held = make(map[string]string, len(mine))
	}
	for n, id := range mine {
		held[n] = id
	}
	return held
}

// AddEntryHolds is addEntryHolds for snapshots built outside SnapshotOf
// (the simulator): held with the nodes the queue entries of pending hold
// at now.
func AddEntryHolds(held map[string]string, pending []Pending, now time.Time) map[string]string {
	return addEntryHolds(held, pending, now)
}

// holdersOf is the sessions that s.Held keeps a node for: a preemption of
// theirs is under way, so they plan no other (PlanPreemption).
func holdersOf(s *Snapshot) map[string]bool {
	out := make(map[string]bool, len(s.Held))
	for _, id := range s.Held {
		out[id] = true
	}
	return out
}
