package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrLaunched means a binding's attempt was already launched on its node
// (its part carries Launched): it is never started there again.
var ErrLaunched = errors.New("attempt already launched")

// ErrEnded means a binding's session is no longer live for the binding's
// queueing (its status is gone, final, waiting to be queued again, or of
// another queueing): a multi-node job whose rank 0 ended before another
// part launched, say. Nothing of the attempt may start any more.
var ErrEnded = errors.New("session ended for this binding")

// maxLaunchAttempts bounds Launch's read-modify-write retries when another
// writer of the part got in between.
const maxLaunchAttempts = 16

// Launch records, before the agent creates binding b's container, that
// the attempt starts on b's node: Launched is set on the part
// (parts/<node>/<id>) in a transaction that compares the binding's create
// revision (bindingRev) and the part's mod revision as read. It returns
// ErrLaunched, writing nothing, when the part already records a launch for
// this binding, unless again is set (the container was created and its
// process provably never started, so nothing of the attempt ran), or
// unless the recorded launch is exactly now: a retry of this same call
// whose commit's answer was lost;
// ErrStale when the binding is gone or replaced; ErrEnded when the
// session's status (status/<id>, whose mod revision the transaction
// compares too) is not live for b's queueing. It returns the part as
// written and its mod revision. The launch moves the part to Starting
// (EventCreate, reason Launching), so that the agent need not write a part
// of its own between the launch and Running. A conflict re-reads and
// decides again.
func Launch(ctx context.Context, kv clientv3.KV, k Keys, b Binding, bindingRev int64, again bool, now time.Time) (PartStatus, int64, error) {
	return LaunchFrom(ctx, kv, k, b, bindingRev, again, now, nil)
}

// LaunchReads are the reads Launch decides from, for a caller that reads
// them in a transaction of its own before it launches: b's binding, its
// part and its session's status, in that order.
func LaunchReads(k Keys, b Binding) []clientv3.Op {
	return []clientv3.Op{clientv3.OpGet(k.Binding(b.Node, b.Session)), clientv3.OpGet(k.Part(b.Node, b.Session)), clientv3.OpGet(k.Status(b.Session))}
}

// LaunchFrom is Launch whose first attempt decides from read, the answers
// to LaunchReads (their Responses, in order) that the caller read earlier,
// instead of reading them again: its transaction compares what they held,
// and if anything moved since, it reads afresh and decides again, as a
// conflict does. A nil read is Launch.
func LaunchFrom(ctx context.Context, kv clientv3.KV, k Keys, b Binding, bindingRev int64, again bool, now time.Time, read []*etcdserverpb.ResponseOp) (PartStatus, int64, error) {
	bk, pk, sk := k.Binding(b.Node, b.Session), k.Part(b.Node, b.Session), k.Status(b.Session)
	for attempt := 0; attempt < maxLaunchAttempts; attempt++ {
		if attempt > 0 || len(read) != 3 {
			resp, err := kv.Txn(ctx).Then(LaunchReads(k, b)...).Commit()
			if err != nil {
				return PartStatus{}, 0, fmt.Errorf("launch %s on %s: %w", b.Session, b.Node, err)
			}
			read = resp.Responses
		}
		bkvs, pkvs, skvs := read[0].GetResponseRange().Kvs, read[1].GetResponseRange().Kvs, read[2].GetResponseRange().Kvs
		if len(bkvs) == 0 || bkvs[0].CreateRevision != bindingRev {
			return PartStatus{}, 0, fmt.Errorf("launch %s on %s (binding of revision %d): %w", b.Session, b.Node, bindingRev, ErrStale)
		}
		if len(skvs) == 0 {
			return PartStatus{}, 0, fmt.Errorf("launch %s on %s: its status is gone: %w", b.Session, b.Node, ErrEnded)
		}
		st, err := Decode[Status](skvs[0].Value)
		if err != nil {
			return PartStatus{}, 0, fmt.Errorf("launch %s on %s: %w", b.Session, b.Node, err)
		}
		if st.Phase.Terminal() || st.Phase == PhasePending || st.QueueRevision != 0 && b.QueueRevision != 0 && st.QueueRevision != b.QueueRevision {
			return PartStatus{}, 0, fmt.Errorf("launch %s on %s (queueing of revision %d): its status is %s (queueing of revision %d): %w",
				b.Session, b.Node, b.QueueRevision, st.Phase, st.QueueRevision, ErrEnded)
		}
		p, prev := NewPartStatus(b, bindingRev), int64(0)
		if len(pkvs) > 0 {
			prev = pkvs[0].ModRevision
			cur, err := Decode[PartStatus](pkvs[0].Value)
			if err != nil {
				return PartStatus{}, 0, fmt.Errorf("launch %s on %s: %w", b.Session, b.Node, err)
			}
			if cur.BindingRevision == bindingRev {
				p = cur
			}
		}
		if p.Launched != nil && p.Launched.Equal(now.UTC()) {
			return p, prev, nil // our own launch: its answer was lost
		}
		if p.Launched != nil && !again {
			return p, prev, fmt.Errorf("launch %s on %s: attempt %d launched at %s: %w", b.Session, b.Node, b.Attempt,
				p.Launched.Format(time.RFC3339), ErrLaunched)
		}
		at := now.UTC()
		p.Launched, p.Updated = &at, at
		if next, err := Next(p.Phase, EventCreate, Facts{Bound: true}); err == nil {
			p.Phase, p.Reason, p.Message = next, "Launching", "creating the container"
		}
		ops, err := PartOps(k, p)
		if err != nil {
			return PartStatus{}, 0, fmt.Errorf("launch %s on %s: %w", b.Session, b.Node, err)
		}
		resp, err := kv.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(bk), "=", bindingRev),
				clientv3.Compare(clientv3.ModRevision(pk), "=", prev),
				clientv3.Compare(clientv3.ModRevision(sk), "=", skvs[0].ModRevision)).
			Then(ops...).Commit()
		if err != nil {
			return PartStatus{}, 0, fmt.Errorf("launch %s on %s: %w", b.Session, b.Node, err)
		}
		if resp.Succeeded {
			return p, resp.Header.Revision, nil
		}
	}
	return PartStatus{}, 0, fmt.Errorf("launch %s on %s: %w after %d attempts", b.Session, b.Node, ErrConflict, maxLaunchAttempts)
}
