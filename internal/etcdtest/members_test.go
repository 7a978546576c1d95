package etcdtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
)

// TestMembersSurviveALeadersDeath: a 3-member cluster answers, its leader
// killed another leads and a write commits, and the killed member comes
// back with its data and serves that write; on loopback TCP, and on unix
// sockets (MembersOptions.Unix), where a client that dials through a Link
// writes too.
func TestMembersSurviveALeadersDeath(t *testing.T) {
	for _, unix := range []bool{false, true} {
		t.Run(map[bool]string{false: "tcp", true: "unix"}[unix], func(t *testing.T) {
			membersSurviveALeadersDeath(t, unix)
		})
	}
}

func membersSurviveALeadersDeath(t *testing.T, unix bool) {
	m := etcdtest.StartMembersWith(t, 3, etcdtest.MembersOptions{Unix: unix})
	for _, ep := range m.Endpoints {
		if got := strings.HasPrefix(ep, "unix:///"); got != unix {
			t.Fatalf("endpoint %q: unix:/// %v, want %v", ep, got, unix)
		}
	}
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
	linked, err := clientv3.New(clientv3.Config{Endpoints: m.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{etcdtest.NewLink().DialOption()}})
	if err != nil {
		t.Fatal(err)
	}
	defer linked.Close()
	if _, err := linked.Put(ctx, "linked", "too"); err != nil {
		t.Fatalf("write through a link: %v", err)
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
