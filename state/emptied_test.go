package state_test

import (
	"context"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestReleaseRecordsWhenTheLedgerEmptied: a release that leaves
// allocations on the node writes no emptied record; the release that
// takes the last one deletes the ledger and writes emptied/<node> at the
// same revision, with the time of the release.
func TestReleaseRecordsWhenTheLedgerEmptied(t *testing.T) {
	cli := etcdtest.New(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	l := state.Ledger{Node: "n1", Allocations: map[string]state.Allocation{}}
	revs := map[string]int64{}
	for _, id := range []string{"a", "b"} {
		l.Allocations[id] = state.Allocation{Owner: "ada", Role: state.RoleSingle, GPUs: []string{"GPU-" + id}, CPUMilli: 1000}
		revs[id] = seedBound(t, cli, k, id)
	}
	if _, err := state.Put(ctx, cli, k.Ledger("n1"), l); err != nil {
		t.Fatal(err)
	}
	if err := state.Release(ctx, cli, k, "n1", "a", revs["a"], succeed); err != nil {
		t.Fatal(err)
	}
	if _, _, err := state.Get[state.Emptied](ctx, cli, k.Emptied("n1")); err == nil {
		t.Fatal("a release that left an allocation wrote an emptied record")
	}
	before := time.Now()
	if err := state.Release(ctx, cli, k, "n1", "b", revs["b"], succeed); err != nil {
		t.Fatal(err)
	}
	rec, rev, err := state.Get[state.Emptied](ctx, cli, k.Emptied("n1"))
	if err != nil {
		t.Fatalf("the last release wrote no emptied record: %v", err)
	}
	if rec.Node != "n1" || rec.Since.Before(before.Add(-time.Second)) || rec.Since.After(time.Now()) {
		t.Fatalf("emptied record %+v, want n1 at the release (after %v)", rec, before)
	}
	// The same transaction deleted the ledger: nothing is newer than the
	// record's revision.
	resp, err := cli.Get(ctx, k.Ledger("n1"))
	if err != nil || len(resp.Kvs) != 0 || resp.Header.Revision != rev {
		t.Fatalf("ledger %v (err %v) at revision %d, want it deleted at the record's revision %d", resp.Kvs, err, resp.Header.Revision, rev)
	}
	// EmptySince: never while a ledger exists; else the later of the
	// record and the agent's registration.
	reg := rec.Since.Add(-time.Hour)
	if _, ok := state.EmptySince(true, rec, true, reg); ok {
		t.Error("a node with a ledger is empty")
	}
	if s, ok := state.EmptySince(false, rec, true, reg); !ok || !s.Equal(rec.Since) {
		t.Errorf("empty since %v, want the record's %v", s, rec.Since)
	}
	if s, _ := state.EmptySince(false, rec, true, rec.Since.Add(time.Minute)); !s.Equal(rec.Since.Add(time.Minute)) {
		t.Errorf("a node registered after its record: empty since %v, want its registration", s)
	}
	if s, _ := state.EmptySince(false, state.Emptied{}, false, reg); !s.Equal(reg) {
		t.Errorf("a node without a record: empty since %v, want its registration", s)
	}
}
