package history

import (
	"fmt"
	"sort"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// The time-bound rules, no-progress and left-behind, and the holdings
// per session that left-behind reads.

// DefaultStuckAfter is how long, by the history's own clock (Checker
// SetStuckAfter), a session may go without progress, or keep a part after
// it ended, before the checker reports it.
const DefaultStuckAfter = 10 * time.Minute

// SetStuckAfter sets how long, by the history's own clock (the latest
// time written into a status, part, binding or node value), a session may
// stay Bound, Starting or Stopping, stay Running with nothing bound, wait
// past its retryAt, or keep a
// binding or allocation after it ended, before no-progress or
// left-behind reports it. Default DefaultStuckAfter.
func (c *Checker) SetStuckAfter(d time.Duration) { c.stuckAfter = d }

// tick advances the history's clock to t, if later.
func (c *Checker) tick(t time.Time) {
	if t.After(c.clock) {
		c.clock = t
	}
}

// hold sets or clears bit of session id's holdings on node.
func (c *Checker) hold(id, node string, bit uint8, on bool) {
	h := c.holds[id]
	if on {
		if h == nil {
			h = map[string]uint8{}
			c.holds[id] = h
		}
		h[node] |= bit
		return
	}
	if h == nil {
		return
	}
	if h[node] &^= bit; h[node] == 0 {
		delete(h, node)
	}
	if len(h) == 0 {
		delete(c.holds, id)
	}
}

// nodesOf lists, sorted, the nodes where session id has a binding or an
// allocation.
func (c *Checker) nodesOf(id string) []string {
	var out []string
	for n := range c.holds[id] {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// leftBehind describes session id's bindings or allocations that the
// transaction which ended or re-queued it left: one that re-queued it (a
// queue entry with a Pending status) or ended it for its node's loss
// (reason NodeLost) must take every part with it. A session that ended
// otherwise, or waits to run again, may keep parts while their agents
// stop them: it is recorded, and overdue reports it if it keeps them past
// the bound.
func (c *Checker) leftBehind(id string) string {
	st, has := c.statuses[id]
	held := len(c.holds[id]) > 0
	if !has || !held {
		delete(c.left, id)
		return ""
	}
	switch {
	case st.Phase == state.PhasePending && c.pending[id]:
		delete(c.left, id)
		return fmt.Sprintf("%s was re-queued (attempt %d) and still holds a binding or allocation on %v", id, st.Attempt, c.nodesOf(id))
	case st.Phase.Terminal() && st.Reason == "NodeLost":
		delete(c.left, id)
		return fmt.Sprintf("%s ended %s for a lost node and still holds a binding or allocation on %v", id, st.Phase, c.nodesOf(id))
	case st.Phase.Terminal() || st.Phase == state.PhasePending:
		if _, ok := c.left[id]; !ok {
			c.left[id] = c.clock
		}
	default:
		delete(c.left, id)
	}
	return ""
}

// progress records what session id, whose status became st (from old,
// when existed), must do next by when: a phase of Bound, Starting or
// Stopping must change, a waiting session must be re-queued after its
// retryAt.
func (c *Checker) progress(id string, st, old state.Status, existed bool) {
	switch {
	case st.Phase == state.PhaseBound || st.Phase == state.PhaseStarting || st.Phase == state.PhaseStopping:
		if existed && old.Phase == st.Phase {
			if _, ok := c.due[id]; ok {
				return // the same phase: the bound runs from its start
			}
		}
		since := st.Updated
		if since.IsZero() {
			since = c.clock
		}
		c.due[id] = dueView{since: since, what: "in phase " + string(st.Phase)}
	case st.Waiting():
		c.due[id] = dueView{since: *st.RetryAt, what: "waiting to be re-queued after its retryAt"}
	default:
		delete(c.due, id)
	}
}

// unboundWhat is the no-progress reason of a Running session that holds
// nothing.
const unboundWhat = "Running with no binding or allocation left"

// runningUnbound records, when session id's status says Running while it
// holds no binding and no allocation, that its status must change within
// the bound: its parts were released (or its node lost), so a status left
// Running is one the merger failed to end. It clears the record once the
// session holds something again or its phase changes.
func (c *Checker) runningUnbound(id string) {
	st, ok := c.statuses[id]
	d, due := c.due[id]
	switch {
	case ok && st.Phase == state.PhaseRunning && len(c.holds[id]) == 0:
		if !due {
			c.due[id] = dueView{since: c.clock, what: unboundWhat}
		}
	case due && d.what == unboundWhat:
		delete(c.due, id)
	}
}

// overdue returns, as [session, rule, detail], each session whose bound
// passed by the history's clock: no progress (due) or parts kept after it
// ended (left); each is reported once.
func (c *Checker) overdue() [][3]string {
	var out [][3]string
	for id, d := range c.due {
		if d.since.IsZero() { // recorded before the clock read any time
			d.since = c.clock
			c.due[id] = d
			continue
		}
		if c.clock.Sub(d.since) > c.stuckAfter {
			out = append(out, [3]string{id, RuleStuck, fmt.Sprintf("%s %s since %s, past the bound of %s (the history's clock is at %s)",
				id, d.what, d.since.Format(time.RFC3339), c.stuckAfter, c.clock.Format(time.RFC3339))})
			delete(c.due, id)
		}
	}
	for id, since := range c.left {
		if since.IsZero() {
			c.left[id] = c.clock
			continue
		}
		if c.clock.Sub(since) > c.stuckAfter {
			out = append(out, [3]string{id, RuleLeftBehind, fmt.Sprintf("%s ended (%s) at %s and still holds a binding or allocation on %v past the bound of %s",
				id, c.statuses[id].Phase, since.Format(time.RFC3339), c.nodesOf(id), c.stuckAfter)})
			delete(c.left, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] || out[i][0] == out[j][0] && out[i][1] < out[j][1] })
	return out
}
