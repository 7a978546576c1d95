package api

import (
	"sync"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// The queue view plans as the placers plan (cluster.go's queuePlan): with
// VOYAGER_PLACER_RUNTIME_ESTIMATES on (the process default), placers read
// the owners' recent run times (runtimes/, which the usage accountant
// learns) into Snapshot.Runtimes, and a session their plan binds whose
// owner's runs of its size declared far more than they ran is expected to
// end by the longest of them (Allocation.Expects): it may backfill a node
// held for a large request where its max runtime alone would not, and the
// held request's reason then says when the node is expected to have room
// "by its sessions' max runtimes and their owners' recent run times". So
// the API, given the same setting (Config.RuntimeEstimates), watches
// runtimes/ too and plans with the same records: the reasons and
// positions users see are the placers', not those of a plan by max
// runtimes alone.

// runtimesMemo is the Snapshot.Runtimes last built from the runtimes
// cache, at rev: queue plans and team standings (teamstanding.go) build
// snapshots concurrently, hence the lock.
type runtimesMemo struct {
	mu  sync.Mutex
	rev int64
	m   map[string]*state.RuntimeRecord
}

// runtimeRecords is Snapshot.Runtimes: each owner's record in the
// runtimes cache, by owner; nil when run-time estimates are off. As the
// placer's loop does (placer/loop.go), the map is built again only when
// the cache's revision moved since the last build, so a plan at 10,000
// owners whose records did not change builds nothing. The map and the
// records are shared between plans and with the cache
// (placer.RuntimesOf): read them, never change them.
func (a *API) runtimeRecords() map[string]*state.RuntimeRecord {
	if a.ownerRuns == nil {
		return nil
	}
	snap := a.ownerRuns.Snapshot()
	memo := &a.runsMemo
	memo.mu.Lock()
	defer memo.mu.Unlock()
	if memo.m != nil && snap.Revision() == memo.rev {
		return memo.m
	}
	memo.rev, memo.m = snap.Revision(), placer.RuntimesOf(a.keys, snap)
	return memo.m
}

// runtimesRevision is the revision of the run times the queue plan read;
// 0 with run-time estimates off.
func (a *API) runtimesRevision() int64 {
	if a.ownerRuns == nil {
		return 0
	}
	return a.ownerRuns.Revision()
}
