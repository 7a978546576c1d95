package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/internal/promfunc"
	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// ControllerConfig configures the lifecycle Controller. Zero fields take
// the defaults named.
type ControllerConfig struct {
	// Keys is the key schema. Default: state.DefaultPrefix.
	Keys state.Keys
	// IdleTimeout is the idle timeout of notebooks that name none; zero
	// turns idle culling off for them.
	IdleTimeout time.Duration
	// StopWarning is the grace after an idle warning and the lead of a
	// max-runtime warning. Default 15 minutes.
	StopWarning time.Duration
	// MaxRuntime is the max runtime of sessions that name none; zero: none.
	MaxRuntime time.Duration
	// DrainDeadline is how long notebooks on a node drained without a
	// deadline keep running. Default 1 hour.
	DrainDeadline time.Duration
	// PreemptGrace is the time between a preemption warning and the stop.
	// Default 2 minutes.
	PreemptGrace time.Duration
	// PreemptNotebooks lets preemptible notebooks be preempted too.
	PreemptNotebooks bool
	// ResizeInterval is the least time between two resizes of one elastic
	// job. Default 5 minutes.
	ResizeInterval time.Duration
	// ResizeNotice is the time between a resize's warning and its stop.
	// Zero: the next pass stops it.
	ResizeNotice time.Duration
	// Goodput makes resizes goodput-aware (placer.ElasticOptions.Goodput,
	// VOYAGER_PLACER_GOODPUT).
	Goodput bool
	// Plan are the placers' planning options: preemption plans the queue
	// the way they do.
	Plan placer.PlanOptions
	// Shared, when set, are the process's caches of the queue, nodes,
	// ledgers, cordons, quotas and warnings (a placer in the same process
	// reads them too); the caller runs them. Nil: the controller keeps and
	// runs its own.
	Shared *placer.SharedCaches
	// Every is the longest time between passes; changes in etcd start one
	// sooner. Default 1 second.
	Every time.Duration
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

// Controller applies the lifecycle rules: it warns, then evicts, idle
// notebooks, sessions past their max runtime and notebooks on drained
// nodes; preempts lower-priority preemptible sessions for waiting
// higher-priority ones; and re-queues sessions waiting to restart. One
// controller at a time acts (an etcd election); every write is a
// transaction conditional on what it read, so a stale decision does
// nothing.
type Controller struct {
	cfg ControllerConfig
	cli *clientv3.Client
	log *slog.Logger
	// beforeResize, set by tests only, runs in Pass after the sessions'
	// rules and before the resizes: what etcd does meanwhile.
	beforeResize func()

	// sessions and statuses keep what the rules read of each spec and
	// status, not the whole (views.go).
	sessions *watcher.Cache[specView]
	statuses *watcher.Cache[statusView]
	warnings *watcher.Cache[state.Warning]
	pending  *watcher.Cache[state.QueueEntry]
	nodes    *watcher.Cache[state.Node]
	ledgers  *watcher.Cache[state.Ledger]
	cordons  *watcher.Cache[state.Cordon]
	quotas   *watcher.Cache[state.Quota]
	teams    *watcher.Cache[state.Team]
	// shared is Config.Shared: those caches are run by the caller.
	shared bool

	kick    chan struct{}
	leading atomic.Bool

	warned, withdrawn, evicted, requeued, preempted, resized, conflicts, pass atomic.Int64
	// teamPreempts counts preemptions by team (teampreempt.go).
	teamPreempts teamPreemptions
}

// passes counts completed passes (tests wait on it).
func (c *Controller) passes() int64 { return c.pass.Load() }

// NewController returns a lifecycle controller over cli. It does nothing
// until Run.
func NewController(cli *clientv3.Client, cfg ControllerConfig) *Controller {
	if cfg.Keys == (state.Keys{}) {
		cfg.Keys = state.MustKeys(state.DefaultPrefix)
	}
	if cfg.StopWarning <= 0 {
		cfg.StopWarning = 15 * time.Minute
	}
	if cfg.DrainDeadline <= 0 {
		cfg.DrainDeadline = time.Hour
	}
	if cfg.PreemptGrace <= 0 {
		cfg.PreemptGrace = 2 * time.Minute
	}
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.ResizeInterval <= 0 {
		cfg.ResizeInterval = 5 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	k := cfg.Keys
	log := cfg.Logger.With("component", "lifecycle")
	wopt := func(name string) watcher.Options { return watcher.Options{Name: "lifecycle-" + name, Logger: log} }
	sc := cfg.Shared
	if sc == nil {
		sc = placer.NewSharedCaches(cli, k, log)
	}
	c := &Controller{
		teamPreempts: newTeamPreemptions(),
		cfg:          cfg,
		cli:          cli,
		log:          log,
		sessions:     watcher.New(cli, k.Sessions(), decodeSpec, wopt("sessions")),
		statuses:     watcher.New(cli, k.StatusDir(), decodeStatus, wopt("status")),
		warnings:     sc.Warnings,
		pending:      sc.Pending,
		nodes:        sc.Nodes,
		ledgers:      sc.Ledgers,
		cordons:      sc.Cordons,
		quotas:       sc.Quotas,
		teams:        sc.Teams,
		shared:       cfg.Shared != nil,
		kick:         make(chan struct{}, 1),
	}
	kick := func() {
		select {
		case c.kick <- struct{}{}:
		default:
		}
	}
	// Requests, specs and cordons start a pass at once; statuses and
	// ledgers (activity samples, every bind and release) wait for the
	// tick, so a busy cluster does not run a pass per write.
	c.sessions.AddHandler(func(watcher.Event[specView]) { kick() })
	c.pending.AddHandler(func(watcher.Event[state.QueueEntry]) { kick() })
	c.cordons.AddHandler(func(watcher.Event[state.Cordon]) { kick() })
	return c
}

// Stats are the controller's counters.
type Stats struct {
	// Warned counts warnings written; Withdrawn those taken back.
	Warned, Withdrawn int64
	// Evicted counts sessions stopped by a rule; Preempted those evicted
	// to make room (a subset).
	Evicted, Preempted int64
	// Resized counts elastic jobs stopped to run again at another size.
	Resized int64
	// Requeued counts sessions put back in the queue after a back-off or
	// a preemption.
	Requeued int64
	// Conflicts counts writes refused because state moved since read.
	Conflicts int64
}

// Stats returns the controller's counters.
func (c *Controller) Stats() Stats {
	return Stats{Warned: c.warned.Load(), Withdrawn: c.withdrawn.Load(), Evicted: c.evicted.Load(),
		Preempted: c.preempted.Load(), Resized: c.resized.Load(), Requeued: c.requeued.Load(), Conflicts: c.conflicts.Load()}
}

// Leading reports whether this controller holds the election now.
func (c *Controller) Leading() bool { return c.leading.Load() }

// Collectors returns the controller's Prometheus metrics.
func (c *Controller) Collectors() []prometheus.Collector {
	m := promfunc.Set{Subsystem: "lifecycle"}
	return []prometheus.Collector{
		m.Counter("warnings_total", "Warnings written (idle, max runtime, drain, preemption).", c.warned.Load),
		m.Counter("warnings_withdrawn_total", "Warnings withdrawn because their cause went away.", c.withdrawn.Load),
		m.Counter("evictions_total", "Sessions stopped by a lifecycle rule after their warning.", c.evicted.Load),
		m.Counter("preemptions_total", "Sessions stopped to make room for higher-priority ones.", c.preempted.Load),
		m.Counter("resizes_total", "Elastic jobs stopped to run again at another size.", c.resized.Load),
		m.Counter("requeues_total", "Sessions re-queued after a restart back-off or a preemption.", c.requeued.Load),
		m.Counter("conflicts_total", "Writes refused because state moved since read.", c.conflicts.Load),
		m.Gauge("leader", "1 while this process runs the lifecycle rules.", promfunc.Flag(c.leading.Load)),
		c.teamPreempts.vec,
	}
}

// cache is what the controller does with each of its caches.
type cache interface {
	Run(context.Context) error
	WaitSynced(context.Context) error
}

// caches lists every cache the controller reads.
func (c *Controller) caches() []cache {
	return []cache{c.sessions, c.statuses, c.warnings, c.pending, c.nodes, c.ledgers, c.cordons, c.quotas, c.teams}
}

// owned lists the caches the controller runs: all of them, or, with
// Config.Shared, its own sessions and statuses only.
func (c *Controller) owned() []cache {
	if c.shared {
		return []cache{c.sessions, c.statuses}
	}
	return c.caches()
}

// Run keeps the caches and, while this process holds the lifecycle
// election, applies the rules, until ctx ends. It returns nil when ctx is
// cancelled.
func (c *Controller) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 8)
	for _, cache := range c.owned() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := cache.Run(ctx); err != nil {
				errc <- err
				cancel()
			}
		}()
	}
	leadUntilDone(ctx, c.cli, c.cfg.Keys, "lifecycle", c.log, c.lead)
	cancel()
	wg.Wait()
	close(errc)
	for e := range errc {
		return fmt.Errorf("run lifecycle controller: %w", e)
	}
	return nil
}

// lead applies the rules, a pass at a time, until ctx ends.
func (c *Controller) lead(ctx context.Context) error {
	for _, cache := range c.caches() {
		if err := cache.WaitSynced(ctx); err != nil {
			return fmt.Errorf("sync lifecycle caches: %w", err)
		}
	}
	c.leading.Store(true)
	defer c.leading.Store(false)
	c.log.Debug("lifecycle controller elected", "idleTimeout", c.cfg.IdleTimeout, "maxRuntime", c.cfg.MaxRuntime,
		"stopWarning", c.cfg.StopWarning, "preemptGrace", c.cfg.PreemptGrace)
	tick := time.NewTicker(c.cfg.Every)
	defer tick.Stop()
	for {
		if err := c.Pass(ctx); err != nil && ctx.Err() == nil {
			c.log.Warn("lifecycle pass failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-c.kick:
		}
		// Coalesce bursts of changes: at most ten passes per Every.
		if !ctxwait.Sleep(ctx, c.cfg.Every/10) {
			return nil
		}
	}
}

// view is what one pass reads, from the caches at one moment.
type view struct {
	now      time.Time
	sessions *watcher.Snapshot[specView]
	statuses *watcher.Snapshot[statusView]
	warnings *watcher.Snapshot[state.Warning]
	pending  *watcher.Snapshot[state.QueueEntry]
	cordons  *watcher.Snapshot[state.Cordon]
	// ledgers are the ledgers as the pass began: holds, resizes and
	// preemptions all read this one snapshot. A resize planned from a
	// later one could see a job's release (after an eviction this pass
	// wrote) while holds still shows it holding, and count its claim
	// nowhere.
	ledgers *watcher.Snapshot[state.Ledger]
	// holds maps each session to the nodes whose ledgers hold it.
	holds map[string][]string
	// elastic are the running elastic jobs, and owed the waiting sessions
	// a shrink of one serves (elastic.go): preemption spares the first and
	// lets the second wait for the shrink.
	elastic, owed map[string]bool
	// waiting are the sessions that wait to run again, for requeueAll.
	waiting []waitingSession
}

// waitingSession is a session waiting to run again (a back-off, a fence,
// a preemption, a resize) as a pass found it: its spec and status, and
// its warning if it has one (ended: of the attempt that ended).
type waitingSession struct {
	id      string
	spec    watcher.Item[specView]
	status  watcher.Item[statusView]
	warning watcher.Item[state.Warning]
	ended   bool
}

// requeueConcurrency is how many waiting sessions a pass re-queues at
// once. Each re-queue is a read and a transaction of its own session's
// keys; one at a time, on the soak's loaded 2-core machine, a pass fell
// behind the back-offs of 300 binds a second, and each pass behind them
// walked more statuses than the last.
const requeueConcurrency = 16

// requeueAll withdraws the warnings of the waiting sessions' ended
// attempts and re-queues those due (requeue), requeueConcurrency at a
// time, and returns their errors.
func (c *Controller) requeueAll(ctx context.Context, v *view) []error {
	var (
		mu   sync.Mutex
		errs []error
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, requeueConcurrency)
	for _, ws := range v.waiting {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := func() error {
				if ws.ended {
					if err := c.withdraw(ctx, ws.id, ws.warning.ModRevision, "session stopped"); err != nil {
						return err
					}
				}
				return c.requeue(ctx, v, ws.id, ws.spec, ws.status)
			}()
			if err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return errs
}

// Pass applies every rule once to the caches' current state. Run calls it;
// tests may too.
func (c *Controller) Pass(ctx context.Context) error {
	k := c.cfg.Keys
	v := &view{
		now:      c.cfg.Now().UTC(),
		sessions: c.sessions.Snapshot(),
		statuses: c.statuses.Snapshot(),
		warnings: c.warnings.Snapshot(),
		pending:  c.pending.Snapshot(),
		cordons:  c.cordons.Snapshot(),
		ledgers:  c.ledgers.Snapshot(),
		holds:    map[string][]string{},
	}
	for _, it := range v.ledgers.List() {
		if node, ok := k.NodeName(it.Key); ok {
			for id := range it.Value.Allocations {
				v.holds[id] = append(v.holds[id], node)
			}
		}
	}
	var errs []error
	v.statuses.Range(func(it watcher.Item[statusView]) bool {
		id, ok := k.SessionID(it.Key)
		if !ok {
			return true
		}
		if err := c.session(ctx, v, id, it); err != nil {
			errs = append(errs, err)
		}
		return ctx.Err() == nil
	})
	errs = append(errs, c.requeueAll(ctx, v)...)
	// Warnings of sessions that are gone entirely.
	v.warnings.Range(func(it watcher.Item[state.Warning]) bool {
		id, ok := k.SessionID(it.Key)
		if _, has := v.statuses.Get(k.Status(id)); ok && !has {
			if err := c.withdraw(ctx, id, it.ModRevision, "session gone"); err != nil {
				errs = append(errs, err)
			}
		}
		return ctx.Err() == nil
	})
	if c.beforeResize != nil {
		c.beforeResize()
	}
	if err := c.resize(ctx, v); err != nil {
		errs = append(errs, err)
	}
	if err := c.preempt(ctx, v); err != nil {
		errs = append(errs, err)
	}
	c.pass.Add(1)
	return errors.Join(errs...)
}

// session applies the rules to one session.
func (c *Controller) session(ctx context.Context, v *view, id string, sit watcher.Item[statusView]) error {
	k := c.cfg.Keys
	st := sit.Value
	if !st.terminal && !st.waiting && !st.running && !st.starting {
		// Queued or stopping: no rule applies (the switch below would
		// return nil), so a pass over 100,000 queued sessions spends
		// nothing on them.
		return nil
	}
	spec, ok := v.sessions.Item(k.Session(id))
	if !ok {
		return nil
	}
	w, hasW := v.warnings.Item(k.Warning(id))
	// The status merger deletes the warning of an attempt that ended in
	// the transaction that writes the end: a warnings cache that has not
	// yet seen that revision still holds it, and nothing is to withdraw.
	ended := hasW && v.warnings.Revision() >= sit.ModRevision
	switch {
	case st.terminal:
		if ended {
			return c.withdraw(ctx, id, w.ModRevision, "session ended")
		}
		return nil
	case st.waiting:
		// Re-queued after the statuses are walked, several at once
		// (requeueAll).
		v.waiting = append(v.waiting, waitingSession{id: id, spec: spec, status: sit, warning: w, ended: ended})
		return nil
	case (!st.running && !st.starting) || spec.Value.stopping():
		// Not bound, or already stopping: a warning stays until the
		// session ends, so that its stream shows why it stopped.
		return nil
	}
	want := c.rules(v, id, spec.Value, st, w, hasW)
	switch {
	case want == nil && hasW:
		return c.withdraw(ctx, id, w.ModRevision, "cause gone")
	case want == nil:
		return nil
	case !hasW:
		want.Issued = v.now
		return c.warn(ctx, *want, 0)
	case want.Reason != w.Value.Reason || !want.StopAt.Equal(w.Value.StopAt) || want.Node != w.Value.Node || want.By != w.Value.By:
		want.Issued = v.now
		return c.warn(ctx, *want, w.ModRevision)
	case !v.now.Before(w.Value.StopAt):
		return c.evict(ctx, id, spec.ModRevision, w)
	}
	return nil
}

// rules returns the warning a bound, starting or running session should carry now, or nil:
// the one of its causes that stops it first.
func (c *Controller) rules(v *view, id string, s specView, st statusView, w watcher.Item[state.Warning], hasW bool) *state.Warning {
	k := c.cfg.Keys
	if hasW && w.Value.Reason == state.ReasonResized {
		return c.resizeStands(v, w.Value)
	}
	if hasW && w.Value.Reason == state.ReasonPreempted {
		// Stands while its preemptor still waits for the room.
		if _, waiting := v.pending.Get(k.Pending(w.Value.By)); waiting {
			cp := w.Value
			return &cp
		}
		return nil
	}
	var cands []state.Warning
	// Max runtime counts from the bind: a session whose start never
	// completes holds its GPUs from then (a status from before bind
	// times counts from its start).
	since := st.bound
	if since.IsZero() {
		since = st.started
	}
	if limit := c.maxRuntime(s); limit > 0 && !since.IsZero() {
		stopAt := since.Add(limit).UTC()
		if !v.now.Before(stopAt.Add(-c.cfg.StopWarning)) {
			cands = append(cands, state.Warning{Session: id, Reason: state.ReasonMaxRuntime, StopAt: stopAt,
				Message: fmt.Sprintf("reaches its max runtime of %s at %s and will be stopped then; its owner may extend it (voyager session extend %s <duration>)",
					limit, stopAt.Format(time.RFC3339), id)})
		}
	}
	if s.notebook && st.running { // idleness and drains stop running notebooks only
		if timeout := c.idleTimeout(s); timeout > 0 && st.sampled {
			last := st.lastActive
			if !st.started.IsZero() && st.started.After(last) {
				last = st.started
			}
			if idle := v.now.Sub(last); idle >= timeout {
				stopAt := v.now.Add(c.cfg.StopWarning)
				if hasW && w.Value.Reason == state.ReasonIdle {
					stopAt = w.Value.StopAt // the time already promised
				}
				cands = append(cands, state.Warning{Session: id, Reason: state.ReasonIdle, StopAt: stopAt,
					Message: fmt.Sprintf("idle since %s (no Jupyter activity, no busy kernel, no busy GPU; idle timeout %s); it will be stopped at %s unless it is used before then",
						last.Format(time.RFC3339), timeout, stopAt.Format(time.RFC3339))})
			}
		}
		nodes := append([]string(nil), v.holds[id]...)
		sort.Strings(nodes)
		for _, node := range nodes {
			cd, ok := v.cordons.Get(k.Cordon(node))
			if !ok || !cd.Drain {
				continue
			}
			stopAt := cd.Since.Add(c.cfg.DrainDeadline).UTC()
			if cd.Deadline != nil {
				stopAt = cd.Deadline.UTC()
			}
			why := ""
			if cd.Reason != "" {
				why = " (" + cd.Reason + ")"
			}
			cands = append(cands, state.Warning{Session: id, Reason: state.ReasonDrained, StopAt: stopAt, Node: node,
				Message: fmt.Sprintf("node %s is being drained%s; notebook sessions there will be stopped at %s (batch sessions run to completion)",
					node, why, stopAt.Format(time.RFC3339))})
		}
	}
	if len(cands) == 0 {
		return nil
	}
	first := cands[0]
	for _, cd := range cands[1:] {
		if cd.StopAt.Before(first.StopAt) {
			first = cd
		}
	}
	return &first
}

// maxRuntime is s's limit: its own, else the cluster default.
func (c *Controller) maxRuntime(s specView) time.Duration {
	if d := s.maxRuntime; d > 0 {
		return d
	}
	return c.cfg.MaxRuntime
}

// idleTimeout is s's idle timeout: its own (or its profile's, copied at
// create), else the cluster default.
func (c *Controller) idleTimeout(s specView) time.Duration {
	if d := s.idleTimeout; d > 0 {
		return d
	}
	return c.cfg.IdleTimeout
}

// warn writes w, if the warning key is still at rev (0: absent).
func (c *Controller) warn(ctx context.Context, w state.Warning, rev int64) error {
	k := c.cfg.Keys
	val, err := state.Encode(w)
	if err != nil {
		return fmt.Errorf("warn session %s: %w", w.Session, err)
	}
	cmp := clientv3.Compare(clientv3.ModRevision(k.Warning(w.Session)), "=", rev)
	r, err := c.cli.Txn(ctx).If(cmp).Then(clientv3.OpPut(k.Warning(w.Session), val)).Commit()
	if err != nil {
		return fmt.Errorf("warn session %s: %w", w.Session, err)
	}
	if !r.Succeeded {
		c.conflicts.Add(1)
		return nil
	}
	c.warned.Add(1)
	c.log.Info("session warned", "session", w.Session, "reason", w.Reason, "stopAt", w.StopAt, "message", w.Message)
	return nil
}

// withdraw deletes session id's warning, if still at rev.
func (c *Controller) withdraw(ctx context.Context, id string, rev int64, why string) error {
	k := c.cfg.Keys
	r, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(k.Warning(id)), "=", rev)).
		Then(clientv3.OpDelete(k.Warning(id))).Commit()
	if err != nil {
		return fmt.Errorf("withdraw warning of %s: %w", id, err)
	}
	if !r.Succeeded {
		c.conflicts.Add(1)
		return nil
	}
	c.withdrawn.Add(1)
	c.log.Info("warning withdrawn", "session", id, "why", why)
	return nil
}

// evict writes the spec's eviction for the warning whose deadline passed,
// if neither the spec (read at specRev) nor the warning changed since
// read. The warning stays until the session has stopped.
func (c *Controller) evict(ctx context.Context, id string, specRev int64, w watcher.Item[state.Warning]) error {
	k := c.cfg.Keys
	whole, ok, err := c.readWhole(ctx, id, specRev, 0)
	if err != nil {
		return fmt.Errorf("evict session %s: %w", id, err)
	}
	if !ok {
		c.conflicts.Add(1)
		return nil
	}
	s := whole.spec
	view := viewSpec(s)
	ev := &state.Eviction{Reason: w.Value.Reason, At: c.cfg.Now().UTC(), By: w.Value.By,
		Requeue: w.Value.Reason == state.ReasonPreempted || w.Value.Reason == state.ReasonResized}
	switch w.Value.Reason {
	case state.ReasonIdle:
		ev.Message = fmt.Sprintf("stopped after being idle past its idle timeout of %s", c.idleTimeout(view))
	case state.ReasonMaxRuntime:
		ev.Message = fmt.Sprintf("stopped at its max runtime of %s", c.maxRuntime(view))
	case state.ReasonDrained:
		ev.Message = fmt.Sprintf("stopped because node %s is drained", w.Value.Node)
	case state.ReasonPreempted:
		ev.Message = preemptedMessage(w.Value) // teampreempt.go
	case state.ReasonResized:
		if !resizeSpec(&s, w.Value, ev) {
			// Not elastic, or the size is out of its range: never
			// evicted for it.
			return c.withdraw(ctx, id, w.ModRevision, "resize out of the job's range")
		}
		if st, ok := c.statuses.Get(k.Status(id)); ok {
			s.Elastic.Goodput = st.goodput // the next size's status starts with it
		}
	}
	s.Eviction = ev
	val, err := state.Encode(s)
	if err != nil {
		return fmt.Errorf("evict session %s: %w", s.ID, err)
	}
	r, err := c.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(k.Session(s.ID)), "=", specRev),
		clientv3.Compare(clientv3.ModRevision(k.Warning(s.ID)), "=", w.ModRevision),
	).Then(clientv3.OpPut(k.Session(s.ID), val)).Commit()
	if err != nil {
		return fmt.Errorf("evict session %s: %w", s.ID, err)
	}
	if !r.Succeeded {
		c.conflicts.Add(1)
		return nil
	}
	c.evicted.Add(1)
	switch ev.Reason {
	case state.ReasonPreempted:
		c.preempted.Add(1)
		c.teamPreempts.count(s.Team, w.Value)
	case state.ReasonResized:
		c.resized.Add(1)
	}
	c.log.Info("session evicted", "session", s.ID, "reason", ev.Reason, "message", ev.Message)
	return nil
}

// requeue puts a session waiting to restart back in the queue once its
// time came and every part of it has been released.
func (c *Controller) requeue(ctx context.Context, v *view, id string, spec watcher.Item[specView], sit watcher.Item[statusView]) error {
	if spec.Value.stopped {
		// Stopped while its agent released it (during an eviction's
		// grace, or between a failure and its release): end it, as the
		// stop would have (EventCancel), never leave it waiting.
		out, err := state.StopSession(ctx, c.cli, c.cfg.Keys, id, "its owner (while it was being released)", v.now)
		if err != nil {
			return fmt.Errorf("end stopped session %s: %w", id, err)
		}
		c.log.Info("waiting session ended: its owner had stopped it", "session", id, "outcome", out)
		return nil
	}
	if v.now.Before(sit.Value.retryAt) || len(v.holds[id]) > 0 {
		return nil
	}
	if _, queued := v.pending.Get(c.cfg.Keys.Pending(id)); queued {
		return nil
	}
	whole, ok, err := c.readWhole(ctx, id, spec.ModRevision, sit.ModRevision)
	if err != nil {
		return fmt.Errorf("requeue session %s: %w", id, err)
	}
	if !ok {
		c.conflicts.Add(1)
		return nil
	}
	s, st := whole.spec, whole.status
	attempt, msg := st.Attempt, "re-queued"
	switch st.Reason {
	case state.ReasonBackOff:
		attempt++
		msg = fmt.Sprintf("re-queued after a failure: restart %d of %d", attempt, s.Restart.MaxRestarts)
	case state.ReasonFenced:
		attempt++
		msg = fmt.Sprintf("re-queued after its attempt was fenced: restart %d of %d", attempt, s.Restart.MaxRestarts)
	case state.ReasonResized:
		msg = resizedMessage(s)
	case state.ReasonPreempted:
		msg = "re-queued after being preempted"
		switch {
		case s.Eviction != nil && strings.HasPrefix(s.Eviction.Message, "preempted by "):
			msg = "re-queued after being " + s.Eviction.Message
		case s.Eviction != nil && s.Eviction.By != "":
			msg += " by " + s.Eviction.By
		}
	}
	ok, err = state.Requeue(ctx, c.cli, c.cfg.Keys, s, spec.ModRevision, st, sit.ModRevision, attempt, msg, v.now)
	if err != nil {
		return err
	}
	if !ok {
		c.conflicts.Add(1)
		return nil
	}
	c.requeued.Add(1)
	c.log.Debug("session re-queued", "session", s.ID, "attempt", attempt, "reason", st.Reason)
	return nil
}

// preempt plans preemptions for waiting sessions and warns their victims.
func (c *Controller) preempt(ctx context.Context, v *view) error {
	k := c.cfg.Keys
	if v.pending.Len() == 0 || !c.preemptible(v) {
		return nil
	}
	snap := placer.SnapshotOf(k, placer.Caches{
		Nodes: c.nodes.Snapshot(), Ledgers: v.ledgers, Cordons: v.cordons,
		Quotas: c.quotas.Snapshot(), Pending: v.pending, Warnings: v.warnings, Teams: c.teams.Snapshot(),
	}, v.now)
	// Room that stopping sessions are about to free is not worth
	// preempting anyone for: count it free.
	for i := range snap.Nodes {
		n := &snap.Nodes[i]
		var drop []string
		for id := range n.Ledger.Allocations {
			if s, ok := v.sessions.Get(k.Session(id)); ok && s.stopping() {
				drop = append(drop, id)
			}
		}
		if len(drop) > 0 {
			allocs := make(map[string]state.Allocation, len(n.Ledger.Allocations))
			for id, a := range n.Ledger.Allocations {
				allocs[id] = a
			}
			for _, id := range drop {
				delete(allocs, id)
			}
			n.Ledger.Allocations = allocs
		}
	}
	opt := placer.PreemptOptions{Notebooks: c.cfg.PreemptNotebooks, Victims: map[string]bool{}, Preemptors: map[string]bool{}}
	// Elastic jobs shrink rather than stop, and sessions a shrink serves
	// wait for it: no fixed-size work is preempted for them.
	for id := range v.elastic {
		opt.Victims[id] = true
	}
	for id := range v.owed {
		opt.Preemptors[id] = true
	}
	v.warnings.Range(func(it watcher.Item[state.Warning]) bool {
		if it.Value.Reason == state.ReasonPreempted {
			opt.Victims[it.Value.Session] = true
			opt.Preemptors[it.Value.By] = true
		}
		return true
	})
	plan := placer.NewPlan(snap, c.cfg.Plan)
	var errs []error
	for _, p := range placer.PlanPreemption(snap, plan, opt) {
		if err := c.warnVictims(ctx, v, p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// preemptible reports whether any running preemptible session has a lower
// priority than some pending one, or, with teams, whether any runs at
// all (a team below its guarantee may reclaim it): the cheap test before
// planning.
func (c *Controller) preemptible(v *view) bool {
	if c.teams.Len() > 0 {
		for _, it := range v.ledgers.List() {
			for _, a := range it.Value.Allocations {
				if a.Preemptible {
					return true
				}
			}
		}
		return false
	}
	top, found := 0, false
	v.pending.Range(func(it watcher.Item[state.QueueEntry]) bool {
		if !found || it.Value.Priority > top {
			top, found = it.Value.Priority, true
		}
		return true
	})
	for _, it := range v.ledgers.List() {
		for _, a := range it.Value.Allocations {
			if a.Preemptible && a.Priority < top {
				return true
			}
		}
	}
	return false
}

// warnVictims warns every victim of p in one transaction, conditional on
// the preemptor still waiting unchanged and each victim's warning being
// what was read. The same transaction writes the node into the
// preemptor's queue entry (state.QueueEntry.Hold): the placers keep its
// room for the preemptor after the victims' warnings are gone, until it
// binds or its victims' stop time and one more grace have passed
// (placer/preempthold.go).
func (c *Controller) warnVictims(ctx context.Context, v *view, p placer.Preemption) error {
	k := c.cfg.Keys
	e := p.Preemptor.Entry
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.Pending(e.Session)), "=", p.Preemptor.Revision)}
	stopAt := v.now.Add(c.cfg.PreemptGrace)
	held := *e
	held.Hold = &state.QueueHold{Node: p.Node, Until: stopAt.Add(c.cfg.PreemptGrace).UTC()}
	entry, err := state.Encode(held)
	if err != nil {
		return fmt.Errorf("warn victims of %s: %w", e.Session, err)
	}
	ops := []clientv3.Op{clientv3.OpPut(k.Pending(e.Session), entry)}
	for _, vi := range p.Victims {
		var rev int64
		if w, ok := v.warnings.Item(k.Warning(vi.Session)); ok {
			rev = w.ModRevision
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Warning(vi.Session)), "=", rev))
		msg := fmt.Sprintf("preempted: %s (priority %d, above this session's %d) needs its room on %s; this session will be stopped at %s and re-queued",
			e.Session, e.Priority, vi.Allocation.Priority, p.Node, stopAt.Format(time.RFC3339))
		if vi.Reason != "" { // a team reclaims (placer/reclaim.go)
			msg = fmt.Sprintf("preempted: %s; %s needs its room on %s; this session will be stopped at %s and re-queued",
				vi.Reason, e.Session, p.Node, stopAt.Format(time.RFC3339))
		}
		w := state.Warning{Session: vi.Session, Reason: state.ReasonPreempted, Issued: v.now, StopAt: stopAt, Node: p.Node, By: e.Session,
			Message: msg, Why: vi.Reason}
		if vi.Reason != "" {
			w.Reclaim = e.Team
		}
		val, err := state.Encode(w)
		if err != nil {
			return fmt.Errorf("warn victims of %s: %w", e.Session, err)
		}
		ops = append(ops, clientv3.OpPut(k.Warning(vi.Session), val))
	}
	r, err := c.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("warn victims of %s: %w", e.Session, err)
	}
	if !r.Succeeded {
		c.conflicts.Add(1)
		return nil
	}
	c.warned.Add(int64(len(p.Victims)))
	ids := make([]string, len(p.Victims))
	for i, vi := range p.Victims {
		ids[i] = vi.Session
	}
	c.log.Info("preemption planned", "preemptor", e.Session, "priority", e.Priority, "node", p.Node, "victims", ids, "stopAt", stopAt)
	return nil
}
