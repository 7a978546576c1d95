package history

import (
	"fmt"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// The launch rule, launched-twice: the launches agents record on their
// parts (state.Launch sets PartStatus.Launched once per binding, before
// the container is created) name each attempt's starts. An attempt (a
// session's queueing, on one node) starts once: a second launch under
// another binding, or again under the same binding after its container
// had reported running, is a second run; so is a launch recorded while
// its binding is not the node's live binding, or while the session's
// status is not live for that queueing.

// forgetLaunches forgets session id's launches once its status is gone
// and nothing of it is bound: a part written later for a binding that
// outlived the status (an agent cut off while retention retired the
// session, then releasing) still carries its recorded launch, which must
// not count as a new one.
func (c *Checker) forgetLaunches(id string) {
	if _, ok := c.statuses[id]; ok {
		return
	}
	for _, bits := range c.holds[id] {
		if bits&1 != 0 {
			return
		}
	}
	delete(c.launches, id)
}

// launchKey is one attempt's part: a session's queueing (and attempt) on
// one node.
type launchKey struct {
	node          string
	queueRevision int64
	attempt       int
}

// launchRecord is the launch the history last recorded for an attempt's
// part, and whether its container has been reported running since.
type launchRecord struct {
	bindingRev int64
	at         time.Time
	started    bool
}

// notePart records what part write p (of session id on node) says of its
// attempt's launch, and returns whether it records a new launch (Launched
// set, and not the launch already recorded for this attempt's part) and
// why that launch is a second one ("" if it is not).
func (c *Checker) notePart(node, id string, p state.PartStatus) (launch bool, twice string) {
	if p.Launched == nil {
		return false, ""
	}
	key := launchKey{node: node, queueRevision: p.QueueRevision, attempt: p.Attempt}
	recs := c.launches[id]
	if recs == nil {
		recs = map[launchKey]launchRecord{}
		c.launches[id] = recs
	}
	rec, seen := recs[key]
	same := seen && rec.at.Equal(*p.Launched) && rec.bindingRev == p.BindingRevision
	started := p.Started != nil || p.Phase == state.PhaseRunning || same && rec.started
	switch {
	case same:
	case !seen:
		launch = true
	case rec.bindingRev != p.BindingRevision:
		launch = true
		twice = fmt.Sprintf("attempt %d of %s (queueing of revision %d) launched on %s under the binding of revision %d at %s and again under the binding of revision %d at %s",
			p.Attempt, id, p.QueueRevision, node, rec.bindingRev, rec.at.Format(time.RFC3339Nano), p.BindingRevision, p.Launched.Format(time.RFC3339Nano))
	case rec.started:
		launch = true
		twice = fmt.Sprintf("attempt %d of %s launched on %s again at %s, after its container launched at %s had run",
			p.Attempt, id, node, p.Launched.Format(time.RFC3339Nano), rec.at.Format(time.RFC3339Nano))
	default:
		// Launched again under the same binding before anything ran: its
		// agent found the container created and never started (Launch
		// with again), which is legal.
		launch = true
	}
	recs[key] = launchRecord{bindingRev: p.BindingRevision, at: *p.Launched, started: started}
	return launch, twice
}

// launchNotLive says why part write w, which records a launch, launched
// an attempt that was not live once its whole revision was applied ("" if
// it was): its node does not hold its binding, or the session's status is
// missing, ended, waiting to be queued, or of another queueing.
func (c *Checker) launchNotLive(w partWrite) string {
	cur, bound := c.bindings[w.node][w.id]
	switch {
	case !bound || cur != 0 && cur != w.p.BindingRevision:
		return fmt.Sprintf("launch of %s on %s for the binding of revision %d, which %s does not hold", w.id, w.node, w.p.BindingRevision, w.node)
	}
	st, ok := c.statuses[w.id]
	switch {
	case !ok:
		return fmt.Sprintf("launch of %s on %s, whose status is gone", w.id, w.node)
	case st.Phase.Terminal() || st.Phase == state.PhasePending:
		return fmt.Sprintf("launch of %s on %s while its status is %s", w.id, w.node, st.Phase)
	case st.QueueRevision != 0 && w.p.QueueRevision != 0 && st.QueueRevision != w.p.QueueRevision:
		return fmt.Sprintf("launch of %s on %s for the queueing of revision %d while its status is of the queueing of revision %d", w.id, w.node, w.p.QueueRevision, st.QueueRevision)
	}
	return ""
}
