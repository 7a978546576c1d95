package placer

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestSnapshotRuntimes: with Config.RuntimeEstimates a placer runs a cache
// of runtimes/ (its first pass waits for it) and gives every snapshot the
// owners' records by owner; the map is built again only when a record
// changed, kept otherwise. Off, there is no cache and no map.
func TestSnapshotRuntimes(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := state.MustKeys(state.DefaultPrefix)
	ended := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	put := func(owner string, secs int64) {
		t.Helper()
		rec := state.RuntimeRecord{Owner: owner, Samples: []state.RuntimeSample{{Session: "s-" + owner, QueueRevision: 1, GPUs: 2, Seconds: secs, Ended: ended}}}
		if _, err := state.Put(ctx, cli, k.Runtimes(owner), rec); err != nil {
			t.Fatal(err)
		}
	}
	put("ada", 3600)
	put("bob", 600)

	off := New(cli, Config{Keys: k, Logger: quietLogger()})
	if off.runtimes != nil || off.snapshot().Runtimes != nil {
		t.Error("RuntimeEstimates off: the placer reads runtimes/")
	}

	// Run whole, the placer's first pass waits for the cache.
	run, _, _ := runPlacer(t, c.Server.Endpoint(), Config{Keys: k, RuntimeEstimates: true})
	select {
	case <-run.Passed():
	case <-ctx.Done():
		t.Fatal("no first pass with RuntimeEstimates on")
	}
	if run.runtimes == nil || run.runtimes.Len() != 2 {
		t.Fatalf("the running placer's runtimes cache: %v", run.runtimes)
	}

	// Its snapshots, with only that cache run (no loop beside the test).
	p := New(cli, Config{Keys: k, RuntimeEstimates: true, Logger: quietLogger()})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- p.runtimes.Run(rctx) }()
	defer func() {
		stop()
		<-done
	}()
	if err := p.runtimes.WaitSynced(ctx); err != nil {
		t.Fatal(err)
	}
	first := p.snapshot().Runtimes
	if len(first) != 2 || secs(first["ada"]) != 3600 || secs(first["bob"]) != 600 {
		t.Fatalf("snapshot runtimes %v, want ada's and bob's by owner", first)
	}
	if again := p.snapshot().Runtimes; !sameMap(again, first) {
		t.Error("the map was built again with no record changed")
	}
	rev := p.runtimes.Revision()
	put("cyd", 60)
	for p.runtimes.Revision() == rev {
		select {
		case <-ctx.Done():
			t.Fatal("the cache never saw cyd's record")
		case <-time.After(10 * time.Millisecond):
		}
	}
	next := p.snapshot().Runtimes
	if sameMap(next, first) || len(next) != 3 || secs(next["cyd"]) != 60 {
		t.Errorf("after cyd's record: %v, want a new map with cyd's", next)
	}
	if len(first) != 2 {
		t.Errorf("the previous pass's map changed: %v", first)
	}
}

// secs is the run time of r's one sample (-1 without one).
func secs(r *state.RuntimeRecord) int64 {
	if r == nil || len(r.Samples) != 1 {
		return -1
	}
	return r.Samples[0].Seconds
}

// sameMap reports whether a and b are the same map (not merely equal).
func sameMap(a, b map[string]*state.RuntimeRecord) bool {
	if len(a) != len(b) {
		return false
	}
	const probe = "\x00probe"
	a[probe] = nil
	_, same := b[probe]
	delete(a, probe)
	return same
}
