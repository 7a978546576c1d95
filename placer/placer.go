package placer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// Config configures a Placer. Zero fields take the documented defaults.
type Config struct {
	// ID names this placer in placers/<id> and in bindings. Default:
	// "placer-" + host name + a random suffix.
	ID string
	// Keys is the key schema (prefix). Default: state.DefaultPrefix.
	Keys state.Keys
	// Shared, when set, are the process's caches of the queue, nodes,
	// ledgers, cordons, quotas and warnings, which the placer reads and
	// its caller runs (SharedCaches.Run); build it with the same Keys. Nil:
	// the placer keeps and runs caches of its own.
	Shared *SharedCaches
	// Plan tunes planning (strategy, reservations, candidates).
	Plan PlanOptions
	// MaxTxnOps caps operations per transaction; it must not exceed the
	// etcd server's --max-txn-ops. Default 128, etcd's default. Plan's
	// MaxTxnOps defaults to it.
	MaxTxnOps int
	// MaxTxnBytes caps the keys and values of one transaction; it must stay
	// below the etcd server's --max-request-bytes. Default
	// state.DefaultMaxTxnBytes (1 MiB, etcd's default limit is 1.5 MiB).
	MaxTxnBytes int
	// AdvisoryTimeout bounds one write of pending statuses (reasons and
	// queue positions). Those writes run in their own goroutine: a slow
	// one delays the next explanation, never a bind. Default 5s.
	AdvisoryTimeout time.Duration
	// Parallel is how many bind transactions one placer keeps in flight.
	// Batches never share a ledger, so they cannot conflict with each
	// other, and etcd commits concurrent transactions with one fsync.
	// Default 16.
	Parallel int
	// LeaseTTL is the TTL of the placer's membership lease. Default 10s.
	LeaseTTL time.Duration
	// Sharded makes every live placer plan the whole queue and commit
	// the decisions on the nodes it owns (rendezvous hashing of node names
	// over the live placers). Off, the default, the oldest live placer
	// (its key created first) plans and commits everything, and the
	// others stand by with their caches warm, taking over once its key
	// goes: at once when it stops (it revokes its lease), within LeaseTTL
	// when it dies. Sharded placers spread the commits, but each repeats
	// the whole plan, and etcd, not the committing, is what limits a
	// burst: sharded, three placers bound about half as fast as one active
	// does, with half as much CPU again per binding (placer/README.md).
	Sharded bool
	// StatusRefresh is how often a waiting session's queue position is
	// rewritten when only the position changed. Default 15s.
	StatusRefresh time.Duration
	// StatusBudget bounds status writes per pass, so that telling 20,000
	// waiting sessions their position never delays binding. Default 512.
	StatusBudget int
	// Tick is the longest a placer waits after a pass before the next
	// while sessions are pending (ages grow and reservations start without
	// any etcd event). Default 2s.
	Tick time.Duration
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time

	// start, when set, holds the first pass until it is closed, after the
	// caches have synced (Ready): a benchmark starts several placers'
	// first passes together, from a collected heap.
	start <-chan struct{}
}

func (c *Config) defaults() {
	if c.ID == "" {
		host, _ := os.Hostname()
		var b [3]byte
		_, _ = rand.Read(b[:])
		c.ID = "placer-" + host + "-" + hex.EncodeToString(b[:])
	}
	if c.Keys == (state.Keys{}) {
		c.Keys = state.MustKeys(state.DefaultPrefix)
	}
	if c.MaxTxnOps <= 0 {
		c.MaxTxnOps = state.DefaultMaxTxnOps
	}
	if c.Plan.MaxTxnOps <= 0 {
		c.Plan.MaxTxnOps = c.MaxTxnOps
	}
	if c.MaxTxnBytes <= 0 {
		c.MaxTxnBytes = state.DefaultMaxTxnBytes
	}
	if c.AdvisoryTimeout <= 0 {
		c.AdvisoryTimeout = 5 * time.Second
	}
	if c.Parallel <= 0 {
		c.Parallel = 16
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.StatusRefresh <= 0 {
		c.StatusRefresh = 15 * time.Second
	}
	if c.StatusBudget <= 0 {
		c.StatusBudget = 512
	}
	if c.Tick <= 0 {
		c.Tick = 2 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Now == nil {
		c.Now = time.Now
	}
}

// Stats count what a placer has done since it started.
type Stats struct {
	Passes    int64 // planning passes
	Bound     int64 // sessions bound by this placer
	Txns      int64 // bind transactions committed
	Conflicts int64 // bind transactions refused because state moved
	Lost      int64 // sessions handled after their node was lost
	Statuses  int64 // pending statuses written
}

// Placer watches the queue and binds sessions. It keeps only a cache:
// start any number, kill any of them at any moment.
type Placer struct {
	cfg Config
	cli *clientv3.Client
	log *slog.Logger

	pending *watcher.Cache[state.QueueEntry]
	nodes   *watcher.Cache[state.Node]
	ledgers *watcher.Cache[state.Ledger]
	cordons *watcher.Cache[state.Cordon]
	quotas  *watcher.Cache[state.Quota]
	placers *watcher.Cache[state.Placer]
	// warnings tells which nodes are held for preempting sessions.
	warnings *watcher.Cache[state.Warning]
	// shared is set when the caches above but placers are the process's
	// (Config.Shared), which its owner runs; nil: the placer runs its own.
	shared *SharedCaches

	// kick and changed are signalled by every change the caches deliver,
	// whose revision goes in delivered. catchUp and awaitOthers wait on
	// kick for the caches to reach a revision; the loop waits on changed
	// for a change that is not this placer's own binds coming back
	// (awaitChange): those are laid over the caches already, and planning
	// again on them would bind nothing.
	kick, changed chan struct{}
	delivered     struct {
		sync.Mutex
		revs map[int64]bool // since the newest pass began
		// taken are the sessions a change at each revision of revs
		// took off the queue (a deletion from pending/) or put on a
		// node (an allocation new in a ledger).
		taken map[int64][]string
	}
	ready chan struct{} // closed when the caches first synced
	// idle is true while the loop waits for a change, having found none
	// (awaitChange).
	idle atomic.Bool
	// role is roleActive, or roleStanding while another placer is the
	// active one (Config.Sharded off): its passes neither plan nor write.
	// Zero until the first pass.
	role atomic.Int32
	// passed is closed when the first pass has ended.
	passed chan struct{}

	passes, bound, txns, conflicts, lost, statuses atomic.Int64
	// lastBind is the revision of this placer's newest bind transaction.
	lastBind atomic.Int64
	// doneEpoch is the newest plan epoch a pass of this placer found
	// complete: nothing of its plan left to bind (PinEpoch).
	doneEpoch atomic.Int64
	// freed is the revision of the newest ledger change the ledgers cache
	// delivered that took an allocation off (Snapshot.Freed).
	freed atomic.Int64
	// own are this placer's binds its caches do not show yet, laid over
	// them in every snapshot.
	own *ownWrites
	// quotaStale counts decisions left out because their quota check read
	// ledgers older than this placer's last bind: the next pass then waits
	// for the caches to show that bind.
	quotaStale atomic.Int64

	// advice carries the latest pass's waiting sessions to the advisory
	// writer (a mailbox of one: a newer pass replaces what is unwritten).
	advice chan advice
	// advisoryKV writes pending statuses; tests stall it. Default cli.
	advisoryKV clientv3.KV
	// written remembers the last pending status written per session, to
	// write only changes. Owned by the advisory writer.
	written map[string]writtenStatus
	// writtenGen counts writeWaiting calls (writtenStatus.gen).
	writtenGen uint64
	// planCache keeps per-node planning state between passes.
	planCache *PlanCache
}

type writtenStatus struct {
	reason, message string
	position        int
	at              time.Time
	gen             uint64 // the writeWaiting call that last saw the session waiting
}

// New returns a placer over cli. It does nothing until Run.
func New(cli *clientv3.Client, cfg Config) *Placer {
	cfg.defaults()
	k := cfg.Keys
	log := cfg.Logger.With("component", "placer", "placer", cfg.ID)
	wopt := func(name string) watcher.Options { return watcher.Options{Name: name, Logger: log} }
	sc := cfg.Shared
	if sc == nil {
		sc = NewSharedCaches(cli, k, log)
	}
	p := &Placer{
		cfg:      cfg,
		cli:      cli,
		log:      log,
		pending:  sc.Pending,
		nodes:    sc.Nodes,
		ledgers:  sc.Ledgers,
		cordons:  sc.Cordons,
		quotas:   sc.Quotas,
		placers:  watcher.New(cli, k.Placers(), watcher.JSON[state.Placer], wopt("placers")),
		warnings: sc.Warnings,
		shared:   cfg.Shared,
		kick:     make(chan struct{}, 1),
		changed:  make(chan struct{}, 1),
		ready:    make(chan struct{}),
		passed:   make(chan struct{}),
		advice:   make(chan advice, 1),
		written:  map[string]writtenStatus{},
		own:      newOwnWrites(),

		planCache: NewPlanCache(),
	}
	p.advisoryKV = cli
	sc.sent.Store(p.own)
	p.delivered.revs, p.delivered.taken = map[int64]bool{}, map[int64][]string{}
	signal := func(ch chan struct{}) {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
	// note records a change at revision rev, with the sessions it took
	// (delivered.taken), and signals it.
	note := func(rev int64, taken ...string) {
		p.delivered.Lock()
		p.delivered.revs[rev] = true
		if len(taken) > 0 {
			p.delivered.taken[rev] = append(p.delivered.taken[rev], taken...)
		}
		p.delivered.Unlock()
		signal(p.kick)
		signal(p.changed)
	}
	p.pending.AddHandler(func(ev watcher.Event[state.QueueEntry]) {
		if ev.Type == watcher.Deleted {
			note(ev.Revision, ev.Value.Session)
			return
		}
		note(ev.Revision)
	})
	p.nodes.AddHandler(func(ev watcher.Event[state.Node]) { note(ev.Revision) })
	p.ledgers.AddHandler(func(ev watcher.Event[state.Ledger]) {
		if takesOff(ev) {
			p.freed.Store(max(p.freed.Load(), ev.Revision))
		}
		var placed []string
		if ev.Type != watcher.Deleted {
			var before map[string]state.Allocation
			if ev.Prev != nil {
				before = ev.Prev.Allocations
			}
			for id := range ev.Value.Allocations {
				if _, had := before[id]; !had {
					placed = append(placed, id)
				}
			}
		}
		note(ev.Revision, placed...)
	})
	p.cordons.AddHandler(func(ev watcher.Event[state.Cordon]) { note(ev.Revision) })
	p.quotas.AddHandler(func(ev watcher.Event[state.Quota]) { note(ev.Revision) })
	p.placers.AddHandler(func(ev watcher.Event[state.Placer]) { note(ev.Revision) })
	p.warnings.AddHandler(func(ev watcher.Event[state.Warning]) { note(ev.Revision) })
	return p
}

// Ready is closed once the placer's caches have synced and it starts
// planning.
func (p *Placer) Ready() <-chan struct{} { return p.ready }

// Passed is closed once the placer's first pass has ended: what was queued
// when it started has been planned, and what fitted committed.
func (p *Placer) Passed() <-chan struct{} { return p.passed }

// ID returns the placer's id.
func (p *Placer) ID() string { return p.cfg.ID }

// Stats returns the placer's counters.
func (p *Placer) Stats() Stats {
	return Stats{Passes: p.passes.Load(), Bound: p.bound.Load(), Txns: p.txns.Load(),
		Conflicts: p.conflicts.Load(), Lost: p.lost.Load(), Statuses: p.statuses.Load()}
}

// Run places sessions until ctx ends. It returns nil when ctx is cancelled,
// and when the shared caches it reads (Config.Shared) were stopped by the
// end of their own context before they first synced: on a process's
// shutdown they may hear of it first.
func (p *Placer) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	runCache := func(run func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(ctx); err != nil {
				errc <- err
				cancel()
			}
		}()
	}
	if p.shared == nil {
		runCache(p.pending.Run)
		runCache(p.nodes.Run)
		runCache(p.ledgers.Run)
		runCache(p.cordons.Run)
		runCache(p.quotas.Run)
		runCache(p.warnings.Run)
	}
	runCache(p.placers.Run)
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.membership(ctx)
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.advise(ctx)
	}()

	err := p.loop(ctx)
	cancel()
	wg.Wait()
	close(errc)
	if err != nil {
		return err
	}
	for e := range errc {
		return fmt.Errorf("run placer: %w", e)
	}
	return nil
}

// membership keeps placers/<id> alive under a lease, re-registering after a
// lost lease, until ctx ends.
func (p *Placer) membership(ctx context.Context) {
	for ctx.Err() == nil {
		err := p.register(ctx)
		if ctx.Err() != nil {
			return
		}
		p.log.Warn("placer membership lost; registering again", "err", err)
		if !ctxwait.Sleep(ctx, time.Second) {
			return
		}
	}
}

func (p *Placer) register(ctx context.Context) error {
	// The session outlives ctx so that, on shutdown, its lease can still be
	// revoked: our key then goes at once and the other placers adopt our
	// nodes now rather than after the TTL.
	s, err := concurrency.NewSession(p.cli, concurrency.WithTTL(max(1, int(p.cfg.LeaseTTL/time.Second))), concurrency.WithContext(context.WithoutCancel(ctx)))
	if err != nil {
		return fmt.Errorf("create placer lease: %w", err)
	}
	defer func() {
		s.Orphan()
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if _, err := p.cli.Revoke(rctx, s.Lease()); err != nil {
			p.log.Debug("revoke placer lease", "err", err)
		}
	}()
	host, _ := os.Hostname()
	v, err := state.Encode(state.Placer{ID: p.cfg.ID, Host: host, Started: p.cfg.Now().UTC()})
	if err != nil {
		return err
	}
	if _, err := p.cli.Put(ctx, p.cfg.Keys.Placer(p.cfg.ID), v, clientv3.WithLease(s.Lease())); err != nil {
		return fmt.Errorf("register placer: %w", err)
	}
	p.log.Debug("placer registered", "lease_ttl", p.cfg.LeaseTTL)
	select {
	case <-ctx.Done():
		return nil
	case <-s.Done():
		return errors.New("lease expired")
	}
}

// loop runs passes, driven by cache events and a ticker.
func (p *Placer) loop(ctx context.Context) error {
	for _, c := range []interface{ WaitSynced(context.Context) error }{p.pending, p.nodes, p.ledgers, p.cordons, p.quotas, p.placers, p.warnings} {
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
	}
	s := SnapshotOf(p.cfg.Keys, c, p.cfg.Now())
	p.own.overlay(s, c.Ledgers.Revision(), c.Pending.Revision())
	dropBound(s)
	// Read after the caches: a release they do not show yet only ends
	// the epoch a pass early.
	s.Freed = p.freed.Load()
	PinEpoch(s, p.doneEpoch.Load(), max(c.Pending.Revision(), c.Ledgers.Revision(), c.Nodes.Revision(), p.lastBind.Load()))
	s.Cache = p.planCache
	return s
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

// Caches are the watcher snapshots that a planning snapshot is read from.
type Caches struct {
	Nodes   *watcher.Snapshot[state.Node]
	Ledgers *watcher.Snapshot[state.Ledger]
	Cordons *watcher.Snapshot[state.Cordon]
	Quotas  *watcher.Snapshot[state.Quota]
	Pending *watcher.Snapshot[state.QueueEntry]
	// Warnings, when set, gives the nodes held for preempting sessions.
	Warnings *watcher.Snapshot[state.Warning]
}

// SnapshotOf builds the planning snapshot of c at now: every placer plans on
// it, and so does the API's queue view, so both see the same queue.
func SnapshotOf(k state.Keys, c Caches, now time.Time) *Snapshot {
	s := &Snapshot{Now: now, UserQuotas: map[string]state.Quota{}, GroupQuotas: map[string]state.Quota{},
		QuotaRevisions: map[string]int64{}, LedgersAt: c.Ledgers.Revision()}
	for _, it := range c.Nodes.List() {
		name, ok := k.NodeName(it.Key)
		if !ok {
			continue
		}
		v := NodeView{Node: it.Value, NodeRevision: it.ModRevision}
		v.Node.Name = name
		if cd, ok := c.Cordons.Item(k.Cordon(name)); ok {
			v.Cordon, v.CordonRevision = &cd.Value, cd.ModRevision
		}
		if l, ok := c.Ledgers.Item(k.Ledger(name)); ok {
			v.Ledger, v.LedgerRevision = l.Value, l.ModRevision
		}
		if v.Ledger.Allocations == nil {
			v.Ledger = state.Ledger{Node: name, Allocations: map[string]state.Allocation{}}
		}
		s.Nodes = append(s.Nodes, v)
	}
	// Plan orders the queue itself (priority, share, age, id), so the
	// entries need no sorting here.
	s.Pending = make([]Pending, 0, c.Pending.Len())
	c.Pending.RangeShared(func(it *watcher.Item[state.QueueEntry]) bool {
		if e := &it.Value; isKeyTail(it.Key, e.Session) {
			// decodeQueueEntry set the id from the key, which it found
			// to name a session: nothing to read again.
			s.Pending = append(s.Pending, Pending{Entry: e, Revision: it.ModRevision})
		} else if id, ok := k.SessionID(it.Key); ok {
			if e.Session != id {
				// The key names the session: an entry written without
				// its id (or another) is copied with the key's.
				cp := *e
				cp.Session = id
				e = &cp
			}
			s.Pending = append(s.Pending, Pending{Entry: e, Revision: it.ModRevision})
		}
		return true
	})
	if c.Warnings != nil {
		c.Warnings.Range(func(it watcher.Item[state.Warning]) bool {
			if w := it.Value; w.Reason == state.ReasonPreempted && w.Node != "" && w.By != "" {
				if s.Held == nil {
					s.Held = map[string]string{}
				}
				s.Held[w.Node] = w.By
			}
			return true
		})
	}
	c.Quotas.Range(func(it watcher.Item[state.Quota]) bool {
		if scope, name, ok := k.QuotaKey(it.Key); ok {
			s.QuotaRevisions[it.Key] = it.ModRevision
			if scope == state.QuotaUsers {
				s.UserQuotas[name] = it.Value
			} else {
				s.GroupQuotas[name] = it.Value
			}
		}
		return true
	})
	return s
}

// activeOf returns the id of the active placer among the live ones: the
// one whose key was created first (ties, which etcd never gives, by id).
// This placer, until its cache shows its own key, counts as the newest.
func (p *Placer) activeOf() string {
	best, bestRev := p.cfg.ID, int64(math.MaxInt64)
	for _, it := range p.placers.List() {
		if id := it.Value.ID; id != "" && (it.CreateRevision < bestRev || it.CreateRevision == bestRev && id < best) {
			best, bestRev = id, it.CreateRevision
		}
	}
	return best
}

// stands reports whether this placer stands by (Config.Sharded off and
// another placer active), logging when that changes.
func (p *Placer) stands() bool {
	if p.cfg.Sharded {
		return false
	}
	active := p.activeOf()
	role := int32(roleActive)
	if active != p.cfg.ID {
		role = roleStanding
	}
	if p.role.Swap(role) != role {
		if role == roleStanding {
			p.log.Info("placer standing by", "active", active)
		} else {
			p.log.Info("placer active")
		}
	}
	return role == roleStanding
}

// The roles of a placer when Config.Sharded is off (Placer.role).
const (
	roleActive = 1 + iota
	roleStanding
)

// owners returns the ids of the live placers (always including this one).
func (p *Placer) owners() []string {
	ids := []string{p.cfg.ID}
	for _, it := range p.placers.List() {
		if it.Value.ID != "" && it.Value.ID != p.cfg.ID {
			ids = append(ids, it.Value.ID)
		}
	}
	return ids
}

// ownerOf picks the placer that owns name by rendezvous hashing: each
// name goes to the placer with the highest hash of (placer, name), so a
// placer joining or leaving moves only its own share.
func ownerOf(ids []string, name string) string {
	var best string
	var bestH uint64
	for _, id := range ids {
		h := fnv.New64a()
		_, _ = h.Write([]byte(id))
		_, _ = h.Write([]byte{0})
		_, _ = h.Write([]byte(name))
		if v := mix64(h.Sum64()); best == "" || v > bestH || (v == bestH && id < best) {
			best, bestH = id, v
		}
	}
	return best
}

// mix64 is splitmix64's finaliser: FNV's high bits barely change between
// similar strings, and rendezvous hashing compares whole values.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
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
	mine := func(d *Decision) bool { return len(ids) == 1 || ownerOf(ids, d.Parts[0].Node) == p.cfg.ID }
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

// bindBatch is one transaction's worth of decisions; batches of one pass
// share no node, so they commit in parallel without conflicting.
type bindBatch struct {
	decisions []Decision
	nodes     map[string]bool
	size      state.TxnSize
}

// budget is what one transaction of this placer may hold.
func (p *Placer) budget() state.TxnBudget {
	return state.TxnBudget{MaxOps: p.cfg.MaxTxnOps, MaxBytes: p.cfg.MaxTxnBytes}
}

// decisionSize is what d adds to a batch that already writes the ledgers of
// seen (which it extends): its share of state.BindSize, its quota guards
// and an estimate of its bytes (the ledgers it adds, written whole, its
// bindings and status). commitBatch measures the built transaction.
func decisionSize(d *Decision, seen map[string]bool, nodes map[string]*NodeView, snap *Snapshot) state.TxnSize {
	newNodes, bytes := 0, statusBytes
	for _, pp := range d.Parts {
		bytes += bindingBytes + 45*len(pp.Devices)
		if !seen[pp.Node] {
			seen[pp.Node] = true
			newNodes++
			if v := nodes[pp.Node]; v != nil {
				bytes += ledgerBytes(&v.Ledger)
			}
		}
		bytes += allocationBytes(d.Pending.Entry.Session, d.Pending.Entry, len(pp.Devices), len(pp.Ports))
	}
	s := state.BindSize(newNodes, 1, len(d.Parts)).Plus(state.QuotaGuardSize(len(quotaScopes(d.Pending.Entry, snap))))
	if d.Pending.Entry.Secrets {
		s = s.Plus(state.SecretsSize(len(d.Parts)))
	}
	s.Bytes = bytes
	return s
}

// Byte estimates of the values a bind writes: generous, so that a batch
// the estimate admits passes the exact check (state.SizeOf) in commitBatch.
const (
	statusBytes  = 1024
	bindingBytes = 1024
)

// allocationBytes estimates one allocation's JSON in a ledger: its fixed
// fields, the plan epoch and queue time included, take at most 272 bytes
// (TestLedgerSizeBound).
func allocationBytes(id string, e *state.QueueEntry, devices, ports int) int {
	n := 272 + len(id) + len(e.Owner) + 48*devices + 8*ports
	for _, g := range e.Groups {
		n += len(g) + 3
	}
	return n
}

// ledgerBytes estimates a ledger's JSON.
func ledgerBytes(l *state.Ledger) int {
	n := 64 + len(l.Node)
	for id, a := range l.Allocations {
		n += 272 + len(id) + len(a.Owner) + 48*len(a.GPUs) + 8*len(a.Ports)
		for _, g := range a.Groups {
			n += len(g) + 3
		}
	}
	return n
}

// batch packs decisions into transactions within the txn budget (ops,
// compares and bytes), each node's decisions in one batch (so batches never
// share a ledger). It fills batches node by node, so a batch closes at a
// node boundary rather than leaving a node's later decisions stranded.
// Decisions that would join two batches, or that no longer fit the batch
// their nodes are in, are deferred to the next pass, which plans them again
// on fresh state. A decision that fits no transaction even alone is
// returned in unfit: it is never committed, and it waits with the limit
// named rather than being planned and deferred every pass.
func (p *Placer) batch(ds []Decision, nodes map[string]*NodeView, snap *Snapshot) (batches []*bindBatch, deferred bool, unfit []Decision) {
	budget := p.budget()
	// Group by head node, keeping the plan's order of first appearance.
	groups := map[string][]Decision{}
	var order []string
	for _, d := range ds {
		if !budget.Fits(decisionSize(&d, map[string]bool{}, nodes, snap)) {
			unfit = append(unfit, d)
			continue
		}
		h := d.Parts[0].Node
		if _, ok := groups[h]; !ok {
			order = append(order, h)
		}
		groups[h] = append(groups[h], d)
	}
	var (
		owner = map[string]*bindBatch{}
		open  *bindBatch
	)
	for _, h := range order {
		group := groups[h]
		var target *bindBatch
		split := false
		for _, d := range group {
			for _, pp := range d.Parts {
				if b, ok := owner[pp.Node]; ok {
					if target != nil && target != b {
						split = true
					}
					target = b
				}
			}
		}
		if split {
			deferred = true
			continue
		}
		if target == nil {
			// What the whole group adds to the open batch.
			if open != nil {
				seen := maps.Clone(open.nodes)
				need := open.size
				for i := range group {
					need = need.Plus(decisionSize(&group[i], seen, nodes, snap))
				}
				if !budget.Fits(need) {
					open = nil
				}
			}
			if open == nil {
				open = &bindBatch{nodes: map[string]bool{}}
				batches = append(batches, open)
			}
			target = open
		}
		for i := range group {
			seen := maps.Clone(target.nodes)
			add := decisionSize(&group[i], seen, nodes, snap)
			if !budget.Fits(target.size.Plus(add)) {
				deferred = true
				continue
			}
			target.decisions = append(target.decisions, group[i])
			target.size = target.size.Plus(add)
			target.nodes = seen
			for _, pp := range group[i].Parts {
				owner[pp.Node] = target
			}
		}
	}
	// A batch whose every decision was deferred writes nothing: it is not
	// committed (an empty transaction would count as progress).
	kept := batches[:0]
	for _, b := range batches {
		if len(b.decisions) > 0 {
			kept = append(kept, b)
		}
	}
	return kept, deferred, unfit
}

// committer commits one pass's batches, Parallel in flight, each once the
// batches it is sent after have committed or failed: a batch that writes a
// ledger an earlier batch of the pass writes builds on that batch's write
// (buildBatch reads this placer's own writes). It adds what it bound to
// res.
type committer struct {
	p     *Placer
	ctx   context.Context
	nodes map[string]*NodeView
	snap  *Snapshot
	// prior is this placer's newest bind before this pass: the pass's own
	// batches raise lastBind as they commit, and were planned together.
	prior int64
	// Refused batches are read back and retried only beside other
	// sharded placers: alone or active, a placer loses sessions only to
	// cancels (or, for moments, to a placer that thinks it is active
	// too), and the read-back would lengthen every transaction it sends.
	readBack bool
	sem      chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	res      *passResult
	sent     int
}

// newCommitter returns the committer of a pass planned on snap, whose node
// views are nodes; each batch writes on the ledgers cached when it commits,
// and on this placer's own writes newer than those.
func (p *Placer) newCommitter(ctx context.Context, nodes map[string]*NodeView, snap *Snapshot, res *passResult) *committer {
	return &committer{p: p, ctx: ctx, nodes: nodes, snap: snap,
		prior: p.lastBind.Load(), readBack: p.cfg.Sharded && len(p.owners()) > 1,
		sem: make(chan struct{}, p.cfg.Parallel), res: res}
}

// send commits b once every batch of after is done, without waiting; the
// returned channel is closed when b is done.
func (c *committer) send(b *bindBatch, after []<-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	c.sent++
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer close(done)
		for _, a := range after {
			<-a
		}
		c.sem <- struct{}{}
		defer func() { <-c.sem }()
		c.commit(b)
	}()
	return done
}

// wait returns once every batch sent is done.
func (c *committer) wait() { c.wg.Wait() }

func (c *committer) commit(b *bindBatch) {
	p, res := c.p, c.res
	// The newest ledgers, read as the batch commits: a batch on a ledger
	// another writer (an agent releasing a session) has moved since the
	// snapshot re-checks its choices on it (buildBatch) rather than being
	// refused. A streamed pass's batches commit while it plans, so each
	// reads its own.
	n, rev, stale, err := p.commitBatch(c.ctx, b, p.ledgers.Snapshot(), c.nodes, c.snap, c.prior, c.readBack)
	c.mu.Lock()
	defer c.mu.Unlock()
	res.conflicts += stale
	switch {
	case err != nil:
		if c.ctx.Err() == nil {
			p.log.Warn("bind transaction failed", "err", err, "sessions", len(b.decisions))
		}
		res.conflicts++
	case n == 0 && rev == 0 && stale > 0:
		// Nothing left to commit: every choice went stale.
		p.conflicts.Add(1)
	case n == 0:
		p.conflicts.Add(1)
		res.conflicts++
	default:
		res.bindRev = max(res.bindRev, rev)
		p.lastBind.Store(max(p.lastBind.Load(), rev))
		p.txns.Add(1)
		p.bound.Add(int64(n))
		res.bound += n
	}
}

// streamer packs a plan's decisions into batches as the plan makes them
// (planEmitting), and sends each batch to commit once full, so that the
// first binds go out while the rest of the queue is still being planned.
// A decision waits until the plan has filled every node it is on (no GPU
// device left free), or the plan ends: a node's decisions then go out
// together, its ledger written once, as a pass that commits after its plan
// writes it. A decision on a node that a batch already sent writes (a
// CPU-only session on a full node) goes into a later batch, sent after
// that one: its ledger write builds on the earlier one. Nothing is
// deferred: every decision that fits a transaction is sent in this pass.
type streamer struct {
	// send commits a batch after others (committer.send).
	send   func(b *bindBatch, after []<-chan struct{}) <-chan struct{}
	nodes  map[string]*NodeView
	snap   *Snapshot
	budget state.TxnBudget
	open   *bindBatch
	after  []<-chan struct{} // what the open batch is sent after
	// last is the latest batch sent that writes a node; grown is what
	// the batches sent add to the node's ledger, in estimated bytes.
	last  map[string]<-chan struct{}
	grown map[string]int
	// held are the decisions on nodes the plan has not filled yet, by
	// node; waiting lists them in plan order.
	held    map[string][]*heldDecision
	waiting []*heldDecision
	unfit   []Decision
	chains  int             // batches sent after another
	scratch map[string]bool // for sizes, cleared before use
}

// heldDecision is a decision waiting for nodes of it to fill.
type heldDecision struct {
	d       Decision
	nodes   int // nodes of it not full yet
	offered bool
}

func (p *Placer) newStreamer(c *committer) *streamer {
	return &streamer{send: c.send, nodes: c.nodes, snap: c.snap, budget: p.budget(), last: map[string]<-chan struct{}{}, grown: map[string]int{},
		held: map[string][]*heldDecision{}, scratch: map[string]bool{}}
}

// offer takes the plan's next decision: full tells which nodes the plan
// has filled so far.
func (s *streamer) offer(d Decision, full func(string) bool) {
	h := &heldDecision{d: d}
	var ready []Decision
	for _, pp := range d.Parts {
		if !full(pp.Node) {
			h.nodes++
			s.held[pp.Node] = append(s.held[pp.Node], h)
			continue
		}
		// d filled the node, or it was full already: what waited on it
		// goes now, in plan order, before d.
		for _, w := range s.held[pp.Node] {
			if w.nodes--; w.nodes == 0 {
				w.offered = true
				ready = append(ready, w.d)
			}
		}
		delete(s.held, pp.Node)
	}
	if h.nodes == 0 {
		ready = append(ready, d)
	} else {
		s.waiting = append(s.waiting, h)
	}
	s.addGroup(ready)
}

// end sends what is left once the plan is made: the decisions on nodes it
// did not fill, grouped by head node in plan order, and the open batch.
func (s *streamer) end() {
	groups := map[string][]Decision{}
	var heads []string
	for _, h := range s.waiting {
		if h.offered {
			continue
		}
		head := h.d.Parts[0].Node
		if _, ok := groups[head]; !ok {
			heads = append(heads, head)
		}
		groups[head] = append(groups[head], h.d)
	}
	for _, head := range heads {
		s.addGroup(groups[head])
	}
	s.waiting, s.held = nil, nil
	s.flush()
}

// addGroup adds ds, a node's decisions, to the open batch, sending that
// batch first when they do not all fit in it.
func (s *streamer) addGroup(ds []Decision) {
	if len(ds) == 0 {
		return
	}
	if s.open != nil {
		seen := maps.Clone(s.open.nodes)
		need := s.open.size
		for i := range ds {
			need = need.Plus(s.size(&ds[i], seen))
		}
		if !s.budget.Fits(need) {
			s.flush()
		}
	}
	for _, d := range ds {
		s.add(d)
	}
}

// size is what d adds to a batch that writes the ledgers of seen (which it
// extends): decisionSize, with what earlier batches of the pass added to
// the ledgers d's batch writes again.
func (s *streamer) size(d *Decision, seen map[string]bool) state.TxnSize {
	var added []string
	for _, pp := range d.Parts {
		if !seen[pp.Node] && s.grown[pp.Node] > 0 {
			added = append(added, pp.Node)
		}
	}
	z := decisionSize(d, seen, s.nodes, s.snap)
	for _, n := range added {
		z.Bytes += s.grown[n]
	}
	return z
}

// add puts d in the open batch, sending that batch first when d does not
// fit in it.
func (s *streamer) add(d Decision) {
	clear(s.scratch)
	if !s.budget.Fits(decisionSize(&d, s.scratch, s.nodes, s.snap)) {
		s.unfit = append(s.unfit, d)
		return
	}
	if s.open == nil {
		s.open = &bindBatch{nodes: map[string]bool{}}
	}
	seen := maps.Clone(s.open.nodes)
	add := s.size(&d, seen)
	if len(s.open.decisions) > 0 && !s.budget.Fits(s.open.size.Plus(add)) {
		s.flush()
		s.open = &bindBatch{}
		seen = map[string]bool{}
		add = s.size(&d, seen)
	}
	for _, pp := range d.Parts {
		if !s.open.nodes[pp.Node] {
			if done, ok := s.last[pp.Node]; ok {
				s.after = append(s.after, done)
			}
		}
	}
	s.open.decisions = append(s.open.decisions, d)
	s.open.size = s.open.size.Plus(add)
	s.open.nodes = seen
	if !s.budget.Fits(s.open.size) {
		// Alone it fits, but with what earlier batches added to its
		// ledgers it is over the estimate: it goes alone, and
		// commitBatch's exact check decides.
		s.flush()
	}
}

// flush sends the open batch.
func (s *streamer) flush() {
	b := s.open
	if b == nil {
		return
	}
	if len(s.after) > 0 {
		s.chains++
	}
	done := s.send(b, s.after)
	// Let the batch's goroutine start now: made by this one, it waits on
	// this P until the plan stops running, which a plan of 3,000 sessions
	// did only when preempted, every 10 ms, so its batches went out in
	// clumps and etcd waited between them.
	runtime.Gosched()
	for n := range b.nodes {
		s.last[n] = done
	}
	for i := range b.decisions {
		d := &b.decisions[i]
		for _, pp := range d.Parts {
			s.grown[pp.Node] += allocationBytes(d.Pending.Entry.Session, d.Pending.Entry, len(pp.Devices), len(pp.Ports))
		}
	}
	s.open, s.after = nil, nil
}

// commitBatch writes one batch. Each node's ledger is written on top of the
// newest ledger the cache holds: the one the plan read when it has not
// moved, else a newer one, against which refit re-checks every choice of
// the batch (buildBatch). The transaction compares the revision of exactly
// the ledger it writes over (and the node's inventory key as planned), so a
// write that lands after this read refuses the bind. A decision whose
// choice no longer fits, or whose quota check rests on ledgers older than
// this placer's last bind before the pass (prior), is left out and counted
// in stale. With readBack, a transaction refused because some of its
// sessions were taken is sent again once without them (they count in
// stale). It returns how many sessions the transaction bound (0 if refused
// or empty) and its revision.
func (p *Placer) commitBatch(ctx context.Context, b *bindBatch, fresh *watcher.Snapshot[state.Ledger], nodes map[string]*NodeView, snap *Snapshot, prior int64, readBack bool) (bound int, rev int64, stale int, err error) {
	k := p.cfg.Keys
	t, stale := p.buildBatch(b, fresh, nodes, snap, prior)
	left, err := p.attachSecrets(ctx, &t)
	if err != nil {
		return 0, 0, stale, err
	}
	stale += left
	if len(t.ps) == 0 {
		return 0, 0, stale, nil
	}
	for attempt := 0; ; attempt++ {
		lws, cmps, ops, err := p.bindOps(&t)
		if err != nil {
			return 0, 0, stale, err
		}
		ps := t.ps
		// On a refusal the first attempt reads back its sessions' queue
		// entries, in the same round trip.
		var reads []clientv3.Op
		if attempt == 0 && readBack {
			for _, pl := range ps {
				reads = append(reads, clientv3.OpGet(k.Pending(pl.Session)))
			}
			if !p.budget().Fits(state.SizeOf(cmps, ops, reads)) {
				reads = nil
			}
		}
		// The ledger values are remembered before they are sent: their
		// watch event can come before the reply.
		p.own.send(lws, ops)
		resp, err := p.cli.Txn(ctx).If(cmps...).Then(ops...).Else(reads...).Commit()
		if err != nil {
			p.own.unsend(ops, len(lws))
			return 0, 0, stale, fmt.Errorf("commit bind txn: %w", err)
		}
		if resp.Succeeded {
			p.own.record(lws, ps, resp.Header.Revision, ops)
			return len(ps), resp.Header.Revision, stale, nil
		}
		p.own.unsend(ops, len(lws))
		if len(reads) == 0 {
			return 0, 0, stale, nil
		}
		// Refused. If another writer took some of the batch's sessions
		// (another placer bound them on a plan of its own, or they were
		// cancelled), the rest of the batch still stands on exactly what
		// it was computed from: commit it again without them, once, with
		// the same compares (Nomad's plan applier commits the part of a
		// plan that still fits). If no session moved, a ledger, node,
		// cordon or quota did: the next pass plans again.
		// The retry takes sessions off the ledgers it writes: off copies,
		// since the decoder may have handed the sent ones to the ledgers
		// cache (another placer can write the very same bytes).
		for _, lw := range lws {
			w := t.writes[lw.Node]
			w.Ledger.Allocations = maps.Clone(w.Ledger.Allocations)
		}
		kept := ps[:0]
		for i, pl := range ps {
			rr := resp.Responses[i].GetResponseRange()
			if rr != nil && len(rr.Kvs) == 1 && rr.Kvs[0].ModRevision == pl.PendingRevision {
				kept = append(kept, pl)
				continue
			}
			stale++
			for _, bd := range pl.Bindings {
				delete(t.writes[bd.Node].Ledger.Allocations, pl.Session)
			}
		}
		if len(kept) == len(ps) || len(kept) == 0 {
			return 0, 0, stale, nil
		}
		p.conflicts.Add(1) // the refused attempt
		t.ps = kept
	}
}

// bindTxn is one batch made ready to write: each touched node's ledger
// write (in order of first use) with the placements' allocations added,
// and the placements still in the batch.
type bindTxn struct {
	writes map[string]*state.LedgerWrite
	order  []string
	ps     []state.Placement
}

// buildBatch turns b's decisions into the placements and ledger writes of
// its transaction, on the newest ledgers this placer knows (see
// commitBatch). Decisions left out count in stale.
func (p *Placer) buildBatch(b *bindBatch, fresh *watcher.Snapshot[state.Ledger], nodes map[string]*NodeView, snap *Snapshot, prior int64) (t bindTxn, stale int) {
	k := p.cfg.Keys
	now := p.cfg.Now().UTC()
	// Every status of the batch points at this one time (read only).
	boundAt := &now
	parts := 0
	for _, d := range b.decisions {
		parts += len(d.Parts)
	}
	// The batch's ledger writes, bindings and status node lists are cut
	// from one slice each, sized so that none is reallocated.
	lwSlab := make([]state.LedgerWrite, 0, parts)
	bdSlab := make([]state.Binding, 0, parts)
	nodeSlab := make([]string, 0, parts)
	writes := make(map[string]*state.LedgerWrite, parts)
	var order []string
	ledgerOf := func(node string) *state.LedgerWrite {
		if lw, ok := writes[node]; ok {
			return lw
		}
		v := nodes[node]
		lwSlab = append(lwSlab, state.LedgerWrite{Node: node, NodeRevision: v.NodeRevision, CordonRevision: v.CordonRevision, ReadRevision: v.LedgerRevision})
		lw := &lwSlab[len(lwSlab)-1]
		from := v.Ledger.Allocations
		if it, ok := p.freshLedger(fresh, node); ok && it.ModRevision != v.LedgerRevision {
			lw.ReadRevision, from = it.ModRevision, it.Value.Allocations
		} else if !ok && v.LedgerRevision != 0 {
			lw.ReadRevision, from = 0, nil // released to empty and deleted
		}
		// A copy: the cached ledger is shared, and the batch adds to it.
		lw.Ledger = state.Ledger{Node: node, Allocations: maps.Clone(from)}
		if lw.Ledger.Allocations == nil {
			lw.Ledger.Allocations = map[string]state.Allocation{}
		}
		writes[node] = lw
		order = append(order, node)
		return lw
	}
	ps := make([]state.Placement, 0, len(b.decisions))
	for _, d := range b.decisions {
		e := d.Pending.Entry
		scopes := quotaScopes(e, snap)
		if len(scopes) > 0 && snap.LedgersAt < prior {
			stale++ // plan again once the caches show our last binds
			p.quotaStale.Add(1)
			continue
		}
		var one [1]state.Allocation
		allocs := one[:]
		if len(d.Parts) > 1 {
			allocs = make([]state.Allocation, len(d.Parts))
		}
		fits := true
		for i, pp := range d.Parts {
			allocs[i] = allocation(e, pp)
			allocs[i].Plan, allocs[i].Queued = snap.Epoch, e.Created
			lw := ledgerOf(pp.Node)
			if err := refit(&nodes[pp.Node].Node, &lw.Ledger, e.Session, &allocs[i], p.cfg.Plan.MaxSessionsPerNode); err != nil {
				p.log.Debug("planned choice went stale", "session", e.Session, "err", err)
				fits = false
				break
			}
		}
		if !fits {
			stale++
			continue
		}
		pl := state.Placement{Session: e.Session, PendingRevision: d.Pending.Revision, NeedsSecrets: e.Secrets}
		for _, sc := range scopes {
			pl.Quotas = append(pl.Quotas, state.QuotaGuard{Scope: sc.scope, Name: sc.name,
				QuotaRevision: snap.QuotaRevisions[k.QuotaOf(sc.scope, sc.name)], LedgersAt: snap.LedgersAt,
				Placer: p.cfg.ID, Session: e.Session})
		}
		first := len(bdSlab)
		for i, pp := range d.Parts {
			nodeSlab = append(nodeSlab, pp.Node)
			writes[pp.Node].Ledger.Allocations[e.Session] = allocs[i]
			bd := state.Binding{
				Session: e.Session, Node: pp.Node, Role: pp.Role, Worker: pp.Worker, GPUs: pp.Devices,
				CPUMilli: pp.CPUMilli, MemoryMiB: pp.MemoryMiB, Ports: pp.Ports,
				QueueRevision: d.Pending.Revision, Attempt: e.Attempt, Scores: pp.Scores, Placer: p.cfg.ID, Bound: now,
			}
			if pp.Role == state.RoleWorker {
				bd.HeadNode = d.Parts[0].Node
			}
			bdSlab = append(bdSlab, bd)
		}
		last := len(bdSlab)
		pl.Bindings = bdSlab[first:last:last]
		pl.Status = state.Status{
			Session: e.Session, Phase: state.PhaseBound, Reason: "Bound",
			Message: boundMessage(d), Nodes: nodeSlab[first:last:last], Attempt: e.Attempt,
			Created: e.Created, Updated: now, Bound: boundAt,
		}
		ps = append(ps, pl)
	}
	return bindTxn{writes: writes, order: order, ps: ps}, stale
}

// bindOps builds t's transaction as it stands: only the ledgers of the
// placements kept are written. It returns those ledger writes, and checks
// the transaction against this placer's budget.
func (p *Placer) bindOps(t *bindTxn) ([]state.LedgerWrite, []clientv3.Cmp, []clientv3.Op, error) {
	used := map[string]bool{}
	for _, pl := range t.ps {
		for _, bd := range pl.Bindings {
			used[bd.Node] = true
		}
	}
	lws := make([]state.LedgerWrite, 0, len(t.order))
	for _, n := range t.order {
		if used[n] {
			lws = append(lws, *t.writes[n])
		}
	}
	cmps, ops, err := state.BindOps(p.cfg.Keys, lws, t.ps)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := p.budget().Check(state.SizeOf(cmps, ops, nil)); err != nil {
		return nil, nil, nil, fmt.Errorf("commit bind txn of %d sessions: %w", len(t.ps), err)
	}
	return lws, cmps, ops, nil
}

func boundMessage(d Decision) string {
	pp := d.Parts[0]
	if len(d.Parts) > 1 {
		return "bound to " + pp.Node + " with " + strconv.Itoa(len(pp.Devices)) + " GPUs and " + strconv.Itoa(len(d.Parts)-1) + " Ray workers"
	}
	return "bound to " + pp.Node + " with " + strconv.Itoa(len(pp.Devices)) + " GPUs"
}

// advice is what one pass leaves to explain: the plan's waiting sessions,
// the live placers that share them, and the decisions of this placer that
// fit no transaction.
type advice struct {
	plan   *Plan
	owners []string
	unfit  []Decision
}

// offer hands a to the advisory writer, replacing advice it has not taken
// yet: only the newest pass's explanation matters. Only the run loop calls
// it, so the loop below ends.
func (p *Placer) offer(a advice) {
	for {
		select {
		case p.advice <- a:
			return
		default:
			select {
			case <-p.advice:
			default:
			}
		}
	}
}

// advise writes pending statuses until ctx ends, from the newest advice.
func (p *Placer) advise(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-p.advice:
			p.writeWaiting(ctx, a)
		}
	}
}

// unfitMessage says why d is never committed: its bind fits no transaction.
func (p *Placer) unfitMessage(d Decision) string {
	return fmt.Sprintf("binding this session on %d nodes needs a transaction larger than the limit of %d operations and %d bytes (VOYAGER_PLACER_MAX_TXN_OPS, etcd's --max-txn-ops and --max-request-bytes); ask for fewer Ray workers",
		len(d.Parts), p.cfg.MaxTxnOps, p.cfg.MaxTxnBytes)
}

// writeWaiting tells waiting sessions of this placer's share why they wait
// and where they are in the queue, writing only what changed and at most
// StatusBudget statuses per pass. Each write is a nested transaction that
// applies only if the session is still pending at the revision planned;
// the writes are packed into transactions within the txn budget (nested
// operations count against etcd's limit less the outer ones), each with
// its own AdvisoryTimeout.
func (p *Placer) writeWaiting(ctx context.Context, a advice) {
	now := p.cfg.Now()
	k := p.cfg.Keys
	plan, ids := a.plan, a.owners
	waiting := slices.Clip(plan.Waiting) // appending never writes into the plan
	for i := range a.unfit {
		d := &a.unfit[i]
		waiting = append(waiting, Waiting{Pending: d.Pending, Position: len(waiting) + 1, Reason: "Unsatisfiable", Message: p.unfitMessage(*d)})
	}
	budget := p.budget()
	var (
		ops  []clientv3.Op
		size state.TxnSize
	)
	// Every written status of a session still waiting is marked with this
	// call's generation; the rest are forgotten at the end.
	p.writtenGen++
	gen := p.writtenGen
	type pendingWrite struct {
		id string
		ws writtenStatus
	}
	var batch []pendingWrite
	flush := func() {
		if len(ops) == 0 {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, p.cfg.AdvisoryTimeout)
		_, err := p.advisoryKV.Txn(wctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("write pending statuses", "err", err, "statuses", len(batch))
			}
		} else {
			for _, w := range batch {
				p.written[w.id] = w.ws
			}
			p.statuses.Add(int64(len(batch)))
		}
		ops, batch, size = ops[:0], batch[:0], state.TxnSize{}
	}
	left := p.cfg.StatusBudget
	for _, w := range waiting {
		e := w.Pending.Entry
		last, ok := p.written[e.Session]
		if ok {
			last.gen = gen
			p.written[e.Session] = last
		}
		if left == 0 || ctx.Err() != nil || ownerOf(ids, e.Session) != p.cfg.ID {
			continue
		}
		// A new reason is written at once; a changed message or position
		// under the same reason (the best node's free count, sessions
		// ahead) at most every StatusRefresh: the API computes live queue
		// positions itself, so etcd need not carry every step.
		if ok && last.reason == w.Reason && now.Sub(last.at) < p.cfg.StatusRefresh {
			continue
		}
		msg := w.Message + "; " + ahead(w.Position-1)
		if ok && last.reason == w.Reason && last.message == msg {
			continue
		}
		// EventExplain: the nested txn's compare of the queue entry is
		// its guard (an entry exists only while the status is Pending).
		phase, err := state.Next(state.PhasePending, state.EventExplain, state.Facts{Queued: true})
		if err != nil {
			continue
		}
		st := state.Status{Session: e.Session, Phase: phase, Reason: w.Reason, Message: msg,
			QueuePosition: w.Position, Attempt: e.Attempt, Created: e.Created, Updated: now.UTC()}
		v, err := state.Encode(st)
		if err != nil {
			continue
		}
		op := clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.Pending(e.Session)), "=", w.Pending.Revision)},
			[]clientv3.Op{clientv3.OpPut(k.Status(e.Session), v)}, nil)
		add := state.SizeOf(nil, []clientv3.Op{op}, nil)
		if !budget.Fits(size.Plus(add)) {
			flush()
		}
		ops = append(ops, op)
		size = size.Plus(add)
		batch = append(batch, pendingWrite{e.Session, writtenStatus{reason: w.Reason, message: msg, position: w.Position, at: now, gen: gen}})
		left--
	}
	flush()
	for id, w := range p.written {
		if w.gen != gen {
			delete(p.written, id)
		}
	}
}

func ahead(n int) string {
	switch n {
	case 0:
		return "you are next in line"
	case 1:
		return "1 session ahead of you"
	}
	return fmt.Sprintf("%d sessions ahead of you", n)
}
