package lifecycle

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

// slowRequeueKV holds every transaction that writes a queue entry (a
// re-queue) for a while and records how many were in flight at once.
type slowRequeueKV struct {
	clientv3.KV
	pending string
	mu      sync.Mutex
	now     int
	most    int
}

func (k *slowRequeueKV) Txn(ctx context.Context) clientv3.Txn {
	return &slowRequeueTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type slowRequeueTxn struct {
	clientv3.Txn
	kv      *slowRequeueKV
	requeue bool
}

func (t *slowRequeueTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *slowRequeueTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *slowRequeueTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		if op.IsPut() && strings.HasPrefix(string(op.KeyBytes()), t.kv.pending) {
			t.requeue = true
		}
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *slowRequeueTxn) Commit() (*clientv3.TxnResponse, error) {
	if !t.requeue {
		return t.Txn.Commit()
	}
	k := t.kv
	k.mu.Lock()
	k.now++
	k.most = max(k.most, k.now)
	k.mu.Unlock()
	defer func() {
		k.mu.Lock()
		k.now--
		k.mu.Unlock()
	}()
	time.Sleep(20 * time.Millisecond) // a loaded etcd's round trip
	return t.Txn.Commit()
}

// TestPassRequeuesWaitingSessionsAtOnce: a pass re-queues the sessions
// due to run again several at a time (requeueConcurrency), not one after
// another: one at a time, a pass behind the soak's back-offs at 300 binds
// a second fell further behind with every pass (thousands waited past
// their retry time). Each is re-queued once, as its own transaction.
func TestPassRequeuesWaitingSessionsAtOnce(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ccli := c.Client(t)
	slow := &slowRequeueKV{KV: ccli.KV, pending: keys.PendingDir()}
	ccli.KV = slow
	ctx := context.Background()
	now := time.Now().UTC()
	const n = 48
	for i := range n {
		id := fmt.Sprintf("job-%02d", i)
		s := state.Session{ID: id, Owner: "ada", Kind: state.KindBatch, Desired: state.DesiredRunning, Created: now,
			Restart: state.RestartPolicy{Policy: state.RestartOnFailure, MaxRestarts: 3}}
		if _, err := state.CreateSession(ctx, cli, keys, s, now); err != nil {
			t.Fatal(err)
		}
		if _, err := cli.Delete(ctx, keys.Pending(id)); err != nil { // as if bound, ran and released
			t.Fatal(err)
		}
		code := 1
		st := state.Status{Session: id, Phase: state.PhasePending, Reason: state.ReasonBackOff, Message: "exited with code 1",
			ExitCode: &code, Created: now, Updated: now, RetryAt: &now}
		if _, err := state.Put(ctx, cli, keys.Status(id), st); err != nil {
			t.Fatal(err)
		}
	}
	ctl := runController(t, ccli, ControllerConfig{})
	waitFor(t, "every waiting session re-queued", func() bool { return ctl.Stats().Requeued >= n })
	slow.mu.Lock()
	most := slow.most
	slow.mu.Unlock()
	if most < 2 || most > requeueConcurrency {
		t.Errorf("at most %d re-queues in flight at once, want 2 to %d", most, requeueConcurrency)
	}
	r, err := cli.Get(ctx, keys.PendingDir(), clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != n {
		t.Errorf("%d queue entries, want %d", len(r.Kvs), n)
	}
	for _, kv := range r.Kvs {
		if e, err := state.Decode[state.QueueEntry](kv.Value); err != nil || e.Attempt != 1 || kv.Version != 1 {
			t.Errorf("queue entry %s: %+v (version %d, %v), want attempt 1 written once", kv.Key, e, kv.Version, err)
		}
	}
	if got := ctl.Stats().Requeued; got != n {
		t.Errorf("requeued %d, want %d", got, n)
	}
}
