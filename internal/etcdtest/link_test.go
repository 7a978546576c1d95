package etcdtest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
)

// TestLinkCutsLikeAPartition: a client through a Link works; cut, its
// calls hang (not fail fast) and etcd hears nothing from it (its lease,
// kept alive by the client, expires), and a client dialled during the cut
// hangs too; restored, both work again.
func TestLinkCutsLikeAPartition(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	obs := c.Client(t) // never cut
	link := etcdtest.NewLink()
	dial := func() *clientv3.Client {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{c.Server.Endpoint()}, DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
			DialOptions: []grpc.DialOption{link.DialOption()}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		return cli
	}
	cli := dial()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := cli.Put(ctx, "k", "before"); err != nil {
		t.Fatalf("put through the link: %v", err)
	}
	lease, err := cli.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	ka, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for range ka { // drained until the client closes
		}
	}()
	if _, err := cli.Put(ctx, "leased", "x", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}

	link.Cut()
	hangs := func(cli *clientv3.Client, what string) {
		t.Helper()
		cctx, ccancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer ccancel()
		start := time.Now()
		_, err := cli.Put(cctx, "k", "during")
		if err == nil {
			t.Fatalf("%s: a put went through the cut link", what)
		}
		if !errors.Is(err, context.DeadlineExceeded) && time.Since(start) < time.Second {
			t.Fatalf("%s: the put failed fast (%v after %s), want it to hang as in a partition", what, err, time.Since(start))
		}
	}
	hangs(cli, "the client")
	late := dial() // dialled while cut
	hangs(late, "a client dialled during the cut")
	// etcd hears no keep-alive: the lease expires and takes its key.
	for {
		r, err := obs.Get(ctx, "leased")
		if err == nil && len(r.Kvs) == 0 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the cut client's lease never expired: its keep-alives got through")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r, err := obs.Get(ctx, "k"); err != nil || string(r.Kvs[0].Value) != "before" {
		t.Fatalf("k after the cut = %v, %v; want before", r, err)
	}

	link.Restore()
	for _, cl := range []*clientv3.Client{cli, late} {
		for {
			pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
			_, err := cl.Put(pctx, "k", "after")
			pcancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				t.Fatalf("no put through the restored link: %v", err)
			}
		}
	}
}
