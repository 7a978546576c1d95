package merger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/ctxwait"
	"github.com/voyager-gpu/voyager/internal/promfunc"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// DefaultSettle is Config.Settle's default.
const DefaultSettle = 100 * time.Millisecond

// Config configures a Merger.
type Config struct {
	Keys state.Keys
	// Workers is how many sessions are merged at once (default 4).
	Workers int
	// Resync is how often every known part is merged again, which deletes
	// parts left behind by a status that went away (default 30 s).
	Resync time.Duration
	// Settle is how long a session waits after its first part change
	// before it is merged, so that a part's quick succession of changes
	// (launched, running, ended: a short job's whole life) is read and
	// written as one merge, not one each (default 100 ms; negative: at
	// once). A status lags its parts by about this much.
	Settle time.Duration
	// Member is the id under placers/ of the placer process this merger
	// runs in (placer.Placer.ID). Set, the live placers' mergers share the
	// sessions (rendezvous hashing over placers/, share.go): a part's
	// change is merged at once only by the merger whose share its session
	// is, by the others at their resync; when the live placers change,
	// each merges at once every known part newly in its share, so a
	// placer that dies delays its share's merges by at most its lease.
	// Empty (a process without a placer), every change is merged at once.
	Member string
	Logger *slog.Logger
}

// Merger folds part statuses into session statuses. Build one with New
// and call Run.
type Merger struct {
	cli   *clientv3.Client
	cfg   Config
	log   *slog.Logger
	parts *watcher.Cache[state.PartStatus]
	// placers and share are set with Config.Member (share.go); share is
	// guarded by mu.
	placers *watcher.Cache[state.Placer]
	share   *share

	mu    sync.Mutex
	dirty map[string]map[string]bool // session → nodes whose parts changed
	// seen is, for a dirty session, the latest revision of the part
	// changes that made it dirty (0: a resync or a change of the share,
	// which read the latest state): a read at or after it may be served
	// by any member (Merge's serializable read).
	seen map[string]int64
	// due is when a dirty session is merged (Config.Settle after its
	// first change).
	due  map[string]time.Time
	busy map[string]bool
	wake chan struct{}

	merges, writes, conflicts atomic.Int64
}

// New returns a Merger over cli. It does nothing until Run.
func New(cli *clientv3.Client, cfg Config) *Merger {
	if cfg.Workers <= 0 {
		cfg.Workers = 4
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.Settle == 0 {
		cfg.Settle = DefaultSettle
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	m := &Merger{cli: cli, cfg: cfg, log: cfg.Logger.With("component", "merger"),
		dirty: map[string]map[string]bool{}, seen: map[string]int64{}, due: map[string]time.Time{}, busy: map[string]bool{}, wake: make(chan struct{}, 1)}
	m.parts = watcher.New(cli, cfg.Keys.Parts(), watcher.JSON[state.PartStatus], watcher.Options{Name: "parts", Logger: cfg.Logger})
	m.parts.AddHandler(func(ev watcher.Event[state.PartStatus]) {
		// A part's deletion has nothing to merge: a merger deletes the
		// parts it folded into an ended status, a release the part of a
		// retired session, a node loss the parts whose status it wrote.
		if ev.Type == watcher.Deleted {
			return
		}
		if node, id, ok := cfg.Keys.PartKey(ev.Key); ok && m.owns(id) {
			m.enqueueAt(id, node, ev.Revision)
		}
	})
	if cfg.Member != "" {
		m.share = &share{member: cfg.Member, ids: []string{cfg.Member}}
		m.placers = newPlacersCache(m)
	}
	return m
}

// Merges returns how many merges ran.
func (m *Merger) Merges() int64 { return m.merges.Load() }

// Collectors are the merger's Prometheus metrics, for the process's
// registry.
func (m *Merger) Collectors() []prometheus.Collector {
	set := promfunc.Set{Subsystem: "merger"}
	return []prometheus.Collector{
		set.Counter("merges_total", "Merges of a session's parts run.", m.merges.Load),
		set.Counter("writes_total", "Merges that wrote a status or deleted parts.", m.writes.Load),
		set.Counter("conflicts_total", "Merges refused because a status, spec or part moved since read; merged again.", m.conflicts.Load),
	}
}

// Writes returns how many merges wrote a status or deleted a part.
func (m *Merger) Writes() int64 { return m.writes.Load() }

// Run watches parts/ and merges until ctx ends.
func (m *Merger) Run(parent context.Context) error {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := m.parts.Run(ctx); err != nil {
			errc <- fmt.Errorf("watch parts: %w", err)
		}
	}()
	if m.placers != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.placers.Run(ctx); err != nil {
				errc <- fmt.Errorf("watch placers: %w", err)
			}
		}()
	}
	for range m.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.work(ctx)
		}()
	}
	tick := time.NewTicker(m.cfg.Resync)
	defer tick.Stop()
	var err error
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case err = <-errc:
			break loop
		case <-tick.C:
			for _, it := range m.parts.List() {
				if node, id, ok := m.cfg.Keys.PartKey(it.Key); ok {
					m.enqueue(id, node)
				}
			}
		}
	}
	cancel()
	wg.Wait()
	if err != nil && parent.Err() == nil {
		return err
	}
	return nil
}

func (m *Merger) enqueue(id, node string) { m.enqueueAt(id, node, 0) }

// enqueueAt marks session id dirty for node's part, changed at revision
// rev (0: unknown; the merge then reads the latest state).
func (m *Merger) enqueueAt(id, node string, rev int64) {
	m.mu.Lock()
	if m.dirty[id] == nil {
		m.dirty[id] = map[string]bool{}
		m.seen[id] = rev
		m.due[id] = time.Now().Add(max(m.cfg.Settle, 0))
	}
	m.dirty[id][node] = true
	if rev == 0 || m.seen[id] == 0 {
		m.seen[id] = 0
	} else {
		m.seen[id] = max(m.seen[id], rev)
	}
	m.mu.Unlock()
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// take returns a dirty session that is due and that no other worker
// merges, the nodes whose parts changed and the revision of those changes
// (enqueueAt); or, when none is, the time the next one is due (zero when
// none is dirty).
func (m *Merger) take() (string, []string, int64, time.Time, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var next time.Time
	for id, nodes := range m.dirty {
		if m.busy[id] {
			continue
		}
		if at := m.due[id]; at.After(now) {
			if next.IsZero() || at.Before(next) {
				next = at
			}
			continue
		}
		seen := m.seen[id]
		delete(m.dirty, id)
		delete(m.seen, id)
		delete(m.due, id)
		m.busy[id] = true
		var ns []string
		for n := range nodes {
			ns = append(ns, n)
		}
		if len(m.dirty) > 0 {
			select {
			case m.wake <- struct{}{}:
			default:
			}
		}
		return id, ns, seen, time.Time{}, true
	}
	return "", nil, 0, next, false
}

func (m *Merger) done(id string) {
	m.mu.Lock()
	delete(m.busy, id)
	again := len(m.dirty[id]) > 0
	m.mu.Unlock()
	if again {
		select {
		case m.wake <- struct{}{}:
		default:
		}
	}
}

func (m *Merger) work(ctx context.Context) {
	for {
		id, nodes, seen, next, ok := m.take()
		if !ok {
			var due <-chan time.Time
			var t *time.Timer
			if !next.IsZero() {
				t = time.NewTimer(time.Until(next))
				due = t.C
			}
			select {
			case <-ctx.Done():
			case <-m.wake:
			case <-due:
			}
			if t != nil {
				t.Stop()
			}
			if ctx.Err() != nil {
				return
			}
			continue
		}
		for attempt := 0; ctx.Err() == nil; attempt++ {
			// The first try may read from any member, at or after the
			// changes' revision; a conflict reads the leader's latest.
			err := m.merge(ctx, id, seen, nodes)
			seen = 0
			if err == nil {
				break
			}
			if errors.Is(err, state.ErrConflict) && attempt < 16 {
				m.conflicts.Add(1)
				continue
			}
			if ctx.Err() == nil {
				m.log.Warn("merge parts; retrying", "session", id, "err", err)
				ctxwait.Sleep(ctx, time.Second)
				m.enqueue(id, nodes[0])
			}
			break
		}
		m.done(id)
	}
}

// Merge reads session id's status, spec and parts (those of the status's
// nodes, and of the extra nodes whose parts changed) and, in one
// transaction that compares them all, writes the status the parts give
// (state.MergeParts) and deletes the parts done with. It returns
// state.ErrConflict, writing nothing, when something changed since read.
func (m *Merger) Merge(ctx context.Context, id string, extra ...string) error {
	return m.merge(ctx, id, 0, extra)
}

// merge is Merge. With seen > 0 (the revision of the part changes that
// called for it) it first reads serializably, from whichever member the
// client asks, and uses that read if the member had applied seen: what
// it decides then is no older than the changes (a later change calls for
// another merge), and its transaction compares what it read as Merge's
// does. Otherwise, or from a member behind seen, it reads linearizably.
func (m *Merger) merge(ctx context.Context, id string, seen int64, extra []string) error {
	m.merges.Add(1)
	k := m.cfg.Keys
	sk, pk := k.Status(id), k.Session(id)
	// One round trip reads the status, the spec and the parts that
	// changed; a gang's other parts, named by the status, follow at the
	// same revision, so that the decision rests on one snapshot.
	nodes := slices.Compact(slices.Sorted(slices.Values(extra)))
	keys := []string{sk, pk}
	for _, n := range nodes {
		keys = append(keys, k.Part(n, id))
	}
	read, err := state.ReadAtLeast(ctx, m.cli, seen, func(opts ...clientv3.OpOption) []clientv3.Op {
		ops := make([]clientv3.Op, len(keys))
		for i, key := range keys {
			ops[i] = clientv3.OpGet(key, opts...)
		}
		return ops
	})
	if err != nil {
		return fmt.Errorf("merge %s: %w", id, err)
	}
	kvs := state.FirstKVs(read)
	skv, pkv := kvs[0], kvs[1]
	partKVs := kvs[2:]
	var st state.Status
	if skv != nil {
		if st, err = state.Decode[state.Status](skv.Value); err != nil {
			return fmt.Errorf("merge %s: %w", id, err)
		}
	}
	var more []clientv3.Op
	for _, n := range st.Nodes {
		if !slices.Contains(nodes, n) {
			nodes = append(nodes, n)
			more = append(more, clientv3.OpGet(k.Part(n, id), clientv3.WithRev(read.Header.Revision)))
		}
	}
	if len(more) > 0 {
		r, err := m.cli.Txn(ctx).Then(more...).Commit()
		if err != nil {
			return fmt.Errorf("merge %s: %w", id, err)
		}
		partKVs = append(partKVs, state.FirstKVs(r)...)
	}
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(sk), "=", state.ModRevision(skv)),
		clientv3.Compare(clientv3.ModRevision(pk), "=", state.ModRevision(pkv)),
	}
	var wops []clientv3.Op
	var current []state.PartStatus
	currentKey := map[string]string{}
	for i, n := range nodes {
		key, kv := k.Part(n, id), partKVs[i]
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", state.ModRevision(kv)))
		if kv == nil {
			continue
		}
		p, err := state.Decode[state.PartStatus](kv.Value)
		if err != nil || skv == nil || pkv == nil || !st.Current(p) {
			wops = append(wops, clientv3.OpDelete(key)) // stale or unreadable
			continue
		}
		current = append(current, p)
		currentKey[p.Node] = key
	}
	next := st
	if skv != nil && pkv != nil {
		spec, err := state.Decode[state.Session](pkv.Value)
		if err != nil {
			return fmt.Errorf("merge %s: %w", id, err)
		}
		ev, s, changed, err := state.MergeParts(spec, st, current, time.Now().UTC())
		switch {
		case errors.Is(err, state.ErrIllegalTransition):
			m.log.Debug("parts not merged", "session", id, "err", err)
		case err != nil:
			return fmt.Errorf("merge %s: %w", id, err)
		case changed:
			public, _ := state.SplitSecrets(s) // parts carry none; never let one through
			v, err := state.Encode(public)
			if err != nil {
				return fmt.Errorf("merge %s: %w", id, err)
			}
			wops = append(wops, clientv3.OpPut(sk, v))
			next = s
			m.log.Debug("status merged", "session", id, "event", ev, "phase", s.Phase)
		}
	}
	if next.Phase.Terminal() || next.Phase == state.PhasePending {
		// The session ended for these parts: those that ended too are
		// done with; the others are deleted when their agents report
		// their end.
		for _, p := range current {
			if p.Ended() {
				wops = append(wops, clientv3.OpDelete(currentKey[p.Node]))
			}
		}
		// So is a lifecycle warning that it would be stopped: the
		// attempt it warned of is over. Deleted with the status that
		// says so, it costs no transaction of its own (the lifecycle
		// controller withdraws a warning left, as ever).
		if len(wops) > 0 {
			wops = append(wops, clientv3.OpDelete(k.Warning(id)))
		}
	}
	if len(wops) == 0 {
		return nil
	}
	resp, err := m.cli.Txn(ctx).If(cmps...).Then(wops...).Commit()
	if err != nil {
		return fmt.Errorf("merge %s: %w", id, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("merge %s: %w", id, state.ErrConflict)
	}
	m.writes.Add(1)
	return nil
}
