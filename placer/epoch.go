package placer

import (
	"github.com/voyager-gpu/voyager/state"
)

// PinEpoch chooses the plan epoch of s and, when s plans an epoch that has
// binds already, puts those sessions back in s's queue, pinned.
//
// Placers plan the whole queue and each commits its share, so their plans
// must agree. A placer whose snapshot shows part of another placer's
// commits planned, before epochs, on a different state from the one the
// other planned on: the rest of the queue was placed differently, and the
// two bound some sessions twice over (one transaction refused whole).
// With epochs, every bind records the epoch of the plan it came from
// (state.Allocation.Plan: the revision of that plan's snapshot). A
// snapshot whose newest epoch is still current (nothing but binds changed
// since: no queue entry, node, cordon or quota is newer than it, and no
// allocation was taken off a ledger after it, Snapshot.Freed) plans
// that epoch: the epoch's binds are freed from their nodes and their
// sessions queued again, pinned where they are bound, so the plan is the
// epoch's plan whichever part of it the snapshot shows, and the placer
// commits the part of it that is its share and not bound yet. Otherwise
// the snapshot starts a new epoch: the newest revision it read (fresh, or
// a newer queue entry, node, cordon or quota).
//
// done is the newest epoch the caller found complete (a pass of it that
// planned nothing left to bind): it is not planned again, so an epoch
// ends once its plan is bound, and the sessions bound in it are not
// placed again pass after pass.
//
// A release ends the epoch (Snapshot.Freed): planned again with the freed
// devices, the epoch's order, which counts each pinned session's GPUs only
// from its turn, gave them to whoever came first in it, not to the owner
// with the smaller share, and let earlier sessions take devices that
// pinned sessions hold (TestReleaseEndsTheEpoch). Under steady churn an
// epoch would otherwise last as long as the churn, and fair share would
// drift with it. A cancelled queue entry leaves no trace newer than the
// epoch: placers that see it and those that do not yet plan the rest
// differently, which costs a refused transaction, as before epochs, never
// a wrong bind: every bind compares what it read.
func PinEpoch(s *Snapshot, done, fresh int64) {
	var changed int64 // the newest change that is not a bind
	for i := range s.Pending {
		changed = max(changed, s.Pending[i].Revision)
	}
	var epoch int64
	for i := range s.Nodes {
		v := &s.Nodes[i]
		changed = max(changed, v.NodeRevision, v.CordonRevision)
		for _, a := range v.Ledger.Allocations {
			epoch = max(epoch, a.Plan)
		}
	}
	for _, r := range s.QuotaRevisions {
		changed = max(changed, r)
	}
	changed = max(changed, s.Freed)
	s.Fresh = max(fresh, changed)
	if epoch == 0 || epoch <= done || epoch < changed {
		s.Epoch = s.Fresh
		return
	}
	s.Epoch = epoch
	pinned := map[string]bool{}
	var add []Pending
	for i := range s.Nodes {
		for id, a := range s.Nodes[i].Ledger.Allocations {
			if a.Plan != epoch || pinned[id] {
				continue
			}
			pinned[id] = true
			add = append(add, Pending{Pinned: true, Entry: &state.QueueEntry{
				Session: id, Owner: a.Owner, Groups: a.Groups, Team: a.Team, Kind: a.Kind, Priority: a.Priority,
				Preemptible: a.Preemptible, Created: a.Queued,
			}})
		}
	}
	if len(add) == 0 {
		return
	}
	// A queue entry the cache still shows for a pinned session (its
	// deletion not delivered yet) is the same session: pinned, not queued.
	kept := s.Pending[:0]
	for _, it := range s.Pending {
		if !pinned[it.Entry.Session] {
			kept = append(kept, it)
		}
	}
	s.Pending = append(kept, add...)
}

// pinnedPart is what a pinned session holds on one node.
type pinnedPart struct {
	node  *nodeState
	alloc *state.Allocation
}

// releasePinned frees on every node what the pinned sessions of p's
// snapshot hold, and remembers it to hold again at each one's turn.
func (p *planner) releasePinned() {
	ids := map[string]bool{}
	for i := range p.snap.Pending {
		if p.snap.Pending[i].Pinned {
			ids[p.snap.Pending[i].Entry.Session] = true
		}
	}
	if len(ids) == 0 {
		return
	}
	p.pinned = map[string][]pinnedPart{}
	for _, n := range p.nodes {
		for id, a := range n.view.Ledger.Allocations {
			if !ids[id] {
				continue
			}
			a := a
			n.release(&a)
			p.pinned[id] = append(p.pinned[id], pinnedPart{node: n, alloc: &a})
		}
	}
}

// placePinned holds what pinned session it holds, at its turn in the
// order, and counts it in its owner's and groups' usage. It marks the plan
// collided when any of it was taken before its turn.
func (p *planner) placePinned(it *Pending, plan *Plan) {
	id := it.Entry.Session
	for _, pp := range p.pinned[id] {
		// What it holds must still be free: the epoch's plan gave it
		// these at its turn (NewPlan plans afresh when not).
		if !pp.node.hold(pp.alloc) {
			p.collided = true
		}
		p.reindex(pp.node)
		if pp.node.reservedFor == id {
			p.unhold(pp.node, plan)
		}
		p.usage.addAllocation(pp.alloc)
		p.teams.placedPinned(pp.alloc) // teams.go
	}
}
