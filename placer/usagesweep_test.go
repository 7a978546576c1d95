package placer

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// TestActivePlacerSweepsUsageMarksOfPlacersGone: the marks that placers
// gone left under a quota are deleted by the active placer, when its
// caches are ready and every Config.usageSweepEvery after; the mark of a placer
// still registered (a standby, registered after it) stays.
func TestActivePlacerSweepsUsageMarksOfPlacersGone(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx := context.Background()
	k := state.MustKeys(state.DefaultPrefix)
	at := time.Now().UTC()
	mark := func(id string) string {
		t.Helper()
		key := k.UsageMark(state.QuotaUsers, "ada", id)
		if _, err := state.Put(ctx, cli, key, state.UsageMark{Placer: id, Session: "s", At: at}); err != nil {
			t.Fatal(err)
		}
		return key
	}
	exists := func(key string) bool {
		r, err := cli.Get(ctx, key, clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return r.Count > 0
	}
	gone1, gone2 := mark("placer-gone-1"), mark("placer-gone-2")
	p, _, _ := runPlacer(t, c.Server.Endpoint(), Config{usageSweepEvery: 100 * time.Millisecond})
	eventually(t, 20*time.Second, "the marks of the placers gone swept", func() bool { return !exists(gone1) && !exists(gone2) })

	eventually(t, 20*time.Second, "the placer registered", func() bool { return exists(k.Placer(p.ID())) })
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	v, err := state.Encode(state.Placer{ID: "placer-standby"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, k.Placer("placer-standby"), v, clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	standby, gone3 := mark("placer-standby"), mark("placer-gone-3")
	eventually(t, 20*time.Second, "a later sweep", func() bool { return !exists(gone3) })
	if !exists(standby) {
		t.Error("the mark of a placer still registered was swept")
	}
}
