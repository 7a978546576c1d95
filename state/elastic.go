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
// one machine (Session.Elastic, copied into its queue entry), and says
// where it stands (Status.Elastic). Resources.GPUs holds Min: what
// admission checks a node can hold and what the job needs at the least.
// The placer starts it at the largest size fair share allows, at least
// Min; the lifecycle controller grows it when GPUs sit idle and shrinks it
// when waiting work is owed them, each resize a restart at the new size
// (placer/elastic.go, lifecycle/elastic.go).
type Elastic struct {
	// Min and Max bound the job's GPUs: 1 ≤ Min < Max.
	Min int `json:"min"`
	Max int `json:"max"`
	// Size is, in a spec and a queue entry, the size the last resize asked
	// for (0: none yet, the placer chooses), a cap on the size the job is
	// bound at next; in a status, the size it is bound at now.
	Size int `json:"size,omitempty"`
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

// Range renders the job's size as "2 of 2-8 GPUs" (size 0: "2-8 GPUs").
func (e *Elastic) Range(size int) string {
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
