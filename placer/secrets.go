package placer

import (
	"context"
	"fmt"
	"maps"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// secretReadsPerTxn bounds the reads of one round trip that fetches the
// secrets of a batch's sessions (etcd's --max-txn-ops counts reads too).
const secretReadsPerTxn = 64

// attachSecrets reads the secrets records (specsecrets/<id>) of the
// placements in t that need them and attaches them, so that the bind
// hands each of the session's nodes its copy (boundsecrets/<node>/<id>),
// which that node's agent alone may read. A session whose record is gone
// (retired in between) binds without: its agent refuses to start it
// without its secrets. Placements that no longer fit the transaction
// once their secrets are counted are left out of t, their allocations
// taken off its ledgers, and counted in the returned number: the next
// pass plans them again.
func (p *Placer) attachSecrets(ctx context.Context, t *bindTxn) (int, error) {
	k := p.cfg.Keys
	var need []int
	for i := range t.ps {
		if t.ps[i].NeedsSecrets {
			need = append(need, i)
		}
	}
	for len(need) > 0 {
		n := min(len(need), secretReadsPerTxn)
		// From any member that holds the queue entries planned (their
		// records are written with them, and once gone stay gone).
		var atLeast int64
		for _, i := range need[:n] {
			atLeast = max(atLeast, t.ps[i].PendingRevision)
		}
		resp, err := state.ReadAtLeast(ctx, p.cli, atLeast, func(o ...clientv3.OpOption) []clientv3.Op {
			gets := make([]clientv3.Op, n)
			for j, i := range need[:n] {
				gets[j] = clientv3.OpGet(k.SpecSecrets(t.ps[i].Session), o...)
			}
			return gets
		})
		if err != nil {
			return 0, fmt.Errorf("read session secrets: %w", err)
		}
		for j, i := range need[:n] {
			kvs := resp.Responses[j].GetResponseRange().Kvs
			if len(kvs) == 0 {
				p.log.Warn("session has no secrets record to hand its nodes", "session", t.ps[i].Session)
				continue
			}
			sec, err := state.Decode[state.SpecSecrets](kvs[0].Value)
			if err != nil {
				return 0, fmt.Errorf("read secrets of %s: %w", t.ps[i].Session, err)
			}
			t.ps[i].Secrets = &sec
		}
		need = need[n:]
	}
	return p.trimToBudget(t)
}

// trimToBudget leaves out of t the last placements while its transaction
// exceeds the budget (secrets make binds larger than the plan counted),
// keeping at least one; it returns how many it left out.
func (p *Placer) trimToBudget(t *bindTxn) (int, error) {
	left := 0
	for len(t.ps) > 1 {
		_, cmps, ops, err := p.bindOpsUnchecked(t)
		if err != nil {
			return 0, err
		}
		if p.budget().Fits(state.SizeOf(cmps, ops, nil)) {
			break
		}
		last := t.ps[len(t.ps)-1]
		for _, bd := range last.Bindings {
			w := t.writes[bd.Node]
			w.Ledger.Allocations = maps.Clone(w.Ledger.Allocations)
			delete(w.Ledger.Allocations, last.Session)
		}
		t.ps = t.ps[:len(t.ps)-1]
		left++
	}
	return left, nil
}

// bindOpsUnchecked is bindOps without the budget check.
func (p *Placer) bindOpsUnchecked(t *bindTxn) ([]state.LedgerWrite, []clientv3.Cmp, []clientv3.Op, error) {
	used := map[string]bool{}
	for _, pl := range t.ps {
		for _, bd := range pl.Bindings {
			used[bd.Node] = true
		}
	}
	lws := make([]state.LedgerWrite, 0, len(t.order))
	for _, n := range t.order {
		if used[n] {
			lws = append(lws, *t.writes[n])
		}
	}
	cmps, ops, err := state.BindOps(p.cfg.Keys, lws, t.ps)
	return lws, cmps, ops, err
}
