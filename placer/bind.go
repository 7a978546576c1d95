package placer

import (
	"context"
	"fmt"
	"maps"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// The bind transaction: one batch's decisions re-checked against the newest
// ledgers (refit) and written in one etcd transaction that compares every
// key the decisions were computed from.

// commitBatch writes one batch. Each node's ledger is written on top of the
// newest ledger the cache holds: the one the plan read when it has not
// moved, else a newer one, against which refit re-checks every choice of
// the batch (buildBatch). The transaction compares the revision of exactly
// the ledger it writes over (and the node's inventory key as planned), so a
// write that lands after this read refuses the bind. A decision whose
// choice no longer fits, or whose quota check rests on ledgers older than
// this placer's last bind before the pass (prior), is left out and counted
// in stale. With readBack, a transaction refused because some of its
// sessions were taken is sent again once without them (they count in
// stale). It returns how many sessions the transaction bound (0 if refused
// or empty) and its revision.
func (p *Placer) commitBatch(ctx context.Context, b *bindBatch, fresh *watcher.Snapshot[state.Ledger], nodes map[string]*NodeView, snap *Snapshot, prior int64, readBack bool) (bound int, rev int64, stale int, err error) {
	k := p.cfg.Keys
	t, stale := p.buildBatch(b, fresh, nodes, snap, prior)
	left, err := p.attachSecrets(ctx, &t)
	if err != nil {
		return 0, 0, stale, err
	}
	stale += left
	if len(t.ps) == 0 {
		return 0, 0, stale, nil
	}
	for attempt := 0; ; attempt++ {
		lws, cmps, ops, err := p.bindOps(&t)
		if err != nil {
			return 0, 0, stale, err
		}
		ps := t.ps
		// On a refusal the first attempt reads back its sessions' queue
		// entries, in the same round trip.
		var reads []clientv3.Op
		if attempt == 0 && readBack {
			for _, pl := range ps {
				reads = append(reads, clientv3.OpGet(k.Pending(pl.Session)))
			}
			if !p.budget().Fits(state.SizeOf(cmps, ops, reads)) {
				reads = nil
			}
		}
		// The ledger values are remembered before they are sent: their
		// watch event can come before the reply.
		p.own.send(lws, ops)
		resp, err := p.cli.Txn(ctx).If(cmps...).Then(ops...).Else(reads...).Commit()
		if err != nil {
			p.own.unsend(ops, len(lws))
			return 0, 0, stale, fmt.Errorf("commit bind txn: %w", err)
		}
		if resp.Succeeded {
			p.own.record(lws, ps, resp.Header.Revision, ops)
			return len(ps), resp.Header.Revision, stale, nil
		}
		p.own.unsend(ops, len(lws))
		if len(reads) == 0 {
			return 0, 0, stale, nil
		}
		// Refused. If another writer took some of the batch's sessions
		// (another placer bound them on a plan of its own, or they were
		// cancelled), the rest of the batch still stands on exactly what
		// it was computed from: commit it again without them, once, with
		// the same compares (Nomad's plan applier commits the part of a
		// plan that still fits). If no session moved, a ledger, node,
		// cordon or quota did: the next pass plans again.
		// The retry takes sessions off the ledgers it writes: off copies,
		// since the decoder may have handed the sent ones to the ledgers
		// cache (another placer can write the very same bytes).
		for _, lw := range lws {
			w := t.writes[lw.Node]
			w.Ledger.Allocations = maps.Clone(w.Ledger.Allocations)
		}
		kept := ps[:0]
		for i, pl := range ps {
			rr := resp.Responses[i].GetResponseRange()
			if rr != nil && len(rr.Kvs) == 1 && rr.Kvs[0].ModRevision == pl.PendingRevision {
				kept = append(kept, pl)
				continue
			}
			stale++
			for _, bd := range pl.Bindings {
				delete(t.writes[bd.Node].Ledger.Allocations, pl.Session)
			}
		}
		if len(kept) == len(ps) || len(kept) == 0 {
			return 0, 0, stale, nil
		}
		p.conflicts.Add(1) // the refused attempt
		t.ps = kept
	}
}

// bindTxn is one batch made ready to write: each touched node's ledger
// write (in order of first use) with the placements' allocations added,
// and the placements still in the batch.
type bindTxn struct {
	writes map[string]*state.LedgerWrite
	order  []string
	ps     []state.Placement
}

// buildBatch turns b's decisions into the placements and ledger writes of
// its transaction, on the newest ledgers this placer knows (see
// commitBatch). Decisions left out count in stale.
func (p *Placer) buildBatch(b *bindBatch, fresh *watcher.Snapshot[state.Ledger], nodes map[string]*NodeView, snap *Snapshot, prior int64) (t bindTxn, stale int) {
	k := p.cfg.Keys
	now := p.cfg.Now().UTC()
	// Every status of the batch points at this one time (read only).
	boundAt := &now
	parts := 0
	for _, d := range b.decisions {
		parts += len(d.Parts)
	}
	// The batch's ledger writes, bindings and status node lists are cut
	// from one slice each, sized so that none is reallocated.
	lwSlab := make([]state.LedgerWrite, 0, parts)
	bdSlab := make([]state.Binding, 0, parts)
	nodeSlab := make([]string, 0, parts)
	writes := make(map[string]*state.LedgerWrite, parts)
	var order []string
	ledgerOf := func(node string) *state.LedgerWrite {
		if lw, ok := writes[node]; ok {
			return lw
		}
		v := nodes[node]
		lwSlab = append(lwSlab, state.LedgerWrite{Node: node, NodeRevision: v.NodeRevision, CordonRevision: v.CordonRevision, ReadRevision: v.LedgerRevision})
		lw := &lwSlab[len(lwSlab)-1]
		from := v.Ledger.Allocations
		if it, ok := p.freshLedger(fresh, node); ok && it.ModRevision != v.LedgerRevision {
			lw.ReadRevision, from = it.ModRevision, it.Value.Allocations
		} else if !ok && v.LedgerRevision != 0 {
			lw.ReadRevision, from = 0, nil // released to empty and deleted
		}
		// A copy: the cached ledger is shared, and the batch adds to it.
		lw.Ledger = state.Ledger{Node: node, Allocations: maps.Clone(from)}
		if lw.Ledger.Allocations == nil {
			lw.Ledger.Allocations = map[string]state.Allocation{}
		}
		writes[node] = lw
		order = append(order, node)
		return lw
	}
	ps := make([]state.Placement, 0, len(b.decisions))
	for _, d := range b.decisions {
		e := d.Pending.Entry
		scopes := quotaScopes(e, snap)
		if len(scopes) > 0 && snap.LedgersAt < prior {
			stale++ // plan again once the caches show our last binds
			p.quotaStale.Add(1)
			continue
		}
		var one [1]state.Allocation
		allocs := one[:]
		if len(d.Parts) > 1 {
			allocs = make([]state.Allocation, len(d.Parts))
		}
		fits := true
		for i, pp := range d.Parts {
			allocs[i] = allocation(e, pp)
			allocs[i].Plan, allocs[i].Queued = snap.Epoch, e.Created
			lw := ledgerOf(pp.Node)
			if err := refit(&nodes[pp.Node].Node, &lw.Ledger, e.Session, &allocs[i], p.cfg.Plan.MaxSessionsPerNode); err != nil {
				p.log.Debug("planned choice went stale", "session", e.Session, "err", err)
				fits = false
				break
			}
		}
		if !fits {
			stale++
			continue
		}
		pl := state.Placement{Session: e.Session, PendingRevision: d.Pending.Revision, NeedsSecrets: e.Secrets}
		for _, sc := range scopes {
			pl.Quotas = append(pl.Quotas, state.QuotaGuard{Scope: sc.scope, Name: sc.name,
				QuotaRevision: snap.QuotaRevisions[k.QuotaOf(sc.scope, sc.name)], LedgersAt: snap.LedgersAt,
				Placer: p.cfg.ID, Session: e.Session})
		}
		first := len(bdSlab)
		for i, pp := range d.Parts {
			nodeSlab = append(nodeSlab, pp.Node)
			writes[pp.Node].Ledger.Allocations[e.Session] = allocs[i]
			bd := state.Binding{
				Session: e.Session, Node: pp.Node, Role: pp.Role, Worker: pp.Worker, GPUs: pp.Devices, Share: allocs[i].Share,
				CPUMilli: pp.CPUMilli, MemoryMiB: pp.MemoryMiB, Ports: pp.Ports,
				QueueRevision: d.Pending.Revision, Attempt: e.Attempt, Scores: pp.Scores, Placer: p.cfg.ID, Bound: now,
			}
			if pp.Role == state.RoleWorker {
				bd.HeadNode = d.Parts[0].Node
			}
			bdSlab = append(bdSlab, bd)
		}
		last := len(bdSlab)
		pl.Bindings = bdSlab[first:last:last]
		pl.Status = state.Status{
			Session: e.Session, Phase: state.PhaseBound, Reason: "Bound",
			Message: boundMessage(d) + elasticNote(e), Nodes: nodeSlab[first:last:last], Attempt: e.Attempt, GPUShare: allocs[0].Share,
			Created: e.Created, Updated: now, Bound: boundAt, Elastic: e.Elastic,
		}
		ps = append(ps, pl)
	}
	return bindTxn{writes: writes, order: order, ps: ps}, stale
}

// bindOps builds t's transaction as it stands: only the ledgers of the
// placements kept are written. It returns those ledger writes, and checks
// the transaction against this placer's budget.
func (p *Placer) bindOps(t *bindTxn) ([]state.LedgerWrite, []clientv3.Cmp, []clientv3.Op, error) {
	lws, cmps, ops, err := p.bindOpsUnchecked(t)
	if err != nil {
		return nil, nil, nil, err
	}
	if err := p.budget().Check(state.SizeOf(cmps, ops, nil)); err != nil {
		return nil, nil, nil, fmt.Errorf("commit bind txn of %d sessions: %w", len(t.ps), err)
	}
	return lws, cmps, ops, nil
}

func boundMessage(d Decision) string {
	pp := d.Parts[0]
	if len(d.Parts) > 1 && d.Pending.Entry.Nodes > 1 { // a multi-node job: rank 0 first
		return "bound to " + strconv.Itoa(len(d.Parts)) + " nodes, rank 0 on " + pp.Node + ", each with " + strconv.Itoa(len(pp.Devices)) + " GPUs"
	}
	if len(d.Parts) > 1 {
		return "bound to " + pp.Node + " with " + strconv.Itoa(len(pp.Devices)) + " GPUs and " + strconv.Itoa(len(d.Parts)-1) + " Ray workers"
	}
	return "bound to " + pp.Node + " with " + strconv.Itoa(len(pp.Devices)) + " GPUs"
}
