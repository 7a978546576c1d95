package state

import (
	"fmt"
	"time"
)

// ReasonResized is the eviction, warning and status reason of an elastic
// job stopped to run again at another size: it waits, with no queue
// entry, to be re-queued at Elastic.Size (EventResize).
const ReasonResized = "Resized"

// Elastic asks that a batch job run at any size from Min to Max GPUs on
// one machine, or (MinNodes, MaxNodes) on any number of machines from
// MinNodes to MaxNodes (Session.Elastic, copied into its queue entry), and
// says where it stands (Status.Elastic). For a range of GPUs
// Resources.GPUs holds Min: what admission checks a node can hold and what
// the job needs at the least. For a range of machines Resources is each
// machine's part and Session.Nodes holds MaxNodes: the job is a multi-node
// job (Session.Gang) whose current attempt runs on JobNodes of them. The
// placer starts it at the largest size fair share allows, at least its
// minimum; the lifecycle controller grows it when GPUs (or whole machines)
// sit idle and shrinks it when waiting work is owed them, each resize a
// restart at the new size (placer/elastic.go, placer/elastic_nodes.go,
// lifecycle/elastic.go).
type Elastic struct {
	// Min and Max bound the job's GPUs: 1 ≤ Min < Max. Zero for a range
	// of machines.
	Min int `json:"min,omitempty"`
	Max int `json:"max,omitempty"`
	// MinNodes and MaxNodes bound the job's machines, one part on each:
	// 1 ≤ MinNodes < MaxNodes. Zero for a range of GPUs.
	MinNodes int `json:"minNodes,omitempty"`
	MaxNodes int `json:"maxNodes,omitempty"`
	// Size is, for a range of GPUs, in a spec and a queue entry, the size
	// the last resize asked for (0: none yet, the placer chooses), a cap
	// on the size the job is bound at next; in a status, the size it is
	// bound at now. For a range of machines it is set in a status only:
	// the GPUs of all its parts (what accounting and the checker count).
	Size int `json:"size,omitempty"`
	// Nodes is, for a range of machines, what Size is for a range of
	// GPUs: in a spec and a queue entry the machines the last resize asked
	// for (a cap; 0: none yet), in a status the machines it is bound at.
	Nodes int `json:"nodes,omitempty"`
	// On is, for a range of GPUs, in a spec and a queue entry, the node
	// the last resize was decided on: until the job is bound again (or
	// its resize interval after Resized passes) the lifecycle controller
	// keeps room there for it at Size, and no other elastic job grows
	// into it (lifecycle/elastic.go, placer/elastic_claims.go).
	On string `json:"on,omitempty"`
	// Resizes counts the resizes so far.
	Resizes int `json:"resizes,omitempty"`
	// Resized is when the last resize was decided: the next waits
	// VOYAGER_ELASTIC_RESIZE_INTERVAL after it.
	Resized *time.Time `json:"resized,omitempty"`
	// Why says the last resize's cause in plain words.
	Why string `json:"why,omitempty"`
	// Goodput is, in a status, the job's latest goodput report at each
	// size it ran at (GoodputReport, folded in from its activity); a
	// resize carries it into the spec and the queue entry, so the status
	// of the next size starts with it.
	Goodput []GoodputSample `json:"goodput,omitempty"`
}

// ByNodes reports whether the range is one of machines (MinNodes to
// MaxNodes), not of GPUs.
func (e *Elastic) ByNodes() bool { return e.MaxNodes > 0 }

// Bounds is the range in its unit: MinNodes and MaxNodes for a range of
// machines, else Min and Max.
func (e *Elastic) Bounds() (lo, hi int) {
	if e.ByNodes() {
		return e.MinNodes, e.MaxNodes
	}
	return e.Min, e.Max
}

// Current is the size in its unit: Nodes for a range of machines, else
// Size.
func (e *Elastic) Current() int {
	if e.ByNodes() {
		return e.Nodes
	}
	return e.Size
}

// NodeCap is the most machines a range of machines may be bound at now:
// MaxNodes, or the count the last resize asked for.
func (e *Elastic) NodeCap() int {
	if e.Nodes >= e.MinNodes && e.Nodes > 0 && e.Nodes < e.MaxNodes {
		return e.Nodes
	}
	return e.MaxNodes
}

// Cap is the most GPUs the job may be bound at now: Max, or the size the
// last resize asked for.
func (e *Elastic) Cap() int {
	if e.Size >= e.Min && e.Size > 0 && e.Size < e.Max {
		return e.Size
	}
	return e.Max
}

// MayResize reports whether the rate limit lets the job resize at now:
// at least interval since the last resize.
func (e *Elastic) MayResize(now time.Time, interval time.Duration) bool {
	return e.Resized == nil || !now.Before(e.Resized.Add(interval))
}

// Resizing reports whether the spec carries the eviction of a resize:
// its agents stop it to run again at Elastic.Size.
func (s Session) Resizing() bool {
	return s.Eviction != nil && s.Eviction.Reason == ReasonResized && s.Eviction.Requeue && s.Elastic != nil
}

// Range renders the job's size, in its unit, as "2 of 2-8 GPUs" (size
// 0: "2-8 GPUs"), or "2 of 1-3 nodes" for a range of machines.
func (e *Elastic) Range(size int) string {
	if e.ByNodes() {
		if size <= 0 {
			return fmt.Sprintf("%d-%d nodes", e.MinNodes, e.MaxNodes)
		}
		return fmt.Sprintf("%d of %d-%d nodes", size, e.MinNodes, e.MaxNodes)
	}
	if size <= 0 {
		return fmt.Sprintf("%d-%d GPUs", e.Min, e.Max)
	}
	return fmt.Sprintf("%d of %d-%d GPUs", size, e.Min, e.Max)
}

// ElasticSize is the size an elastic job's attempt was bound at, as its
// status says (0: not elastic, or no status).
func ElasticSize(st *Status) int {
	if st == nil || st.Elastic == nil {
		return 0
	}
	return st.Elastic.Size
}

// AttemptGPUs is the GPUs one attempt of s held: an elastic job's size
// (size, from ElasticSize of the attempt's status) when it has one, else
// SessionGPUs. Accounting counts each size's GPU-hours so.
func AttemptGPUs(s Session, size int) int {
	if s.Elastic != nil && size > 0 {
		return size
	}
	return SessionGPUs(s)
}

// JobNodes is how many parts the current attempt of multi-node job s
// has: Nodes, or, for a range of machines, the count its status st was
// bound at (MaxNodes while it has none).
func (s Session) JobNodes(st Status) int {
	if s.Elastic != nil && s.Elastic.ByNodes() && st.Elastic != nil && st.Elastic.Nodes > 0 {
		return st.Elastic.Nodes
	}
	return s.Nodes
}
