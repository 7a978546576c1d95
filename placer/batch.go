package placer

import (
	"maps"

	"github.com/voyager-gpu/voyager/state"
)

// Batching: a pass's decisions grouped into bind transactions within the
// transaction budget (state.TxnBudget), a node's decisions in one batch so
// that no two batches write the same ledger.

// bindBatch is one transaction's worth of decisions; batches of one pass
// share no node, so they commit in parallel without conflicting.
type bindBatch struct {
	decisions []Decision
	nodes     map[string]bool
	size      state.TxnSize
}

// budget is what one transaction of this placer may hold.
func (p *Placer) budget() state.TxnBudget {
	return state.TxnBudget{MaxOps: p.cfg.MaxTxnOps, MaxBytes: p.cfg.MaxTxnBytes}
}

// decisionSize is what d adds to a batch that already writes the ledgers of
// seen (which it extends): its share of state.BindSize, its quota guards
// and an estimate of its bytes (the ledgers it adds, written whole, its
// bindings and status). commitBatch measures the built transaction.
func decisionSize(d *Decision, seen map[string]bool, nodes map[string]*NodeView, snap *Snapshot) state.TxnSize {
	newNodes, bytes := 0, statusBytes
	for _, pp := range d.Parts {
		bytes += bindingBytes + 45*len(pp.Devices)
		if !seen[pp.Node] {
			seen[pp.Node] = true
			newNodes++
			if v := nodes[pp.Node]; v != nil {
				bytes += ledgerBytes(&v.Ledger)
			}
		}
		bytes += allocationBytes(d.Pending.Entry.Session, d.Pending.Entry, len(pp.Devices), len(pp.Ports))
	}
	s := state.BindSize(newNodes, 1, len(d.Parts)).Plus(state.QuotaGuardSize(len(quotaScopes(d.Pending.Entry, snap))))
	if d.Pending.Entry.Secrets {
		s = s.Plus(state.SecretsSize(len(d.Parts)))
	}
	s.Bytes = bytes
	return s
}

// Byte estimates of the values a bind writes: generous, so that a batch
// the estimate admits passes the exact check (state.SizeOf) in commitBatch.
const (
	statusBytes  = 1024
	bindingBytes = 1024
)

// allocationBytes estimates one allocation's JSON in a ledger: its fixed
// fields, the plan epoch and queue time included, take at most 272 bytes
// (TestLedgerSizeBound).
func allocationBytes(id string, e *state.QueueEntry, devices, ports int) int {
	n := 272 + len(id) + len(e.Owner) + 48*devices + 8*ports
	for _, g := range e.Groups {
		n += len(g) + 3
	}
	return n
}

// ledgerBytes estimates a ledger's JSON.
func ledgerBytes(l *state.Ledger) int {
	n := 64 + len(l.Node)
	for id, a := range l.Allocations {
		n += 272 + len(id) + len(a.Owner) + 48*len(a.GPUs) + 8*len(a.Ports)
		if a.Team != "" {
			n += 10 + len(a.Team) // ,"team":""
		}
		for _, g := range a.Groups {
			n += len(g) + 3
		}
	}
	return n
}

// batch packs decisions into transactions within the txn budget (ops,
// compares and bytes), each node's decisions in one batch (so batches never
// share a ledger). It fills batches node by node, so a batch closes at a
// node boundary rather than leaving a node's later decisions stranded.
// Decisions that would join two batches, or that no longer fit the batch
// their nodes are in, are deferred to the next pass, which plans them again
// on fresh state. A decision that fits no transaction even alone is
// returned in unfit: it is never committed, and it waits with the limit
// named rather than being planned and deferred every pass.
func (p *Placer) batch(ds []Decision, nodes map[string]*NodeView, snap *Snapshot) (batches []*bindBatch, deferred bool, unfit []Decision) {
	budget := p.budget()
	// Group by head node, keeping the plan's order of first appearance.
	groups := map[string][]Decision{}
	var order []string
	for _, d := range ds {
		if !budget.Fits(decisionSize(&d, map[string]bool{}, nodes, snap)) {
			unfit = append(unfit, d)
			continue
		}
		h := d.Parts[0].Node
		if _, ok := groups[h]; !ok {
			order = append(order, h)
		}
		groups[h] = append(groups[h], d)
	}
	var (
		owner = map[string]*bindBatch{}
		open  *bindBatch
	)
	for _, h := range order {
		group := groups[h]
		var target *bindBatch
		split := false
		for _, d := range group {
			for _, pp := range d.Parts {
				if b, ok := owner[pp.Node]; ok {
					if target != nil && target != b {
						split = true
					}
					target = b
				}
			}
		}
		if split {
			deferred = true
			continue
		}
		if target == nil {
			// What the whole group adds to the open batch.
			if open != nil {
				seen := maps.Clone(open.nodes)
				need := open.size
				for i := range group {
					need = need.Plus(decisionSize(&group[i], seen, nodes, snap))
				}
				if !budget.Fits(need) {
					open = nil
				}
			}
			if open == nil {
				open = &bindBatch{nodes: map[string]bool{}}
				batches = append(batches, open)
			}
			target = open
		}
		for i := range group {
			seen := maps.Clone(target.nodes)
			add := decisionSize(&group[i], seen, nodes, snap)
			if !budget.Fits(target.size.Plus(add)) {
				deferred = true
				continue
			}
			target.decisions = append(target.decisions, group[i])
			target.size = target.size.Plus(add)
			target.nodes = seen
			for _, pp := range group[i].Parts {
				owner[pp.Node] = target
			}
		}
	}
	// A batch whose every decision was deferred writes nothing: it is not
	// committed (an empty transaction would count as progress).
	kept := batches[:0]
	for _, b := range batches {
		if len(b.decisions) > 0 {
			kept = append(kept, b)
		}
	}
	return kept, deferred, unfit
}
