package state

import (
	"context"
	"errors"
	"fmt"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrLaunched means a binding's attempt was already launched on its node
// (its part carries Launched): it is never started there again.
var ErrLaunched = errors.New("attempt already launched")

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
// ErrStale when the binding is gone or replaced. It returns the part as
// written. A conflict re-reads and decides again.
func Launch(ctx context.Context, kv clientv3.KV, k Keys, b Binding, bindingRev int64, again bool, now time.Time) (PartStatus, error) {
	bk, pk := k.Binding(b.Node, b.Session), k.Part(b.Node, b.Session)
	for attempt := 0; attempt < maxLaunchAttempts; attempt++ {
		read, err := kv.Txn(ctx).Then(clientv3.OpGet(bk), clientv3.OpGet(pk)).Commit()
		if err != nil {
			return PartStatus{}, fmt.Errorf("launch %s on %s: %w", b.Session, b.Node, err)
		}
		bkvs, pkvs := read.Responses[0].GetResponseRange().Kvs, read.Responses[1].GetResponseRange().Kvs
		if len(bkvs) == 0 || bkvs[0].CreateRevision != bindingRev {
			return PartStatus{}, fmt.Errorf("launch %s on %s (binding of revision %d): %w", b.Session, b.Node, bindingRev, ErrStale)
		}
		p, prev := NewPartStatus(b, bindingRev), int64(0)
		if len(pkvs) > 0 {
			prev = pkvs[0].ModRevision
			cur, err := Decode[PartStatus](pkvs[0].Value)
			if err != nil {
				return PartStatus{}, fmt.Errorf("launch %s on %s: %w", b.Session, b.Node, err)
			}
			if cur.BindingRevision == bindingRev {
				p = cur
			}
		}
		if p.Launched != nil && p.Launched.Equal(now.UTC()) {
			return p, nil // our own launch: its answer was lost
		}
		if p.Launched != nil && !again {
			return p, fmt.Errorf("launch %s on %s: attempt %d launched at %s: %w", b.Session, b.Node, b.Attempt,
				p.Launched.Format(time.RFC3339), ErrLaunched)
		}
		at := now.UTC()
		p.Launched, p.Updated = &at, at
		ops, err := PartOps(k, p)
		if err != nil {
			return PartStatus{}, fmt.Errorf("launch %s on %s: %w", b.Session, b.Node, err)
		}
		resp, err := kv.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(bk), "=", bindingRev),
				clientv3.Compare(clientv3.ModRevision(pk), "=", prev)).
			Then(ops...).Commit()
		if err != nil {
			return PartStatus{}, fmt.Errorf("launch %s on %s: %w", b.Session, b.Node, err)
		}
		if resp.Succeeded {
			return p, nil
		}
	}
	return PartStatus{}, fmt.Errorf("launch %s on %s: %w after %d attempts", b.Session, b.Node, ErrConflict, maxLaunchAttempts)
}
