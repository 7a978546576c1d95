package placer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

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
	// UsageHalfLife, when above zero, makes the placer read the daily
	// GPU-hours (gpuhours/) and add each team's usage decayed with this
	// half-life to its share in the order (Snapshot.TeamUsage). Zero:
	// the order knows only what teams hold now.
	UsageHalfLife time.Duration
	// RuntimeEstimates makes the placer read the owners' recent run times
	// (runtimes/, which the usage accountant learns) into
	// Snapshot.Runtimes, from which it estimates when sessions end
	// (state.Allocation.Expects). Off, the zero value: no estimates, and
	// nodes drain by their sessions' max runtimes alone. The process
	// turns it on by default (VOYAGER_PLACER_RUNTIME_ESTIMATES).
	RuntimeEstimates bool
	// Logger receives structured logs. Default slog.Default().
	Logger *slog.Logger
	// Now is the clock. Default time.Now.
	Now func() time.Time

	// start, when set, holds the first pass until it is closed, after the
	// caches have synced (Ready): a benchmark starts several placers'
	// first passes together, from a collected heap.
	start <-chan struct{}
	// usageSweepEvery is how often the active placer sweeps the usage
	// marks of placers gone (usagesweep.go). Default a minute.
	usageSweepEvery time.Duration
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
	if c.usageSweepEvery <= 0 {
		c.usageSweepEvery = defaultUsageSweepEvery
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
	teams   *watcher.Cache[state.Team]
	placers *watcher.Cache[state.Placer]
	// usage is the daily GPU-hours, read with Config.UsageHalfLife only
	// (nil without); decay caches what it gives (teams.go).
	usage *watcher.Cache[state.UsageDay]
	decay decayCache
	// runtimes is the owners' run times, read with
	// Config.RuntimeEstimates only (nil without); runtimesMap is the
	// Snapshot.Runtimes the loop built from it at runtimesRev, kept
	// while the cache's revision stays (loop.go, runtimeRecords).
	runtimes    *watcher.Cache[state.RuntimeRecord]
	runtimesRev int64
	runtimesMap map[string]*state.RuntimeRecord
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
		teams:    sc.Teams,
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
	if cfg.UsageHalfLife > 0 {
		p.usage = watcher.New(cli, k.GPUHoursDir(), watcher.JSON[state.UsageDay], wopt("gpuhours"))
	}
	if cfg.RuntimeEstimates {
		p.runtimes = watcher.New(cli, k.RuntimesDir(), watcher.JSON[state.RuntimeRecord], wopt("runtimes"))
	}
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
	p.teams.AddHandler(func(ev watcher.Event[state.Team]) { note(ev.Revision) })
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
		runCache(p.teams.Run)
		runCache(p.warnings.Run)
	}
	runCache(p.placers.Run)
	if p.usage != nil {
		runCache(p.usage.Run)
	}
	if p.runtimes != nil {
		runCache(p.runtimes.Run)
	}
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
	wg.Go(func() { p.sweepUsage(ctx) })

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
