package lifecycle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
)

// TestLeadUntilDoneStopsWorkWhenTheLeaseGoes: a worker leads under its
// election; when the election's lease is revoked (as etcd expires the
// lease of a process that stopped renewing) the work's context ends, the
// work stops, and the worker campaigns again and works under a new lease;
// when ctx ends, leadUntilDone returns.
func TestLeadUntilDoneStopsWorkWhenTheLeaseGoes(t *testing.T) {
	cli := etcdtest.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var terms atomic.Int64
	ended := make(chan error, 4)
	done := make(chan struct{})
	go func() {
		defer close(done)
		leadUntilDone(ctx, cli, keys, "test", quiet(), func(wctx context.Context) error {
			terms.Add(1)
			<-wctx.Done()
			ended <- wctx.Err()
			return nil
		})
	}()
	leader := func() clientv3.LeaseID {
		t.Helper()
		var lease clientv3.LeaseID
		waitFor(t, "a leader under elections/test", func() bool {
			resp, err := cli.Get(ctx, keys.Elections()+"test/", clientv3.WithPrefix())
			if err != nil || len(resp.Kvs) != 1 {
				return false
			}
			lease = clientv3.LeaseID(resp.Kvs[0].Lease)
			return true
		})
		return lease
	}
	first := leader()
	waitFor(t, "the first term's work", func() bool { return terms.Load() == 1 })
	if _, err := cli.Revoke(ctx, first); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("work's context ended with %v, want cancelled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the work went on 20s after its election's lease was revoked")
	}
	waitFor(t, "a second term after the lease was lost", func() bool { return terms.Load() == 2 })
	if second := leader(); second == first {
		t.Fatalf("the second term leads under the revoked lease %x", first)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("leadUntilDone did not return 20s after its context ended")
	}
}

// TestStoppedLeaderResignsAtOnce: a worker stopped in order (its context
// ended) revokes its election lease, so its election key is gone when it
// returns and the next process leads at once. Session.Close revoked under
// the ended context, which failed: the key stayed for the lease's 10 s.
func TestStoppedLeaderResignsAtOnce(t *testing.T) {
	cli := etcdtest.New(t)
	acc, stop := runAccountant(t, cli)
	waitUntil(t, "the accountant to lead", func() bool { return acc.Applied() > 0 })
	stop()
	r, err := cli.Get(context.Background(), keys.Elections()+"usage", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if r.Count != 0 {
		t.Errorf("%d election keys left after an orderly stop, want none (the lease revoked)", r.Count)
	}
}
