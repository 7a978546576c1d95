package etcdtest_test

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
)

// TestMembersSurviveALeadersDeath: a 3-member cluster answers, its leader
// killed another leads and a write commits, and the killed member comes
// back with its data and serves that write.
func TestMembersSurviveALeadersDeath(t *testing.T) {
	m := etcdtest.StartMembers(t, 3)
	cli := m.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := m.Leader(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	m.Kill(l)
	var next int
	for next, err = m.Leader(ctx, cli); next < 0 || next == l; next, err = m.Leader(ctx, cli) {
		if ctx.Err() != nil {
			t.Fatalf("no new leader after %d died: %v", l, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if _, err := cli.Put(ctx, "after", "the kill"); err != nil {
		t.Fatalf("write after the leader's death: %v", err)
	}
	m.Restart(l)
	// Read from the restarted member alone, from its own store.
	one, err := clientv3.New(clientv3.Config{Endpoints: []string{m.Endpoints[l]}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	for {
		r, err := one.Get(ctx, "after", clientv3.WithSerializable())
		if err == nil && len(r.Kvs) == 1 {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("member %d did not come back with the write: %v", l, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
