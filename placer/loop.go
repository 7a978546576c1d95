package placer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/internal/rendezvous"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// The pass loop: wait for a change (or the tick), take a snapshot of the
// caches, plan, commit this placer's share, and decide whether to plan again
// at once or rest.

// loop runs passes, driven by cache events and a ticker.
func (p *Placer) loop(ctx context.Context) error {
	// The team tree and teams' decayed usage order the queue too: a first
	// pass without them would place by an order no later pass (nor the
	// API's queue view) agrees with. The owners' run times shape holds
	// and drains: a first pass without them would plan nodes to empty
	// later than the next pass does.
	caches := []interface{ WaitSynced(context.Context) error }{p.pending, p.nodes, p.ledgers, p.cordons, p.quotas, p.placers, p.warnings}
	if p.teams != nil {
		caches = append(caches, p.teams)
	}
	if p.usage != nil {
		caches = append(caches, p.usage)
	}
	if p.runtimes != nil {
		caches = append(caches, p.runtimes)
	}
	for _, c := range caches {
		if err := c.WaitSynced(ctx); err != nil {
			// A shared cache (Config.Shared) runs under another
			// component's context: on a shutdown it can stop before
			// ctx here is cancelled, and it says so with its context's
			// error. That is the same shutdown, not a failure.
			if ctx.Err() != nil || errors.Is(err, context.Canceled) {
				return nil
			}
			return fmt.Errorf("sync placer caches: %w", err)
		}
	}
	p.log.Debug("placer caches synced", "pending", p.pending.Len(), "nodes", p.nodes.Len())
	close(p.ready)
	if p.cfg.start != nil {
		select {
		case <-p.cfg.start:
		case <-ctx.Done():
			return nil
		}
	}
	tick := time.NewTicker(p.cfg.Tick)
	defer tick.Stop()
	var (
		bindRev, ledgerRev int64 // our writes: wait for the caches to see them
		failures           int
		// When a pass's advice was last offered: as if at the start, so
		// that the first passes of a burst do not explain either (each
		// of three placers wrote its StatusBudget of statuses after its
		// first pass, beside the others' binds).
		advised = time.Now()
	)
	for {
		// Own binds are laid over the caches (ownWrites): wait for the
		// caches to show them only when a quota check needs ledgers that
		// new (it reads LedgersAt, the cache's own revision).
		waitBind := int64(0)
		if p.quotaStale.Swap(0) > 0 {
			waitBind = bindRev
		}
		if err := p.catchUp(ctx, waitBind, ledgerRev); err != nil {
			return nil
		}
		// Every change delivered before the snapshot is in it (a cache
		// publishes before it delivers): only later ones call for
		// another pass.
		p.delivered.Lock()
		clear(p.delivered.revs)
		clear(p.delivered.taken)
		p.delivered.Unlock()
		started := time.Now()
		res := p.pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		select {
		case <-p.passed:
		default:
			close(p.passed)
		}
		// Tick counts from the end of this pass: a tick that fell during
		// a long pass would start the next one at once.
		tick.Reset(p.cfg.Tick)
		took := time.Since(started)
		bindRev, ledgerRev = max(bindRev, res.bindRev), max(ledgerRev, res.ledgerRev)
		busy := res.bound > 0 || res.ledgerRev > 0 || res.conflicts > 0 // the loop plans again at once
		if res.advice != nil && (!busy || time.Since(advised) >= adviseEvery) {
			// Explaining runs beside binding, in its own goroutine with
			// its own deadline: a slow status write never holds up the
			// next bind.
			p.offer(*res.advice)
			advised = time.Now()
		}
		switch {
		case res.conflicts > 0 && res.bound == 0:
			// Refresh and retry at once, a bounded number of times, then
			// back off: another placer is moving the same state.
			failures++
			if failures > 8 {
				if !ctxwait.Sleep(ctx, min(time.Duration(failures)*10*time.Millisecond, time.Second)) {
					return nil
				}
			}
			continue
		case res.bound > 0 && res.ledgerRev == 0 && res.conflicts == 0 && !res.deferred && len(res.others) == 0:
			// The pass bound its whole plan, as planned: nothing else
			// fits the state it planned on, which its binds, laid over
			// the caches, now show. Planning again before something
			// else changes would bind nothing, on the cores that
			// deliver those binds.
			failures = 0
			if !p.awaitChange(ctx, tick.C, nil) {
				return nil
			}
			continue
		case res.bound > 0 || res.ledgerRev > 0:
			// Bound sessions or cleared a lost node: more may fit, plan
			// again on the fresh state. Deferred decisions alone are no
			// progress: planning again at once would plan them again.
			failures = 0
			if res.conflicts == 0 && !res.deferred && len(res.others) > 0 {
				// All of this placer's share is bound; the rest of the
				// plan is other placers' to commit, from the same
				// snapshot. Planning again before the caches show their
				// binds would plan those sessions again, for nothing,
				// on the cores they commit with.
				planned := sessionsOf(res.others)
				all, ok := p.awaitOthers(ctx, res.others, min(max(2*took, 50*time.Millisecond), p.cfg.Tick))
				if !ok {
					return nil
				}
				// Their binds shown, the whole plan is bound: as when a
				// placer binds the whole of it alone, planning again is
				// for a change that is not one of the plan's binds.
				if all && !p.awaitChange(ctx, tick.C, planned) {
					return nil
				}
			}
			continue
		}
		failures = 0
		// A pass that left the whole plan to other placers waits, as
		// one that bound its share does, for a change that is not one
		// of the plan's binds.
		var planned map[string]bool
		if res.conflicts == 0 && !res.deferred {
			planned = sessionsOf(res.others)
		}
		if !p.awaitChange(ctx, tick.C, planned) {
			return nil
		}
		// A pass that bound nothing is followed by at least as much rest
		// as it took: while other placers commit, every event would kick
		// another full plan, and planning would crowd out the commits.
		if rest := took - time.Since(started.Add(took)); rest > 0 {
			if !ctxwait.Sleep(ctx, rest) {
				return nil
			}
		}
	}
}

// awaitChange waits until the caches have delivered a change since the
// newest pass began that is not one of the plan's binds, or until tick. It
// returns false when ctx ends. The plan's binds are this placer's own
// transactions and, with planned (the ids of the plan's sessions that
// other placers bind), every change at a revision that took one of
// them off the queue or put it on a node: another placer's bind of its
// share (each cache notes what it sees of the transaction, whichever
// delivers it first). A cancel of such a session counts as a bind, and the
// next change or tick plans its devices. This placer forgets a bind's
// revision once both caches show it (ownWrites.overlay, at a snapshot): an
// event of it delivered later counts as a change, one pass more that binds
// nothing.
func (p *Placer) awaitChange(ctx context.Context, tick <-chan time.Time, planned map[string]bool) bool {
	for {
		p.delivered.Lock()
		foreign := false
		for rev := range p.delivered.revs {
			bind := p.own.isOwn(rev)
			for _, id := range p.delivered.taken[rev] {
				bind = bind || planned[id]
			}
			if !bind {
				foreign = true
				break
			}
			delete(p.delivered.revs, rev)
			delete(p.delivered.taken, rev)
		}
		p.delivered.Unlock()
		if foreign {
			return true
		}
		p.idle.Store(true)
		select {
		case <-ctx.Done():
			return false
		case <-p.changed:
			p.idle.Store(false)
		case <-tick:
			p.idle.Store(false)
			return true
		}
	}
}

// sessionsOf returns the session ids of ps.
func sessionsOf(ps []Pending) map[string]bool {
	ids := make(map[string]bool, len(ps))
	for _, o := range ps {
		ids[o.Entry.Session] = true
	}
	return ids
}

// awaitOthers waits until the pending cache no longer holds any of others
// at the revision planned (another placer bound it, or it changed): all is
// true; or for at most wait: all is false. ok is false when ctx ends.
func (p *Placer) awaitOthers(ctx context.Context, others []Pending, wait time.Duration) (all, ok bool) {
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	// The sessions' queue keys, built once: every event the caches
	// deliver wakes this loop, and a burst delivers hundreds.
	type waiting struct {
		key string
		rev int64
	}
	left := make([]waiting, len(others))
	for i, o := range others {
		left[i] = waiting{p.cfg.Keys.Pending(o.Entry.Session), o.Revision}
	}
	seen := int64(-1) // the pending cache's revision last looked at
	for {
		if snap := p.pending.Snapshot(); snap.Revision() != seen {
			seen = snap.Revision()
			kept := left[:0]
			for _, w := range left {
				if it, ok := snap.Item(w.key); ok && it.ModRevision == w.rev {
					kept = append(kept, w)
				}
			}
			if left = kept; len(left) == 0 {
				return true, true
			}
		}
		select {
		case <-ctx.Done():
			return false, false
		case <-deadline.C:
			return false, true
		case <-p.kick:
		}
	}
}

// catchUp waits until the caches have seen this placer's own writes (binds
// reach pending/ and ledger/, lost-node clean-ups ledger/): the bind
// revision it is given only when a quota check needs the caches themselves
// to show the binds, since snapshots lay own binds over the caches.
func (p *Placer) catchUp(ctx context.Context, bindRev, ledgerRev int64) error {
	if p.pending.Revision() >= bindRev && p.ledgers.Revision() >= max(bindRev, ledgerRev) {
		return nil
	}
	deadline := time.NewTimer(5 * time.Second)
	defer deadline.Stop()
	for p.pending.Revision() < bindRev || p.ledgers.Revision() < max(bindRev, ledgerRev) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-deadline.C:
			p.log.Warn("caches lag behind our writes; planning anyway", "bind_rev", bindRev, "ledger_rev", ledgerRev, "pending", p.pending.Revision(), "ledgers", p.ledgers.Revision())
			return nil
		case <-p.kick:
		}
	}
	return nil
}

// snapshot reads the caches into one planning snapshot.
func (p *Placer) snapshot() *Snapshot {
	c := Caches{
		Nodes: p.nodes.Snapshot(), Ledgers: p.ledgers.Snapshot(), Cordons: p.cordons.Snapshot(),
		Quotas: p.quotas.Snapshot(), Pending: p.pending.Snapshot(), Warnings: p.warnings.Snapshot(),
		Teams: p.teams.Snapshot(),
	}
	s := SnapshotOf(p.cfg.Keys, c, p.cfg.Now())
	if p.usage != nil {
		s.TeamUsage = p.decay.of(p.usage.Snapshot(), s.Now, p.cfg.UsageHalfLife) // teams.go
	}
	if p.runtimes != nil {
		s.Runtimes = p.runtimeRecords()
	}
	p.own.overlay(s, c.Ledgers.Revision(), c.Pending.Revision())
	dropBound(s)
	// Read after the caches: a release they do not show yet only ends
	// the epoch a pass early.
	s.Freed = p.freed.Load()
	PinEpoch(s, p.doneEpoch.Load(), max(c.Pending.Revision(), c.Ledgers.Revision(), c.Nodes.Revision(), p.lastBind.Load()))
	s.Cache = p.planCache
	return s
}

// runtimeRecords is Snapshot.Runtimes: each owner's record in the runtimes
// cache, by owner. The map is built again only when the cache's revision
// moved since the last pass (a record written, or etcd's progress), so a
// pass at 10,000 owners whose records did not change builds nothing. The
// map and the records are shared between passes and with the cache
// (RuntimesOf): read them, never change them. Only the
// loop calls it.
func (p *Placer) runtimeRecords() map[string]*state.RuntimeRecord {
	snap := p.runtimes.Snapshot()
	if p.runtimesMap != nil && snap.Revision() == p.runtimesRev {
		return p.runtimesMap
	}
	p.runtimesRev, p.runtimesMap = snap.Revision(), RuntimesOf(p.cfg.Keys, snap)
	return p.runtimesMap
}

// takesOff reports whether ev took an allocation off a ledger: the ledger
// deleted, or a session it listed gone from it.
func takesOff(ev watcher.Event[state.Ledger]) bool {
	switch {
	case ev.Type == watcher.Deleted:
		return len(ev.Value.Allocations) > 0
	case ev.Prev == nil:
		return false
	}
	for id := range ev.Prev.Allocations {
		if _, ok := ev.Value.Allocations[id]; !ok {
			return true
		}
	}
	return false
}

// dropBound takes off s's queue every session that a ledger of s, written
// after the session's queue entry, already holds: another placer's bind
// whose ledger write the ledgers cache shows while the pending cache does
// not show its deletion yet (two watches, each at its own revision). Left
// in, the session would be planned a second time, and this placer's plan
// would part from the others' (which do not see it queued): the bind that
// comes of it conflicts. A session re-queued after its allocation was
// written keeps its place; one held back waits for the next pass.
func dropBound(s *Snapshot) {
	var held map[string]int64 // session → the newest ledger revision listing it
	for i := range s.Nodes {
		v := &s.Nodes[i]
		for id := range v.Ledger.Allocations {
			if held == nil {
				held = map[string]int64{}
			}
			held[id] = max(held[id], v.LedgerRevision)
		}
	}
	if len(held) == 0 {
		return
	}
	kept := s.Pending[:0]
	for _, it := range s.Pending {
		if rev, ok := held[it.Entry.Session]; !ok || rev <= it.Revision {
			kept = append(kept, it)
		}
	}
	s.Pending = kept
}

type passResult struct {
	bound, conflicts int
	// bindRev is the highest revision of a bind transaction (which writes
	// pending/ and ledger/), ledgerRev of a lost-node one (ledger/ only):
	// the next pass waits for the caches to reach them.
	bindRev, ledgerRev int64
	// deferred: decisions of this placer were left for the next pass.
	deferred bool
	// others are the pending keys of the plan's decisions that other
	// placers commit, as read.
	others []Pending
	// advice is what the pass leaves to explain (nil: nothing planned).
	advice *advice
}

// adviseEvery is the longest a placer that keeps binding goes without
// handing its newest plan to the advisory writer. While passes bind one
// after the other (a burst), each pass's explanation would be replaced by
// the next one's within moments, and its status writes would compete with
// the binds, on etcd and on this placer's cores: a pass explains when the
// placer is about to rest, or when it last explained this long ago.
const adviseEvery = time.Second

// pass plans once and commits this placer's share.
func (p *Placer) pass(ctx context.Context) passResult {
	if p.stands() {
		return passResult{}
	}
	p.passes.Add(1)
	snapStart := time.Now()
	snap := p.snapshot()
	snapTook := time.Since(snapStart)
	var res passResult
	if rev := p.handleLost(ctx, snap); rev > 0 {
		// Plan on ledgers that show the cleared nodes.
		res.ledgerRev = rev
		return res
	}
	if len(snap.Pending) == 0 {
		return res
	}
	ids := []string{p.cfg.ID} // the active placer owns every node
	if p.cfg.Sharded {
		ids = p.owners()
	}
	mine := func(d *Decision) bool { return len(ids) == 1 || rendezvous.Owner(ids, d.Parts[0].Node) == p.cfg.ID }
	nodes := make(map[string]*NodeView, len(snap.Nodes))
	for i := range snap.Nodes {
		nodes[snap.Nodes[i].Node.Name] = &snap.Nodes[i]
	}
	c := p.newCommitter(ctx, nodes, snap, &res)
	// A plan that plans no epoch again is final as it is made: a placer
	// alone commits its decisions as they come (streamer), while the rest
	// of the queue is planned. One that does (pinned sessions) may be
	// planned again (NewPlan), and is committed once made. Beside other
	// placers a placer commits once its plan is made too: they plan the
	// same queue, each on its own snapshot, and agree only while no bind
	// of the plan reaches a snapshot taken for it; a first bind sent while
	// planning would reach the others' about a plan's time sooner (with
	// two placers, one more pass in about 15 runs of
	// TestOthersBindsCallForNoPass).
	st := p.newStreamer(c)
	planStart := time.Now()
	var (
		plan     *Plan
		streamed bool
	)
	if len(ids) == 1 { // alone: every decision is this placer's
		plan, streamed = planEmitting(snap, p.cfg.Plan, st.offer)
	}
	if !streamed {
		plan = NewPlan(snap, p.cfg.Plan)
		// The epoch the plan's binds record (a streamed plan's is the
		// snapshot's, read by its batches as they commit).
		snap.Epoch = plan.Epoch
	}
	planTook := time.Since(planStart)
	if len(plan.Bound) == 0 {
		// The epoch's plan is bound (or binds nothing): the next change
		// starts a new epoch.
		p.doneEpoch.Store(max(p.doneEpoch.Load(), snap.Epoch))
	}
	var (
		unfit []Decision
		ds    []Decision // this placer's share, when not streamed
	)
	n := 0
	for i := range plan.Bound {
		if d := &plan.Bound[i]; !mine(d) {
			res.others = append(res.others, *d.Pending)
			continue
		}
		n++
		if !streamed {
			ds = append(ds, plan.Bound[i])
		}
	}
	if streamed {
		st.end()
		unfit = st.unfit
	} else {
		var batches []*bindBatch
		batches, res.deferred, unfit = p.batch(ds, nodes, snap)
		for _, b := range batches {
			c.send(b, nil)
		}
	}
	commitStart := time.Now()
	c.wait()
	commitTook := time.Since(commitStart)
	res.advice = &advice{plan: plan, owners: ids, unfit: unfit}
	p.log.Debug("pass", "pending", len(snap.Pending), "planned", len(plan.Bound), "mine", n,
		"streamed", streamed, "batches", c.sent, "chained", st.chains, "bound", res.bound, "conflicts", res.conflicts,
		"deferred", res.deferred, "unfit", len(unfit), "snapshot", snapTook, "plan", planTook, "commit_after_plan", commitTook)
	return res
}
