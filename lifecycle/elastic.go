package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// Elastic jobs are resized by the rules the controller already applies to
// a preemption, with the planner's decision (placer.PlanElastic):
//
//  1. resize warns the job (warnings/<id>, reason Resized, the new size):
//     a transaction that compares the spec (its rate limit), the job's
//     node's ledger (its size and the idle GPUs) and, for a shrink, the
//     waiting session's queue entry, all as the decision read them;
//  2. at the warning's StopAt (now + ResizeNotice) evict writes the
//     eviction (Requeue) with the new size into the spec's Elastic.Size;
//     a shrink's warning stands only while its waiter still waits;
//  3. the job's agents stop it as for a preemption: SIGTERM, the stop
//     grace to checkpoint, then the release, Pending with reason Resized
//     (state.EventResize);
//  4. requeue queues it again with its cap at the new size, and the placer
//     binds it at the largest size up to that cap that fits, with the new
//     WORLD_SIZE and VOYAGER_GPUS.
//
// Resizes of one job are at least ResizeInterval apart (Elastic.Resized).

// resize plans resizes of the running elastic jobs and warns them. It
// records in v the elastic jobs (never preemption victims) and the
// waiting sessions a shrink serves or will serve once its job's rate
// limit passes (they wait for it rather than preempt fixed-size work).
func (c *Controller) resize(ctx context.Context, v *view) error {
	k := c.cfg.Keys
	v.elastic, v.owed = map[string]bool{}, map[string]bool{}
	jobs := map[string]placer.ElasticJob{}
	specRevs := map[string]int64{}
	// between: elastic jobs between two binds, as the caches show them,
	// with no claim counted (their specs' revisions): a grow compares them.
	between := map[string]int64{}
	v.sessions.Range(func(it watcher.Item[specView]) bool {
		el := it.Value.elastic
		if el == nil {
			return true // the cheap test first: a pass over 100,000 fixed-size sessions does nothing more
		}
		id, ok := k.SessionID(it.Key)
		if !ok {
			return true
		}
		if len(v.holds[id]) == 0 {
			if j, ok := c.resizeClaim(v, id, it.Value); ok {
				jobs[id], specRevs[id] = j, it.ModRevision
			} else if c.betweenBinds(v, id, it.Value) {
				between[id] = it.ModRevision
			}
			return true
		}
		j := placer.ElasticJob{Session: id, Min: el.Min, Max: el.Max}
		if el.ByNodes() && it.Value.part != nil {
			j.Min, j.Max, j.Nodes, j.Part = el.MinNodes, el.MaxNodes, true, *it.Value.part
		}
		w, hasW := v.warnings.Get(k.Warning(id))
		st, hasSt := v.statuses.Get(k.Status(id))
		j.Goodput = st.goodput
		switch {
		case hasW && w.Reason == state.ReasonResized:
			// Its claim too: should no ledger of the plan's show it, it
			// still counts on its node at its target (addClaims).
			j.Target, j.Claim = w.Size, w.Node
			if w.By != "" {
				v.owed[w.By] = true
			}
		case it.Value.stopping():
			return true // stopping for another reason: its room is freed
		case hasW:
			// Warned of another stop (max runtime): not resized meanwhile.
		default:
			j.Ready = hasSt && st.running && el.MayResize(v.now, c.cfg.ResizeInterval)
		}
		jobs[id] = j
		specRevs[id] = it.ModRevision
		v.elastic[id] = true
		return true
	})
	if len(jobs) == 0 {
		return nil
	}
	snap := placer.SnapshotOf(k, placer.Caches{
		Nodes: c.nodes.Snapshot(), Ledgers: v.ledgers, Cordons: v.cordons,
		Quotas: c.quotas.Snapshot(), Pending: v.pending, Warnings: v.warnings,
	}, v.now)
	// Room that sessions being stopped are about to free serves waiters
	// without a shrink, but is not idle yet: no job grows into it.
	ledgerRevs := map[string]int64{}
	freeing := map[string]bool{}
	for i := range snap.Nodes {
		n := &snap.Nodes[i]
		ledgerRevs[n.Node.Name] = n.LedgerRevision
		for id := range n.Ledger.Allocations {
			if sp, ok := v.sessions.Get(k.Session(id)); ok && sp.stopping() && !v.elastic[id] {
				freeing[id] = true
			}
		}
	}
	plan := placer.NewPlan(snap, c.cfg.Plan)
	var errs []error
	for _, r := range placer.PlanElastic(snap, plan, jobs, placer.ElasticOptions{Freeing: freeing, Goodput: c.cfg.Goodput}) {
		if r.For != "" {
			v.owed[r.For] = true
		}
		if r.Deferred {
			continue
		}
		if err := c.warnResize(ctx, v, r, specRevs, ledgerRevs, between); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// warnResize writes r's warning if the job's warning is still absent, its
// spec at its revision in specRevs, its node's ledger (a range of
// machines: every ledger the decision read, r.Ledgers) at the revision in
// ledgerRevs, for a shrink its waiter's queue entry at the revision the
// plan read and, for a grow, the spec of every job whose claim on the node
// it counted (r.Claims) at its revision in specRevs and of every job
// between binds with no claim counted (between) at its revision there.
//
// The last is what keeps a grow out of room another job was promised when
// the caches disagree: each prefix has its own watch, so a pass can see a
// job's release and its warning's deletion (written after its eviction)
// but not yet the eviction in its spec, which names the node and size it
// claims. Such a job holds nothing and shows no resize, and another job
// would grow into its room; its spec moved since, the grow is refused.
//
// A transaction that would hold more operations than the placers' limit
// (Plan.MaxTxnOps, etcd's --max-txn-ops) is not sent: a grow waits for a
// pass with fewer jobs between binds, and a shrink over more machines
// than one transaction can compare is logged as a warning.
func (c *Controller) warnResize(ctx context.Context, v *view, r placer.Resize, specRevs, ledgerRevs, between map[string]int64) error {
	k := c.cfg.Keys
	stopAt := v.now.Add(c.cfg.ResizeNotice)
	unit := "GPUs"
	if r.Nodes {
		unit = "nodes"
	}
	w := state.Warning{Session: r.Session, Reason: state.ReasonResized, Issued: v.now, StopAt: stopAt, Node: r.Node, By: r.For, Size: r.To,
		Message: fmt.Sprintf("resize: it %s; it will be stopped at %s (SIGTERM, then its grace to checkpoint) and restarted at %d %s",
			r.Why, stopAt.Format(time.RFC3339), r.To, unit)}
	val, err := state.Encode(w)
	if err != nil {
		return fmt.Errorf("warn resize of %s: %w", r.Session, err)
	}
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(k.Warning(r.Session)), "=", 0),
		clientv3.Compare(clientv3.ModRevision(k.Session(r.Session)), "=", specRevs[r.Session]),
	}
	ledgers := r.Ledgers
	if len(ledgers) == 0 {
		ledgers = []string{r.Node}
	}
	for _, n := range ledgers {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Ledger(n)), "=", ledgerRevs[n]))
	}
	if r.For != "" {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Pending(r.For)), "=", r.ForRevision))
	}
	for _, id := range r.Claims {
		// A claim on the node: it stands as read, and its job is not
		// queued again unseen (resizeClaim).
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Session(id)), "=", specRevs[id]),
			clientv3.Compare(clientv3.CreateRevision(k.Pending(id)), "=", 0))
	}
	if r.To > r.From {
		for id, rev := range between {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Session(id)), "=", rev))
		}
	}
	then := []clientv3.Op{clientv3.OpPut(k.Warning(r.Session), val)}
	if err := (state.TxnBudget{MaxOps: c.cfg.Plan.MaxTxnOps}).Check(state.SizeOf(cmps, then, nil)); err != nil {
		if r.To > r.From {
			c.log.Debug("elastic grow deferred: too much to compare in one transaction", "session", r.Session, "between", len(between), "err", err)
		} else {
			c.log.Warn("elastic resize not planned: too much to compare in one transaction", "session", r.Session, "ledgers", len(ledgers), "err", err)
		}
		return nil
	}
	resp, err := c.cli.Txn(ctx).If(cmps...).Then(then...).Commit()
	if err != nil {
		return fmt.Errorf("warn resize of %s: %w", r.Session, err)
	}
	if !resp.Succeeded {
		c.conflicts.Add(1)
		return nil
	}
	c.warned.Add(1)
	c.log.Info("elastic job resize planned", "session", r.Session, "from", r.From, "to", r.To, "for", r.For, "stopAt", stopAt, "why", r.Why)
	return nil
}

// resizeClaim is the claim of elastic job id (spec s), which holds nothing
// on any ledger, on the node its last resize was decided on (placer
// .ElasticJob.Claim). While the resize is under way (the spec carries its
// eviction, or its warning stands) the job counts there at the size the
// resize asked for, so that no other job grows into that room before it
// binds again. Once it is queued again the plan places it; a view that
// shows the spec queued again but not yet its queue entry (the caches
// watch each prefix on its own) gives a claim of size 0, counted nowhere,
// that a grow on the node still compares: its spec as read and no queue
// entry (warnResize), so the grow is refused if the entry exists. ok is
// false when no resize of the job is under way: it never had one, it is
// queued, stopped or ended, or (not evicted) its resize interval since
// the last resize has passed. A job for which it is false while it is
// between binds is compared by every grow (warnResize), since the view
// may show its spec older than its release.
func (c *Controller) resizeClaim(v *view, id string, s specView) (placer.ElasticJob, bool) {
	k := c.cfg.Keys
	el := s.elastic
	j := placer.ElasticJob{Session: id, Min: el.Min, Max: el.Max, Claim: el.On,
		Owner: s.owner, Team: s.team, Groups: s.groups, Priority: s.priority}
	if el.ByNodes() || !c.betweenBinds(v, id, s) {
		return j, false
	}
	w, hasW := v.warnings.Get(k.Warning(id))
	switch {
	case hasW && w.Reason == state.ReasonResized && w.Node != "":
		j.Target, j.Claim = w.Size, w.Node
	case el.On == "":
		return j, false // never resized, as this view shows the spec
	case s.resizing:
		j.Target = el.Size
	case s.evicted || el.Resized == nil || !v.now.Before(el.Resized.Add(c.cfg.ResizeInterval)):
		return j, false // evicted for another reason, or long since
	}
	return j, true
}

// betweenBinds reports whether session id (spec s), which holds nothing
// on any ledger the view shows, is between two binds: neither stopped,
// queued nor ended.
func (c *Controller) betweenBinds(v *view, id string, s specView) bool {
	k := c.cfg.Keys
	if s.stopped {
		return false
	}
	if _, queued := v.pending.Get(k.Pending(id)); queued {
		return false
	}
	st, ok := v.statuses.Get(k.Status(id))
	return !ok || !st.terminal
}

// resizeStands is the warning a job warned of a resize keeps: a shrink's
// while the session it makes room for still waits, a grow's always.
func (c *Controller) resizeStands(v *view, w state.Warning) *state.Warning {
	if w.By != "" {
		if _, waiting := v.pending.Get(c.cfg.Keys.Pending(w.By)); !waiting {
			return nil
		}
	}
	return &w
}

// resizeSpec records the resize of w in spec s, whose eviction ev is being
// written: the size the job runs at next, when and why. It reports false,
// changing nothing, when s is not elastic or the size is out of its range.
func resizeSpec(s *state.Session, w state.Warning, ev *state.Eviction) bool {
	el := s.Elastic
	if el == nil {
		return false
	}
	if lo, hi := el.Bounds(); w.Size < lo || w.Size > hi {
		return false
	}
	at := ev.At
	next := *el
	next.Resizes, next.Resized, next.Why = el.Resizes+1, &at, w.Message
	if el.ByNodes() {
		next.Nodes = w.Size
		ev.Message = fmt.Sprintf("resized to %d nodes", w.Size)
	} else {
		next.Size, next.On = w.Size, w.Node
		ev.Message = fmt.Sprintf("resized to %d GPUs", w.Size)
	}
	s.Elastic = &next
	return true
}

// resizedMessage is the status message of a job queued again after a
// resize.
func resizedMessage(s state.Session) string {
	if s.Elastic == nil {
		return "re-queued after a resize"
	}
	if s.Elastic.ByNodes() {
		return fmt.Sprintf("re-queued to run on %d nodes (resize %d): %s", s.Elastic.Nodes, s.Elastic.Resizes, s.Elastic.Why)
	}
	msg := fmt.Sprintf("re-queued to run at %d GPUs (resize %d): %s", s.Elastic.Size, s.Elastic.Resizes, s.Elastic.Why)
	if s.Elastic.On != "" {
		msg += fmt.Sprintf("; its room on %s is kept for it until it binds again: no other elastic job grows into it", s.Elastic.On)
	}
	return msg
}
