package state

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	json "github.com/goccy/go-json"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// LedgerWrite is the new value of one node's ledger, to be written only if
// the ledger is still at ReadRevision (0: it must not exist yet) and the
// node's inventory key is still at NodeRevision: the key the placement was
// computed from, under the same live lease (an expired lease deletes it, a
// re-registration rewrites it); and the node's cordon key is still at
// CordonRevision (0: the node must still be uncordoned), so a node cordoned
// or drained after the plan read it refuses the bind.
type LedgerWrite struct {
	Node           string
	ReadRevision   int64
	NodeRevision   int64
	CordonRevision int64
	Ledger         Ledger
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
	// Secrets, when set, are copied to each binding's node
	// (boundsecrets/<node>/<id>); NeedsSecrets says the session has
	// some (QueueEntry.Secrets), for the placer to read them.
	Secrets      *SpecSecrets
	NeedsSecrets bool
}

// BindOps builds the bind transaction for a batch: compares that every
// pending entry, every touched ledger and every touched node's inventory and
// cordon keys are unchanged since read, and the operations that consume the entries,
// write the ledgers, bindings and statuses. Either all of the batch commits
// or none of it: a gang session's parts are always in one batch. Each quota
// that a placement was checked against is guarded once per batch
// (QuotaGuard). A placement with Secrets puts a copy of them to each of
// its bindings' nodes. Its size is BindSize plus QuotaGuardSize of the
// batch, plus SecretsSize of those placements' bindings.
// The operations begin with the ledgers' puts, ops[i] writing ledgers[i].
func BindOps(k Keys, ledgers []LedgerWrite, ps []Placement) ([]clientv3.Cmp, []clientv3.Op, error) {
	cmps := make([]clientv3.Cmp, 0, 3*len(ledgers)+len(ps))
	ops := make([]clientv3.Op, 0, len(ledgers)+3*len(ps))
	// Every key and value is written into one buffer, which the compares
	// and operations then share (WithKeyBytes, WithValueBytes): none
	// costs an allocation or a copy of its own. Nothing writes to the
	// buffer once they hold it. spans[i] are where ops[spans[i].op] or,
	// for a compare, cmps[spans[i].cmp] find their key and value.
	// Sized for what a burst writes (a session's status and binding take
	// about 600 bytes, a full 8-GPU ledger about 1,500) to grow rarely.
	buf := make([]byte, 0, 1024*len(ledgers)+640*len(ps))
	// Each put and delete is a copy of one (OpPut and OpDelete allocate
	// the Op they return), each compare's revision one of revs.
	put, del := clientv3.OpPut("", ""), clientv3.OpDelete("")
	revs := make([]pb.Compare_ModRevision, 0, 3*len(ledgers)+len(ps))
	type span struct {
		op, cmp          int // -1 for the other
		key, val, valEnd int
	}
	spans := make([]span, 0, 4*len(ledgers)+3*len(ps))
	var err error
	compare := func(d string, name string, rev int64) {
		at := len(buf)
		buf = k.appendKey(buf, d, name)
		spans = append(spans, span{op: -1, cmp: len(cmps), key: at, val: len(buf), valEnd: len(buf)})
		revs = append(revs, pb.Compare_ModRevision{ModRevision: rev})
		cmps = append(cmps, modRevisionIs(&revs[len(revs)-1]))
	}
	for i := range ledgers {
		lw := &ledgers[i]
		compare(dirLedger, lw.Node, lw.ReadRevision)
		compare(dirNodes, lw.Node, lw.NodeRevision)
		compare(dirCordons, lw.Node, lw.CordonRevision)
		at := len(buf)
		buf = k.appendKey(buf, dirLedger, lw.Node)
		val := len(buf)
		if buf, err = appendJSON(buf, &lw.Ledger); err != nil {
			return nil, nil, fmt.Errorf("build bind txn: %w", err)
		}
		spans = append(spans, span{op: len(ops), cmp: -1, key: at, val: val, valEnd: len(buf)})
		ops = append(ops, put)
	}
	for i := range ps {
		p := &ps[i]
		compare(dirPending, p.Session, p.PendingRevision)
		spans = append(spans, span{op: len(ops), cmp: -1, key: spans[len(spans)-1].key, val: spans[len(spans)-1].val, valEnd: spans[len(spans)-1].val})
		ops = append(ops, del)
		// The queue entry exists only while the status is Pending (every
		// writer of one writes the other in the same txn), so comparing
		// its revision is the Bind event's guard.
		phase, err := Next(PhasePending, EventBind, Facts{Queued: true})
		if err != nil {
			return nil, nil, fmt.Errorf("build bind txn: %w", err)
		}
		st := p.Status
		st.Phase = phase
		st.QueueRevision = p.PendingRevision
		at := len(buf)
		buf = k.appendKey(buf, dirStatus, p.Session)
		val := len(buf)
		if buf, err = appendJSON(buf, &st); err != nil {
			return nil, nil, fmt.Errorf("build bind txn: %w", err)
		}
		spans = append(spans, span{op: len(ops), cmp: -1, key: at, val: val, valEnd: len(buf)})
		ops = append(ops, put)
		for j := range p.Bindings {
			b := &p.Bindings[j]
			at := len(buf)
			buf = k.appendKey(buf, dirBindings, b.Node, b.Session)
			val := len(buf)
			if buf, err = appendJSON(buf, b); err != nil {
				return nil, nil, fmt.Errorf("build bind txn: %w", err)
			}
			spans = append(spans, span{op: len(ops), cmp: -1, key: at, val: val, valEnd: len(buf)})
			ops = append(ops, put)
		}
	}
	for _, sp := range spans {
		key := buf[sp.key:sp.val:sp.val]
		if sp.cmp >= 0 {
			cmps[sp.cmp].GetCompare().Key = key
			continue
		}
		ops[sp.op].WithKeyBytes(key)
		if sp.valEnd > sp.val {
			ops[sp.op].WithValueBytes(buf[sp.val:sp.valEnd:sp.valEnd])
		}
	}
	if ops, err = boundSecretOps(k, ps, ops); err != nil {
		return nil, nil, fmt.Errorf("build bind txn: %w", err)
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

// appendKey appends k.key(d, names[0]), or k.key2(d, names[0], names[1]).
func (k Keys) appendKey(b []byte, d string, names ...string) []byte {
	b = append(append(append(b, k.prefix...), '/'), d...)
	for _, n := range names {
		b = append(append(b, '/'), n...)
	}
	return b
}

// modRevisionIs is clientv3.Compare(clientv3.ModRevision(key), "=",
// rev.ModRevision) with its key left to set (GetCompare().Key), built
// without the reflective copy that Compare makes of its argument.
func modRevisionIs(rev *pb.Compare_ModRevision) clientv3.Cmp {
	var c clientv3.Cmp
	pc := c.GetCompare()
	pc.Target, pc.Result, pc.TargetUnion = pb.Compare_MOD, pb.Compare_EQUAL, rev
	return c
}

// maxReleaseAttempts bounds Release's read-modify-write retries; between
// attempts it waits a jittered, doubling pause (from 1 ms up to 64 ms), so
// that a release racing placers' binds on a busy node gets through.
const maxReleaseAttempts = 24

// ErrStale means the writer's binding is gone or was replaced by a newer
// binding of the same session: what it would write belongs to someone
// else now, so nothing was written.
var ErrStale = errors.New("binding gone or replaced")

// Finalizer decides how a released part ended from the session's spec
// and the part as its agent last reported it (a part never reported is
// NewPartStatus of the binding, phase Bound), both read in the same round
// trip as the ledger and the binding and compared by the release's
// transaction. It returns the event (EventSucceed, EventFail, EventHalt,
// EventBackOff, EventPreempt) and the part to write; Release sets the
// phase that the state machine gives.
type Finalizer func(spec Session, cur PartStatus) (Event, PartStatus, error)

// Release gives back what session id holds on node for the binding created
// at bindingRev: in one transaction it removes the allocation from the
// ledger, deletes the binding and, when final is not nil, writes the part
// (parts/<node>/<id>) that final decides: how the part ended, which the
// placers' status merger folds into the session's status (MergeParts).
// The transaction compares everything the decision came from: the
// ledger's mod revision, the binding's create revision, the part's and the
// spec's mod revisions; a conflict re-reads and decides again. When the
// binding is gone or is a newer one (a node-loss re-queue took it, or a
// new bind of the same session on the same node), nothing is written and
// ErrStale is returned: a stale worker can neither report for the newer
// binding nor free its allocation. A final part that the state machine
// refuses is an error wrapping ErrIllegalTransition. The agent calls
// Release after the containers stopped; it writes nothing under status/.
func Release(ctx context.Context, kv clientv3.KV, k Keys, node, id string, bindingRev int64, final Finalizer) error {
	lk, bk, tk, pk := k.Ledger(node), k.Binding(node, id), k.Part(node, id), k.Session(id)
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
		// The first read from any member that holds the binding's
		// revision (ReadAtLeast): a binding of that revision gone stays
		// gone, and everything else is compared below.
		atLeast := bindingRev
		if attempt > 0 {
			atLeast = 0
		}
		read, err := ReadAtLeast(ctx, kv, atLeast, func(o ...clientv3.OpOption) []clientv3.Op {
			return []clientv3.Op{clientv3.OpGet(lk, o...), clientv3.OpGet(bk, o...), clientv3.OpGet(tk, o...), clientv3.OpGet(pk, o...)}
		})
		if err != nil {
			return fmt.Errorf("release %s on %s: %w", id, node, err)
		}
		kvs := FirstKVs(read)
		lkv, bkv, tkv, pkv := kvs[0], kvs[1], kvs[2], kvs[3]
		if bkv == nil || bkv.CreateRevision != bindingRev {
			return fmt.Errorf("release %s on %s (binding of revision %d): %w", id, node, bindingRev, ErrStale)
		}
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(lk), "=", ModRevision(lkv)),
			clientv3.Compare(clientv3.CreateRevision(bk), "=", bindingRev),
		}
		if final != nil {
			// What becomes of the part (its end written, its deletion, or
			// nothing) is decided from the part and the spec as read, so
			// both are compared, absence included: the first read may
			// come from a member that has not yet seen this agent's own
			// latest part (a Stopping written just before), and a release
			// that wrote nothing for a part it read as absent left that
			// part saying the container runs with its binding gone.
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(tk), "=", ModRevision(tkv)),
				clientv3.Compare(clientv3.ModRevision(pk), "=", ModRevision(pkv)))
		}
		// The node's copy of the session's secrets goes with its binding.
		ops := []clientv3.Op{clientv3.OpDelete(bk), clientv3.OpDelete(k.BoundSecrets(node, id))}
		if lkv != nil {
			l, err := Decode[Ledger](lkv.Value)
			if err != nil {
				return fmt.Errorf("release %s on %s: %w", id, node, err)
			}
			if _, held := l.Allocations[id]; held {
				delete(l.Allocations, id)
				if len(l.Allocations) == 0 {
					mark, err := EmptiedOp(k, node, time.Now())
					if err != nil {
						return fmt.Errorf("release %s on %s: %w", id, node, err)
					}
					ops = append(ops, clientv3.OpDelete(lk), mark)
				} else {
					v, err := Encode(l)
					if err != nil {
						return fmt.Errorf("release %s on %s: %w", id, node, err)
					}
					ops = append(ops, clientv3.OpPut(lk, v))
				}
			}
		}
		if final != nil && pkv == nil && tkv != nil {
			// The session is retired (no spec): its part has no status
			// to be merged into, and would say the container still runs
			// once the binding is gone. It goes with the binding.
			ops = append(ops, clientv3.OpDelete(tk))
		}
		if final != nil && pkv != nil {
			spec, err := Decode[Session](pkv.Value)
			if err != nil {
				return fmt.Errorf("release %s on %s: %w", id, node, err)
			}
			b, err := Decode[Binding](bkv.Value)
			if err != nil {
				return fmt.Errorf("release %s on %s: %w", id, node, err)
			}
			cur := NewPartStatus(b, bindingRev)
			if tkv != nil {
				p, err := Decode[PartStatus](tkv.Value)
				if err != nil {
					return fmt.Errorf("release %s on %s: %w", id, node, err)
				}
				if p.BindingRevision == bindingRev {
					cur = p
				}
			}
			ev, part, err := final(spec, cur)
			if err != nil {
				return fmt.Errorf("release %s on %s: %w", id, node, err)
			}
			part.Phase, err = Next(cur.Phase, ev, Facts{Bound: true, DesiredStopped: spec.Desired == DesiredStopped,
				RestartsLeft: spec.RestartsLeft(b.Attempt), Requeue: spec.Eviction != nil && spec.Eviction.Requeue, Resize: spec.Resizing()})
			if err != nil {
				return fmt.Errorf("release %s on %s: %w", id, node, err)
			}
			part.Session, part.Node, part.BindingRevision = id, node, bindingRev
			sops, err := PartOps(k, part)
			if err != nil {
				return fmt.Errorf("release %s on %s: %w", id, node, err)
			}
			ops = append(ops, sops...)
		}
		resp, err := kv.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("release %s on %s: %w", id, node, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
	return fmt.Errorf("release %s on %s: %w after %d attempts", id, node, ErrConflict, maxReleaseAttempts)
}

// RestartsLeft reports whether a session whose status counts attempt
// restarts may restart again: its policy is OnFailure and it restarted
// fewer than MaxRestarts times.
func (s Session) RestartsLeft(attempt int) bool {
	return s.Restart.Policy == RestartOnFailure && attempt < s.Restart.MaxRestarts
}

// StatusOps are the puts that write st with URLs of node: the status
// without secrets, and, when its URLs carry any, secrets/<node>/<id> with
// the full URLs (SplitSecrets), so no token reaches status/. Agents write
// no status (they report parts: PartOps); this is for tools and tests
// that stand in for the whole chain.
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

// appendJSON appends v as Encode writes it, so that BindOps builds a whole
// transaction's values in one buffer. A hand-written encoder for statuses,
// bindings and ledgers was measured (BenchmarkBindTxnBuild, 23 November
// 2026) and left out: keeping a second encoder in step with the types did
// not pay; the library encoder (see decodeInto) took most of the gain.
func appendJSON(b []byte, v any) ([]byte, error) {
	a := appender{b: b}
	if err := json.NewEncoder(&a).Encode(v); err != nil {
		return b, fmt.Errorf("encode %T: %w", v, err)
	}
	// Encode writes what Marshal returns, then a newline.
	return a.b[:len(a.b)-1], nil
}

// appender is an io.Writer that appends to b: the JSON Encoder writes into
// the transaction's buffer without the copy Marshal returns.
type appender struct{ b []byte }

func (a *appender) Write(p []byte) (int, error) {
	a.b = append(a.b, p...)
	return len(p), nil
}
