package placer

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// SharedCaches are the watch caches of cluster state that a placer and the
// lifecycle controller of one process both read (the queue, nodes, ledgers,
// cordons, quotas and warnings), so the process lists and holds each prefix
// once: at 100,000 queued sessions and 10,000 nodes, a second copy of each
// cost hundreds of MiB and doubled the time to list them (issue 16 (d)).
// Build it first, hand it to placer.Config and the controller's config
// (they add their handlers while they are built), then run it beside them
// with Run.
type SharedCaches struct {
	Pending  *watcher.Cache[state.QueueEntry]
	Nodes    *watcher.Cache[state.Node]
	Ledgers  *watcher.Cache[state.Ledger]
	Cordons  *watcher.Cache[state.Cordon]
	Quotas   *watcher.Cache[state.Quota]
	Warnings *watcher.Cache[state.Warning]
	// Teams is the team tree (teams/), which orders the queue and caps
	// teams (teams.go) and lets preemption reclaim (reclaim.go).
	Teams *watcher.Cache[state.Team]

	// sent are the ledger values the process's placer has sent, which
	// the ledgers cache takes as they were encoded instead of decoding
	// them (the placer that is built last, if several share the caches).
	sent atomic.Pointer[ownWrites]
}

// NewSharedCaches builds the caches over cli under k, logging to log (nil:
// slog.Default()). They do nothing until Run.
func NewSharedCaches(cli *clientv3.Client, k state.Keys, log *slog.Logger) *SharedCaches {
	if log == nil {
		log = slog.Default()
	}
	wopt := func(name string) watcher.Options { return watcher.Options{Name: name, Logger: log} }
	s := &SharedCaches{
		Pending:  watcher.New(cli, k.PendingDir(), decodeQueueEntry(k), wopt("pending")),
		Nodes:    watcher.New(cli, k.Nodes(), decodeNode, wopt("nodes")),
		Cordons:  watcher.New(cli, k.Cordons(), watcher.JSON[state.Cordon], wopt("cordons")),
		Quotas:   watcher.New(cli, k.Quotas(), watcher.JSON[state.Quota], wopt("quotas")),
		Warnings: watcher.New(cli, k.Warnings(), watcher.JSON[state.Warning], wopt("warnings")),
		Teams:    watcher.New(cli, k.Teams(), watcher.JSON[state.Team], wopt("teams")),
	}
	s.Ledgers = watcher.New(cli, k.Ledgers(), s.decodeLedger, wopt("ledgers"))
	return s
}

// decodeLedger decodes a ledger value; one the placer sent, byte for byte,
// it takes as the placer encoded it. A burst rewrites each node's ledger,
// and each comes back through this cache: a placer alone decoded every
// ledger it had just written (about a tenth of its CPU in a burst).
func (s *SharedCaches) decodeLedger(key string, value []byte) (state.Ledger, error) {
	if o := s.sent.Load(); o != nil {
		if l, ok := o.sentLedger(key, value); ok {
			return l, nil
		}
	}
	return decodeLedger(key, value)
}

// runs lists the caches' Run methods.
func (s *SharedCaches) runs() []func(context.Context) error {
	return []func(context.Context) error{s.Pending.Run, s.Nodes.Run, s.Ledgers.Run, s.Cordons.Run, s.Quotas.Run, s.Warnings.Run, s.Teams.Run}
}

// Run keeps every cache current until ctx ends (then it returns nil) or
// one fails (then it stops the others and returns that failure).
func (s *SharedCaches) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, len(s.runs()))
	for _, run := range s.runs() {
		wg.Go(func() {
			if err := run(ctx); err != nil {
				errc <- err
				cancel()
			}
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		return fmt.Errorf("run shared caches: %w", err)
	}
	return nil
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
	// Teams, when set, is the team tree (Snapshot.Teams).
	Teams *watcher.Snapshot[state.Team]
}

// RuntimesOf is Snapshot.Runtimes from a cache of runtimes/: each owner's
// record by owner. The records are the cache's own (RangeShared), so the
// map must only be read; the placer and the API's queue view build it
// only when the cache's revision moved.
func RuntimesOf(k state.Keys, runs *watcher.Snapshot[state.RuntimeRecord]) map[string]*state.RuntimeRecord {
	dir := k.RuntimesDir()
	m := make(map[string]*state.RuntimeRecord, runs.Len())
	runs.RangeShared(func(it *watcher.Item[state.RuntimeRecord]) bool {
		m[strings.TrimPrefix(it.Key, dir)] = &it.Value
		return true
	})
	return m
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
					s.Held, s.Preempting = map[string]string{}, map[string]string{}
				}
				s.Held[w.Node] = w.By
				s.Preempting[w.Session] = w.By
			}
			return true
		})
	}
	s.Held = addEntryHolds(s.Held, s.Pending, now) // preempthold.go
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
	if c.Teams != nil {
		s.Teams = teamTreeOf(k, c.Teams, s.QuotaRevisions) // teams.go
	}
	return s
}
