package placer

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// handleLost finds ledgers whose node has no live inventory key (its
// agent's lease expired) and clears each of them, returning the revision of
// its last write (0 if it wrote nothing). Every placer may try: the
// transaction requires the node key to be absent and the ledger unchanged,
// so exactly one succeeds.
func (p *Placer) handleLost(ctx context.Context, snap *Snapshot) int64 {
	live := make(map[string]bool, len(snap.Nodes))
	for _, v := range snap.Nodes {
		live[v.Node.Name] = true
	}
	k := p.cfg.Keys
	var last int64
	for _, it := range p.ledgers.List() {
		name, ok := k.NodeName(it.Key)
		if !ok || live[name] {
			continue
		}
		rev, err := p.clearLostNode(ctx, name)
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("clear lost node", "node", name, "err", err)
			}
			continue
		}
		last = max(last, rev)
	}
	return last
}

// clearLostNode re-queues or ends the sessions on a lost node, in as few
// transactions as the op limit allows, and returns the revision of its last
// write, 0 if another placer did it first.
func (p *Placer) clearLostNode(ctx context.Context, node string) (int64, error) {
	k := p.cfg.Keys
	var last int64
	for attempt := 0; attempt < 8; attempt++ {
		// Read fresh: the cache may lag, and the txn compares what we read.
		// The node key too: a nodes cache that lags the ledgers cache
		// shows the ledger of a node just bound on, or just registered
		// again, without its node. Such a node is not lost, and the
		// clearing transaction (which requires the node key absent) would
		// be refused at every attempt.
		resp, err := p.cli.Txn(ctx).Then(clientv3.OpGet(k.Ledger(node)), clientv3.OpGet(k.Node(node), clientv3.WithCountOnly())).Commit()
		if err != nil {
			return last, fmt.Errorf("read ledger of %s: %w", node, err)
		}
		if resp.Responses[1].GetResponseRange().Count > 0 {
			p.log.Debug("ledger without a node in the cache, but the node is live", "node", node)
			return last, nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return last, nil
		}
		ledger, err := state.Decode[state.Ledger](kvs[0].Value)
		if err != nil {
			return last, err
		}
		ledgerRev := kvs[0].ModRevision
		ids := make([]string, 0, len(ledger.Allocations))
		for id := range ledger.Allocations {
			ids = append(ids, id)
		}
		sort.Strings(ids)
		rev, n, err := p.evict(ctx, node, ledger, ledgerRev, ids)
		if err != nil {
			return last, err
		}
		if rev == 0 {
			p.conflicts.Add(1)
			continue
		}
		last = rev
		if n == len(ids) {
			return last, nil
		}
	}
	return last, fmt.Errorf("clear lost node %s: %w", node, state.ErrConflict)
}

// evict handles as many of ids as fit in one transaction. It returns the
// transaction's revision (0 if it did not commit) and how many sessions it
// handled.
func (p *Placer) evict(ctx context.Context, node string, ledger state.Ledger, ledgerRev int64, ids []string) (int64, int, error) {
	k := p.cfg.Keys
	now := p.cfg.Now().UTC()
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(k.Node(node)), "=", 0),
		clientv3.Compare(clientv3.ModRevision(k.Ledger(node)), "=", ledgerRev),
	}
	var ops []clientv3.Op
	others := map[string]*state.LedgerWrite{} // other nodes of gang sessions
	others[node] = &state.LedgerWrite{Node: node, ReadRevision: ledgerRev, Ledger: ledger}
	handled := 0
	budget := p.budget()
	for _, id := range ids {
		// What the session's ops add to the others' ledger writes is
		// known only once its status (and so all its nodes) is read:
		// lostSessionOps records it in others, and a session that does
		// not fit beside those already handled is taken back out.
		existed := make(map[string]bool, len(others))
		held := map[string]state.Allocation{}
		for name, lw := range others {
			existed[name] = true
			if a, ok := lw.Ledger.Allocations[id]; ok {
				held[name] = a
			}
		}
		sessOps, sessCmps, err := p.lostSessionOps(ctx, node, id, others, now)
		if err != nil {
			return 0, 0, err
		}
		need := state.TxnSize{Compares: len(cmps) + len(sessCmps) + len(others) - 1, Then: len(ops) + len(sessOps) + len(others)}
		if handled > 0 && !budget.Fits(need) {
			for name := range others {
				if !existed[name] {
					delete(others, name)
				} else if a, ok := held[name]; ok {
					others[name].Ledger.Allocations[id] = a
				}
			}
			break
		}
		ops = append(ops, sessOps...)
		cmps = append(cmps, sessCmps...)
		delete(others[node].Ledger.Allocations, id)
		handled++
	}
	for name, lw := range others {
		key := k.Ledger(name)
		if name != node {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", lw.ReadRevision))
		}
		if len(lw.Ledger.Allocations) == 0 {
			mark, err := state.EmptiedOp(k, name, now)
			if err != nil {
				return 0, 0, err
			}
			ops = append(ops, clientv3.OpDelete(key), mark)
			continue
		}
		v, err := state.Encode(lw.Ledger)
		if err != nil {
			return 0, 0, err
		}
		ops = append(ops, clientv3.OpPut(key, v))
	}
	resp, err := p.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return 0, 0, fmt.Errorf("commit lost-node txn for %s: %w", node, err)
	}
	if !resp.Succeeded {
		return 0, 0, nil
	}
	p.lost.Add(int64(handled))
	p.log.Info("node lost: sessions handled", "node", node, "sessions", handled)
	return resp.Header.Revision, handled, nil
}

// lostSessionOps returns the operations that end or re-queue session id,
// whose part on node was lost: its bindings everywhere go, its other
// nodes' allocations are released (recorded in others), and its status says
// what happened. Whether it is re-queued follows its restart policy.
//
// Its other parts are found from what the transaction compares: the
// nodes its status names (the status is read here, and the transaction
// requires it unchanged), with their ledgers read here too (each compared
// by its mod revision); the placer's ledgers cache only adds to them. A
// cache that trails, or an agent that is dead or paused on the other
// node, thus never leaves a part allocated or bound for a session that
// ended or was re-queued.
func (p *Placer) lostSessionOps(ctx context.Context, node, id string, others map[string]*state.LedgerWrite, now time.Time) ([]clientv3.Op, []clientv3.Cmp, error) {
	k := p.cfg.Keys
	// What is decided below rests on the spec, the status and the lost
	// part's binding as read: the transaction requires the spec and the
	// status unchanged (0: still absent), so a stop or an agent's final
	// status landing meanwhile is never overwritten; the binding goes
	// with the ledger, whose revision it compares.
	read, err := p.cli.Txn(ctx).Then(clientv3.OpGet(k.Session(id)), clientv3.OpGet(k.Status(id)), clientv3.OpGet(k.Binding(node, id))).Commit()
	if err != nil {
		return nil, nil, fmt.Errorf("read session %s: %w", id, err)
	}
	kv := func(i int) *mvccpb.KeyValue {
		if kvs := read.Responses[i].GetResponseRange().Kvs; len(kvs) > 0 {
			return kvs[0]
		}
		return nil
	}
	skv, tkv, bkv := kv(0), kv(1), kv(2)
	var (
		spec              state.Session
		old               state.Status
		specRev, statusRv int64
		lostBinding       state.Binding
	)
	if skv != nil {
		if spec, err = state.Decode[state.Session](skv.Value); err != nil {
			return nil, nil, err
		}
		specRev = skv.ModRevision
	}
	if tkv != nil {
		if old, err = state.Decode[state.Status](tkv.Value); err != nil {
			return nil, nil, err
		}
		statusRv = tkv.ModRevision
	}
	if bkv != nil {
		if lostBinding, err = state.Decode[state.Binding](bkv.Value); err != nil {
			return nil, nil, err
		}
	}
	// The parts its agents reported go with the bindings: a part outlives
	// no binding but through the merger, and a fenced agent cannot write
	// one again (its writes compare the binding).
	ops := []clientv3.Op{clientv3.OpDelete(k.Binding(node, id)), clientv3.OpDelete(k.Part(node, id)), clientv3.OpDelete(k.BoundSecrets(node, id))}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.Status(id)), "=", statusRv)}
	live := slices.Contains([]state.Phase{state.PhaseBound, state.PhaseStarting, state.PhaseRunning, state.PhaseStopping}, old.Phase)
	// A lost part of an older queueing than the status's (its session
	// was re-queued and bound again meanwhile) is freed alone: the
	// session's current parts are not its.
	current := bkv == nil || old.QueueRevision == 0 || lostBinding.QueueRevision == old.QueueRevision
	if skv == nil || !live || !current {
		// Nothing to tell (no spec), or the session's status already
		// moved on (its head released it and only this part's binding
		// was left): free the GPUs only.
		return ops, append(cmps, clientv3.Compare(clientv3.ModRevision(k.Session(id)), "=", specRev)), nil
	}
	// The other parts go too: all or nothing. Their nodes are those its
	// status names, and any the ledgers cache shows holding it.
	holders := map[string]bool{}
	for _, name := range old.Nodes {
		if name != node {
			holders[name] = true
		}
	}
	for _, it := range p.ledgers.List() {
		if name, ok := k.NodeName(it.Key); ok && name != node {
			if _, held := it.Value.Allocations[id]; held {
				holders[name] = true
			}
		}
	}
	names := make([]string, 0, len(holders))
	for name := range holders {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		lw, ok := others[name]
		if !ok {
			l, rev, err := state.Get[state.Ledger](ctx, p.cli, k.Ledger(name))
			if err != nil && !errors.Is(err, state.ErrNotFound) {
				return nil, nil, err
			}
			ops = append(ops, clientv3.OpDelete(k.Binding(name, id)), clientv3.OpDelete(k.Part(name, id)))
			if _, held := l.Allocations[id]; !held {
				continue // released already: its ledger stays as it is
			}
			lw = &state.LedgerWrite{Node: name, ReadRevision: rev, Ledger: l}
			others[name] = lw
			delete(lw.Ledger.Allocations, id)
			continue
		}
		delete(lw.Ledger.Allocations, id)
		ops = append(ops, clientv3.OpDelete(k.Binding(name, id)), clientv3.OpDelete(k.Part(name, id)), clientv3.OpDelete(k.BoundSecrets(name, id)))
	}
	cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Session(id)), "=", specRev))
	st := state.Status{Session: id, Reason: "NodeLost", Attempt: old.Attempt, Created: spec.Created, Updated: now}
	lostMsg := fmt.Sprintf("node %s stopped answering (its agent's lease expired)", node)
	f := state.Facts{DesiredStopped: spec.Desired == state.DesiredStopped, RestartsLeft: spec.RestartsLeft(old.Attempt)}
	ev := state.EventLose
	switch {
	case f.DesiredStopped:
		ev = state.EventLostStopped
		st.Message = lostMsg + "; the session was already stopping"
		st.Finished = &now
	case f.RestartsLeft:
		ev = state.EventLostRequeue
		e := state.NewQueueEntry(spec, now)
		e.Attempt = old.Attempt + 1
		v, err := state.Encode(e)
		if err != nil {
			return nil, nil, err
		}
		ops = append(ops, clientv3.OpPut(k.Pending(id), v))
		// The pending key must not exist: a session is queued once.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k.Pending(id)), "=", 0))
		st.Attempt = e.Attempt
		st.Message = fmt.Sprintf("%s; re-queued, attempt %d of %d", lostMsg, e.Attempt, spec.Restart.MaxRestarts)
	default:
		st.Message = lostMsg + "; not re-queued (restart policy " + policyName(spec.Restart.Policy) + ")"
		st.Finished = &now
	}
	if st.Phase, err = state.Next(old.Phase, ev, f); err != nil {
		return nil, nil, err
	}
	v, err := state.Encode(st)
	if err != nil {
		return nil, nil, err
	}
	ops = append(ops, clientv3.OpPut(k.Status(id), v))
	return ops, cmps, nil
}

func policyName(p string) string {
	if p == "" {
		return state.RestartNever
	}
	return p
}
