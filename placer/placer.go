package placer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
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
	// Plan tunes planning (strategy, reservations, candidates).
	Plan PlanOptions
	// MaxTxnOps caps operations per transaction; it must not exceed the
	// etcd server's --max-txn-ops. Default 128, etcd's default.
	MaxTxnOps int
	// Parallel is how many bind transactions one placer keeps in flight.
	// Batches never share a ledger, so they cannot conflict with each
	// other, and etcd commits concurrent transactions with one fsync.
	// Default 16.
	Parallel int
	// LeaseTTL is the TTL of the placer's membership lease. Default 10s.
	LeaseTTL time.Duration
	// StatusRefresh is how often a waiting session's queue position is
	// rewritten when only the position changed. Default 15s.
	StatusRefresh time.Duration
	// StatusBudget bounds status writes per pass, so that telling 20,000
	// waiting sessions their position never delays binding. Default 512.
	StatusBudget int
	// Tick is the longest a placer waits between passes while sessions are
	// pending (ages grow and reservations start without any etcd event).
	// Default 2s.
	Tick time.Duration
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
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
		c.MaxTxnOps = 128
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

	kick  chan struct{}
	ready chan struct{} // closed when the caches first synced

	passes, bound, txns, conflicts, lost, statuses atomic.Int64

	// written remembers the last pending status written per session, to
	// write only changes. Owned by the run loop.
	written map[string]writtenStatus
}

type writtenStatus struct {
	reason, message string
	position        int
	at              time.Time
}

// New returns a placer over cli. It does nothing until Run.
func New(cli *clientv3.Client, cfg Config) *Placer {
	cfg.defaults()
	k := cfg.Keys
	log := cfg.Logger.With("component", "placer", "placer", cfg.ID)
	wopt := func(name string) watcher.Options { return watcher.Options{Name: name, Logger: log} }
	p := &Placer{
		cfg:      cfg,
		cli:      cli,
		log:      log,
		pending:  watcher.New(cli, k.PendingDir(), watcher.JSON[state.QueueEntry], wopt("pending")),
		nodes:    watcher.New(cli, k.Nodes(), watcher.JSON[state.Node], wopt("nodes")),
		ledgers:  watcher.New(cli, k.Ledgers(), watcher.JSON[state.Ledger], wopt("ledgers")),
		cordons:  watcher.New(cli, k.Cordons(), watcher.JSON[state.Cordon], wopt("cordons")),
		quotas:   watcher.New(cli, k.Quotas(), watcher.JSON[state.Quota], wopt("quotas")),
		placers:  watcher.New(cli, k.Placers(), watcher.JSON[state.Placer], wopt("placers")),
		warnings: watcher.New(cli, k.Warnings(), watcher.JSON[state.Warning], wopt("warnings")),
		kick:     make(chan struct{}, 1),
		ready:    make(chan struct{}),
		written:  map[string]writtenStatus{},
	}
	kick := func() {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
	p.pending.AddHandler(func(watcher.Event[state.QueueEntry]) { kick() })
	p.nodes.AddHandler(func(watcher.Event[state.Node]) { kick() })
	p.ledgers.AddHandler(func(watcher.Event[state.Ledger]) { kick() })
	p.cordons.AddHandler(func(watcher.Event[state.Cordon]) { kick() })
	p.quotas.AddHandler(func(watcher.Event[state.Quota]) { kick() })
	p.placers.AddHandler(func(watcher.Event[state.Placer]) { kick() })
	p.warnings.AddHandler(func(watcher.Event[state.Warning]) { kick() })
	return p
}

// Ready is closed once the placer's caches have synced and it starts
// planning.
func (p *Placer) Ready() <-chan struct{} { return p.ready }

// ID returns the placer's id.
func (p *Placer) ID() string { return p.cfg.ID }

// Stats returns the placer's counters.
func (p *Placer) Stats() Stats {
	return Stats{Passes: p.passes.Load(), Bound: p.bound.Load(), Txns: p.txns.Load(),
		Conflicts: p.conflicts.Load(), Lost: p.lost.Load(), Statuses: p.statuses.Load()}
}

// Run places sessions until ctx ends. It returns nil when ctx is cancelled.
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
	runCache(p.pending.Run)
	runCache(p.nodes.Run)
	runCache(p.ledgers.Run)
	runCache(p.cordons.Run)
	runCache(p.quotas.Run)
	runCache(p.placers.Run)
	runCache(p.warnings.Run)
	wg.Add(1)
	go func() {
		defer wg.Done()
		p.membership(ctx)
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
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("sync placer caches: %w", err)
		}
	}
	p.log.Debug("placer caches synced", "pending", p.pending.Len(), "nodes", p.nodes.Len())
	close(p.ready)
	tick := time.NewTicker(p.cfg.Tick)
	defer tick.Stop()
	var (
		bindRev, ledgerRev int64 // our writes: wait for the caches to see them
		failures           int
	)
	for {
		if err := p.catchUp(ctx, bindRev, ledgerRev); err != nil {
			return nil
		}
		started := time.Now()
		res := p.pass(ctx)
		if ctx.Err() != nil {
			return nil
		}
		took := time.Since(started)
		bindRev, ledgerRev = max(bindRev, res.bindRev), max(ledgerRev, res.ledgerRev)
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
		case res.bound > 0 || res.deferred:
			failures = 0
			continue // more may fit: plan again on the fresh state
		}
		failures = 0
		select {
		case <-ctx.Done():
			return nil
		case <-p.kick:
		case <-tick.C:
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

// catchUp waits until the caches have seen this placer's own writes (binds
// reach pending/ and ledger/, lost-node clean-ups ledger/), so a pass never
// replans what this placer just bound.
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
	return SnapshotOf(p.cfg.Keys, Caches{
		Nodes: p.nodes.Snapshot(), Ledgers: p.ledgers.Snapshot(), Cordons: p.cordons.Snapshot(),
		Quotas: p.quotas.Snapshot(), Pending: p.pending.Snapshot(), Warnings: p.warnings.Snapshot(),
	}, p.cfg.Now())
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
	s := &Snapshot{Now: now, UserQuotas: map[string]state.Quota{}, GroupQuotas: map[string]state.Quota{}}
	for _, it := range c.Nodes.List() {
		name, ok := k.NodeName(it.Key)
		if !ok {
			continue
		}
		v := NodeView{Node: it.Value}
		v.Node.Name = name
		if cd, ok := c.Cordons.Get(k.Cordon(name)); ok {
			v.Cordon = &cd
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
	c.Pending.Range(func(it watcher.Item[state.QueueEntry]) bool {
		if id, ok := k.SessionID(it.Key); ok {
			e := it.Value
			e.Session = id
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
	deferred           bool // decisions left for the next pass (batch limits)
}

// pass plans once and commits this placer's share.
func (p *Placer) pass(ctx context.Context) passResult {
	p.passes.Add(1)
	snap := p.snapshot()
	var res passResult
	if rev := p.handleLost(ctx, snap); rev > 0 {
		// Plan on ledgers that show the cleared nodes.
		res.ledgerRev = rev
		res.deferred = true
		return res
	}
	if len(snap.Pending) == 0 {
		return res
	}
	planStart := time.Now()
	plan := NewPlan(snap, p.cfg.Plan)
	planTook := time.Since(planStart)
	ids := p.owners()
	var mine []Decision
	for _, d := range plan.Bound {
		if ownerOf(ids, d.Parts[0].Node) == p.cfg.ID {
			mine = append(mine, d)
		}
	}
	nodes := map[string]*NodeView{}
	for i := range snap.Nodes {
		nodes[snap.Nodes[i].Node.Name] = &snap.Nodes[i]
	}
	batches, deferred := p.batch(mine, nodes)
	res.deferred = deferred
	commitStart := time.Now()
	p.commit(ctx, batches, &res)
	commitTook := time.Since(commitStart)
	if !deferred {
		// Binding comes before explaining: while this pass left sessions
		// for the next one, their neighbours' reasons can wait a pass.
		p.writeWaiting(ctx, plan, ids, &res)
	}
	p.log.Debug("pass", "pending", len(snap.Pending), "planned", len(plan.Bound), "mine", len(mine),
		"batches", len(batches), "bound", res.bound, "conflicts", res.conflicts, "deferred", deferred,
		"plan", planTook, "commit", commitTook)
	return res
}

// bindBatch is one transaction's worth of decisions; batches of one pass
// share no node, so they commit in parallel without conflicting.
type bindBatch struct {
	decisions []Decision
	nodes     map[string]bool
	ops       int
}

// batch packs decisions into transactions of at most MaxTxnOps operations,
// each node's decisions in one batch (so batches never share a ledger). It
// fills batches node by node, so a batch closes at a node boundary rather
// than leaving a node's later decisions stranded. Decisions that would join
// two batches, or a node whose decisions exceed one transaction, are
// deferred to the next pass, which plans them again on fresh state.
func (p *Placer) batch(ds []Decision, _ map[string]*NodeView) ([]*bindBatch, bool) {
	// Group by head node, keeping the plan's order of first appearance.
	groups := map[string][]Decision{}
	var order []string
	for _, d := range ds {
		h := d.Parts[0].Node
		if _, ok := groups[h]; !ok {
			order = append(order, h)
		}
		groups[h] = append(groups[h], d)
	}
	var (
		batches  []*bindBatch
		owner    = map[string]*bindBatch{}
		open     *bindBatch
		deferred bool
	)
	for _, h := range order {
		group := groups[h]
		// Ops the group needs on top of what an existing batch holds.
		need, nodes := 0, map[string]bool{}
		var target *bindBatch
		split := false
		for _, d := range group {
			need += 2 + len(d.Parts)
			for _, pp := range d.Parts {
				if b, ok := owner[pp.Node]; ok {
					if target != nil && target != b {
						split = true
					}
					target = b
				} else if !nodes[pp.Node] {
					nodes[pp.Node] = true
					need++ // the ledger write
				}
			}
		}
		if split {
			deferred = true
			continue
		}
		if target == nil {
			if open == nil || open.ops+need > p.cfg.MaxTxnOps {
				open = &bindBatch{nodes: map[string]bool{}}
				batches = append(batches, open)
			}
			target = open
		}
		for _, d := range group {
			ops := 2 + len(d.Parts)
			for _, pp := range d.Parts {
				if !target.nodes[pp.Node] {
					ops++
				}
			}
			if target.ops+ops > p.cfg.MaxTxnOps {
				deferred = true
				continue
			}
			target.decisions = append(target.decisions, d)
			target.ops += ops
			for _, pp := range d.Parts {
				target.nodes[pp.Node] = true
				owner[pp.Node] = target
			}
		}
	}
	return batches, deferred
}

// commit runs the batches, Parallel at a time.
func (p *Placer) commit(ctx context.Context, batches []*bindBatch, res *passResult) {
	if len(batches) == 0 {
		return
	}
	snapLedgers := p.ledgers.Snapshot()
	var mu sync.Mutex
	sem := make(chan struct{}, p.cfg.Parallel)
	var wg sync.WaitGroup
	for _, b := range batches {
		sem <- struct{}{}
		wg.Add(1)
		go func(b *bindBatch) {
			defer wg.Done()
			defer func() { <-sem }()
			ok, rev, err := p.commitBatch(ctx, b, snapLedgers)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				if ctx.Err() == nil {
					p.log.Warn("bind transaction failed", "err", err, "sessions", len(b.decisions))
				}
				res.conflicts++
			case !ok:
				p.conflicts.Add(1)
				res.conflicts++
			default:
				res.bindRev = max(res.bindRev, rev)
				p.txns.Add(1)
				p.bound.Add(int64(len(b.decisions)))
				res.bound += len(b.decisions)
			}
		}(b)
	}
	wg.Wait()
}

// commitBatch writes one batch. It reports whether the transaction
// committed and the revision it saw.
func (p *Placer) commitBatch(ctx context.Context, b *bindBatch, ledgers *watcher.Snapshot[state.Ledger]) (bool, int64, error) {
	k := p.cfg.Keys
	now := p.cfg.Now().UTC()
	writes := map[string]*state.LedgerWrite{}
	var order []string
	var ps []state.Placement
	for _, d := range b.decisions {
		e := d.Pending.Entry
		var nodesOf []string
		for _, pp := range d.Parts {
			nodesOf = append(nodesOf, pp.Node)
		}
		pl := state.Placement{Session: e.Session, PendingRevision: d.Pending.Revision}
		for _, pp := range d.Parts {
			lw, ok := writes[pp.Node]
			if !ok {
				lw = &state.LedgerWrite{Node: pp.Node, Ledger: state.Ledger{Node: pp.Node, Allocations: map[string]state.Allocation{}}}
				if it, ok := ledgers.Item(k.Ledger(pp.Node)); ok {
					lw.ReadRevision = it.ModRevision
					for id, a := range it.Value.Allocations {
						lw.Ledger.Allocations[id] = a
					}
				}
				writes[pp.Node] = lw
				order = append(order, pp.Node)
			}
			lw.Ledger.Allocations[e.Session] = allocation(&e, pp)
			bd := state.Binding{
				Session: e.Session, Node: pp.Node, Role: pp.Role, Worker: pp.Worker, GPUs: pp.Devices,
				CPUMilli: pp.CPUMilli, MemoryMiB: pp.MemoryMiB, Ports: pp.Ports,
				QueueRevision: d.Pending.Revision, Attempt: e.Attempt, Scores: pp.Scores, Placer: p.cfg.ID, Bound: now,
			}
			if pp.Role == state.RoleWorker {
				bd.HeadNode = d.Parts[0].Node
			}
			pl.Bindings = append(pl.Bindings, bd)
		}
		bound := now
		pl.Status = state.Status{
			Session: e.Session, Phase: state.PhaseBound, Reason: "Bound",
			Message: boundMessage(d), Nodes: nodesOf, Attempt: e.Attempt,
			Created: e.Created, Updated: now, Bound: &bound,
		}
		ps = append(ps, pl)
	}
	lws := make([]state.LedgerWrite, 0, len(order))
	for _, n := range order {
		lws = append(lws, *writes[n])
	}
	cmps, ops, err := state.BindOps(k, lws, ps)
	if err != nil {
		return false, 0, err
	}
	resp, err := p.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, 0, fmt.Errorf("commit bind txn: %w", err)
	}
	return resp.Succeeded, resp.Header.Revision, nil
}

func boundMessage(d Decision) string {
	pp := d.Parts[0]
	msg := fmt.Sprintf("bound to %s with %d GPUs", pp.Node, len(pp.Devices))
	if len(d.Parts) > 1 {
		msg += fmt.Sprintf(" and %d Ray workers", len(d.Parts)-1)
	}
	return msg
}

// writeWaiting tells waiting sessions of this placer's share why they wait
// and where they are in the queue, writing only what changed and at most
// StatusBudget statuses per pass. Each write is a nested transaction that
// applies only if the session is still pending at the revision planned.
func (p *Placer) writeWaiting(ctx context.Context, plan *Plan, ids []string, res *passResult) {
	now := p.cfg.Now()
	k := p.cfg.Keys
	var ops []clientv3.Op
	live := make(map[string]bool, len(plan.Waiting))
	type pendingWrite struct {
		id string
		ws writtenStatus
	}
	var batch []pendingWrite
	flush := func() {
		if len(ops) == 0 {
			return
		}
		if _, err := p.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			if ctx.Err() == nil {
				p.log.Warn("write pending statuses", "err", err)
			}
		} else {
			for _, w := range batch {
				p.written[w.id] = w.ws
			}
			p.statuses.Add(int64(len(batch)))
		}
		ops, batch = ops[:0], batch[:0]
	}
	budget := p.cfg.StatusBudget
	for _, w := range plan.Waiting {
		e := w.Pending.Entry
		live[e.Session] = true
		if budget == 0 || ownerOf(ids, e.Session) != p.cfg.ID {
			continue
		}
		msg := w.Message + "; " + ahead(w.Position-1)
		// A new reason is written at once; a changed message or position
		// under the same reason (the best node's free count, sessions
		// ahead) at most every StatusRefresh: the API computes live queue
		// positions itself, so etcd need not carry every step.
		last, ok := p.written[e.Session]
		if ok && last.reason == w.Reason && (last.message == msg || now.Sub(last.at) < p.cfg.StatusRefresh) {
			continue
		}
		st := state.Status{Session: e.Session, Phase: state.PhasePending, Reason: w.Reason, Message: msg,
			QueuePosition: w.Position, Attempt: e.Attempt, Created: e.Created, Updated: now.UTC()}
		v, err := state.Encode(st)
		if err != nil {
			continue
		}
		ops = append(ops, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.Pending(e.Session)), "=", w.Pending.Revision)},
			[]clientv3.Op{clientv3.OpPut(k.Status(e.Session), v)}, nil))
		batch = append(batch, pendingWrite{e.Session, writtenStatus{reason: w.Reason, message: msg, position: w.Position, at: now}})
		budget--
		if len(ops) >= p.cfg.MaxTxnOps {
			flush()
		}
	}
	flush()
	for id := range p.written {
		if !live[id] {
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
