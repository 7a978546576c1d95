package state

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// LedgerWrite is the new value of one node's ledger, to be written only if
// the ledger is still at ReadRevision (0: it must not exist yet) and the
// node's inventory key is still at NodeRevision: the key the placement was
// computed from, under the same live lease (an expired lease deletes it, a
// re-registration rewrites it).
type LedgerWrite struct {
	Node         string
	ReadRevision int64
	NodeRevision int64
	Ledger       Ledger
}

// Placement binds one queued session: its queue entry, read at
// PendingRevision, is consumed; Bindings are written (one per node); Status
// becomes its new status. Quotas are the quotas its placement was checked
// against, each guarded (QuotaGuard).
type Placement struct {
	Session         string
	PendingRevision int64
	Bindings        []Binding
	Status          Status
	Quotas          []QuotaGuard
}

// BindOps builds the bind transaction for a batch: compares that every
// pending entry, every touched ledger and every touched node's inventory key
// are unchanged since read, and the operations that consume the entries,
// write the ledgers, bindings and statuses. Either all of the batch commits
// or none of it: a gang session's parts are always in one batch. Each quota
// that a placement was checked against is guarded once per batch
// (QuotaGuard). Its size is BindSize plus QuotaGuardSize of the batch.
func BindOps(k Keys, ledgers []LedgerWrite, ps []Placement) ([]clientv3.Cmp, []clientv3.Op, error) {
	cmps := make([]clientv3.Cmp, 0, 2*len(ledgers)+len(ps))
	ops := make([]clientv3.Op, 0, len(ledgers)+3*len(ps))
	for _, lw := range ledgers {
		key := k.Ledger(lw.Node)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", lw.ReadRevision),
			clientv3.Compare(clientv3.ModRevision(k.Node(lw.Node)), "=", lw.NodeRevision))
		v, err := Encode(lw.Ledger)
		if err != nil {
			return nil, nil, fmt.Errorf("build bind txn: %w", err)
		}
		ops = append(ops, clientv3.OpPut(key, v))
	}
	for _, p := range ps {
		pk := k.Pending(p.Session)
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(pk), "=", p.PendingRevision))
		ops = append(ops, clientv3.OpDelete(pk))
		st, err := Encode(p.Status)
		if err != nil {
			return nil, nil, fmt.Errorf("build bind txn: %w", err)
		}
		ops = append(ops, clientv3.OpPut(k.Status(p.Session), st))
		for _, b := range p.Bindings {
			v, err := Encode(b)
			if err != nil {
				return nil, nil, fmt.Errorf("build bind txn: %w", err)
			}
			ops = append(ops, clientv3.OpPut(k.Binding(b.Node, b.Session), v))
		}
	}
	guarded := map[string]bool{}
	for _, p := range ps {
		for _, g := range p.Quotas {
			key := k.QuotaOf(g.Scope, g.Name)
			if guarded[key] {
				continue
			}
			guarded[key] = true
			gc, gop, err := quotaGuardOps(k, g, p.Status.Updated)
			if err != nil {
				return nil, nil, fmt.Errorf("build bind txn: %w", err)
			}
			cmps = append(cmps, gc...)
			ops = append(ops, gop)
		}
	}
	return cmps, ops, nil
}

// maxReleaseAttempts bounds Release's read-modify-write retries; between
// attempts it waits a jittered, doubling pause (from 1 ms up to 64 ms), so
// that a release racing placers' binds on a busy node gets through.
const maxReleaseAttempts = 24

// Release gives back what session id holds on node: in one transaction it
// removes the allocation from the ledger, deletes the binding and, when st
// is not nil, writes st as the session's status (its secrets apart, see
// StatusOps). It is idempotent: releasing
// an allocation that is already gone only deletes the binding and writes st.
// The agent calls it after the containers stopped.
func Release(ctx context.Context, kv clientv3.KV, k Keys, node, id string, st *Status) error {
	lk := k.Ledger(node)
	pause := time.Millisecond
	for attempt := 0; attempt < maxReleaseAttempts; attempt++ {
		if attempt > 0 {
			t := time.NewTimer(pause/2 + rand.N(pause))
			select {
			case <-ctx.Done():
				t.Stop()
				return fmt.Errorf("release %s on %s: %w", id, node, ctx.Err())
			case <-t.C:
			}
			pause = min(2*pause, 64*time.Millisecond)
		}
		l, rev, err := Get[Ledger](ctx, kv, lk)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return fmt.Errorf("release %s on %s: %w", id, node, err)
		}
		ops := []clientv3.Op{clientv3.OpDelete(k.Binding(node, id))}
		if _, held := l.Allocations[id]; held {
			delete(l.Allocations, id)
			if len(l.Allocations) == 0 {
				ops = append(ops, clientv3.OpDelete(lk))
			} else {
				v, err := Encode(l)
				if err != nil {
					return fmt.Errorf("release %s on %s: %w", id, node, err)
				}
				ops = append(ops, clientv3.OpPut(lk, v))
			}
		}
		if st != nil {
			sops, err := StatusOps(k, node, *st)
			if err != nil {
				return fmt.Errorf("release %s on %s: %w", id, node, err)
			}
			ops = append(ops, sops...)
		}
		resp, err := kv.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(lk), "=", rev)).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("release %s on %s: %w", id, node, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("release %s on %s: %w after %d attempts", id, node, ErrConflict, maxReleaseAttempts)
}

// StatusOps are the puts that write st, as node's agent reports it: the
// status without secrets, and, when its URLs carry any, secrets/<node>/<id>
// with the full URLs (SplitSecrets). The agent writes statuses only
// through them, so no token reaches status/.
func StatusOps(k Keys, node string, st Status) ([]clientv3.Op, error) {
	public, secret := SplitSecrets(st)
	v, err := Encode(public)
	if err != nil {
		return nil, fmt.Errorf("encode status: %w", err)
	}
	ops := []clientv3.Op{clientv3.OpPut(k.Status(st.Session), v)}
	if secret != nil {
		sv, err := Encode(Secrets{Session: st.Session, Node: node, URLs: secret})
		if err != nil {
			return nil, fmt.Errorf("encode secrets: %w", err)
		}
		ops = append(ops, clientv3.OpPut(k.Secret(node, st.Session), sv))
	}
	return ops, nil
}
