package state_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestEnsureUID: an owner's user id is stable, in range, never another
// owner's, and concurrent first creates agree on it.
func TestEnsureUID(t *testing.T) {
	cli := etcdtest.New(t)
	k := state.MustKeys("/voyager")
	ctx := context.Background()
	now := time.Now()

	ada, err := state.EnsureUID(ctx, cli, k, "ada", now)
	if err != nil {
		t.Fatal(err)
	}
	if ada < state.UIDFirst || ada >= state.UIDFirst+state.UIDCount {
		t.Fatalf("ada's uid %d is outside %d+%d", ada, state.UIDFirst, state.UIDCount)
	}
	if again, err := state.EnsureUID(ctx, cli, k, "ada", now); err != nil || again != ada {
		t.Fatalf("ada's uid again: %d, %v; want %d", again, err, ada)
	}

	// An owner whose number is taken gets the next free one: the number
	// bob would get on an empty store is claimed first.
	bobFirst := func() uint32 {
		// What bob would get on an empty store.
		c2 := etcdtest.New(t)
		u, err := state.EnsureUID(ctx, c2, k, "bob", now)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}()
	if _, err := state.Put(ctx, cli, k.UIDNumber(bobFirst), state.UIDRecord{Owner: "mallory", UID: bobFirst}); err != nil {
		t.Fatal(err)
	}
	bob, err := state.EnsureUID(ctx, cli, k, "bob", now)
	if err != nil {
		t.Fatal(err)
	}
	if bob == bobFirst || bob == ada {
		t.Fatalf("bob got %d (taken by mallory: %d, ada's: %d)", bob, bobFirst, ada)
	}

	// Concurrent first creates of one owner agree.
	var wg sync.WaitGroup
	got := make([]uint32, 8)
	for i := range got {
		wg.Go(func() {
			u, err := state.EnsureUID(ctx, cli, k, "carol", now)
			if err != nil {
				t.Error(err)
			}
			got[i] = u
		})
	}
	wg.Wait()
	for _, u := range got {
		if u != got[0] {
			t.Fatalf("concurrent allocations disagree: %v", got)
		}
	}
	// Every number has exactly one owner record.
	resp, err := cli.Get(ctx, "/voyager/uids/numbers/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if n := len(resp.Kvs); n != 4 { // ada, mallory's claim, bob, carol
		t.Fatalf("%d uid numbers recorded; want 4: %v", n, fmt.Sprint(resp.Kvs))
	}
}
