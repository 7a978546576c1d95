package placer

import (
	"context"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/internal/rendezvous"
	"github.com/voyager-gpu/voyager/state"
)

// Advisory writes: waiting sessions' reasons and queue positions, written in
// their own goroutine so that explaining never delays a bind.

// advice is what one pass leaves to explain: the plan's waiting sessions,
// the live placers that share them, and the decisions of this placer that
// fit no transaction.
type advice struct {
	plan   *Plan
	owners []string
	unfit  []Decision
}

// offer hands a to the advisory writer, replacing advice it has not taken
// yet: only the newest pass's explanation matters. Only the run loop calls
// it, so the loop below ends.
func (p *Placer) offer(a advice) {
	for {
		select {
		case p.advice <- a:
			return
		default:
			select {
			case <-p.advice:
			default:
			}
		}
	}
}

// advise writes pending statuses until ctx ends, from the newest advice.
func (p *Placer) advise(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case a := <-p.advice:
			p.writeWaiting(ctx, a)
		}
	}
}

// unfitMessage says why d is never committed: its bind fits no transaction.
func (p *Placer) unfitMessage(d Decision) string {
	return fmt.Sprintf("binding this session on %d nodes needs a transaction larger than the limit of %d operations and %d bytes (VOYAGER_PLACER_MAX_TXN_OPS, etcd's --max-txn-ops and --max-request-bytes); ask for fewer Ray workers",
		len(d.Parts), p.cfg.MaxTxnOps, p.cfg.MaxTxnBytes)
}

// writeWaiting tells waiting sessions of this placer's share why they wait
// and where they are in the queue, writing only what changed and at most
// StatusBudget statuses per pass. Each write is a nested transaction that
// applies only if the session is still pending at the revision planned;
// the writes are packed into transactions within the txn budget (nested
// operations count against etcd's limit less the outer ones), each with
// its own AdvisoryTimeout.
func (p *Placer) writeWaiting(ctx context.Context, a advice) {
	now := p.cfg.Now()
	k := p.cfg.Keys
	plan, ids := a.plan, a.owners
	waiting := slices.Clip(plan.Waiting) // appending never writes into the plan
	for i := range a.unfit {
		d := &a.unfit[i]
		waiting = append(waiting, Waiting{Pending: d.Pending, Position: len(waiting) + 1, Reason: "Unsatisfiable", Message: p.unfitMessage(*d)})
	}
	budget := p.budget()
	var (
		ops  []clientv3.Op
		size state.TxnSize
	)
	// Every written status of a session still waiting is marked with this
	// call's generation; the rest are forgotten at the end.
	p.writtenGen++
	gen := p.writtenGen
	type pendingWrite struct {
		id string
		ws writtenStatus
	}
	var batch []pendingWrite
	flush := func() {
		if len(ops) == 0 {
			return
		}
		wctx, cancel := context.WithTimeout(ctx, p.cfg.AdvisoryTimeout)
		resp, err := p.advisoryKV.Txn(wctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				p.log.Warn("write pending statuses", "err", err, "statuses", len(batch))
			}
		} else {
			// Only the statuses whose nested compare held were written: a
			// queue entry changed since the plan (a preemption's hold
			// written into it, a resubmission) refused its write, and
			// remembering it as written would keep the same reason from
			// being written on any later pass.
			n := 0
			for i, w := range batch {
				if i < len(resp.Responses) && resp.Responses[i].GetResponseTxn().GetSucceeded() {
					p.written[w.id] = w.ws
					n++
				}
			}
			p.statuses.Add(int64(n))
		}
		ops, batch, size = ops[:0], batch[:0], state.TxnSize{}
	}
	left := p.cfg.StatusBudget
	for _, w := range waiting {
		e := w.Pending.Entry
		last, ok := p.written[e.Session]
		if ok {
			last.gen = gen
			p.written[e.Session] = last
		}
		if left == 0 || ctx.Err() != nil || rendezvous.Owner(ids, e.Session) != p.cfg.ID {
			continue
		}
		// A new reason is written at once; a changed message or position
		// under the same reason (the best node's free count, sessions
		// ahead) at most every StatusRefresh: the API computes live queue
		// positions itself, so etcd need not carry every step.
		if ok && last.reason == w.Reason && now.Sub(last.at) < p.cfg.StatusRefresh {
			continue
		}
		msg := w.Message + "; " + ahead(w.Position-1)
		if ok && last.reason == w.Reason && last.message == msg {
			continue
		}
		// EventExplain: the nested txn's compare of the queue entry is
		// its guard (an entry exists only while the status is Pending).
		phase, err := state.Next(state.PhasePending, state.EventExplain, state.Facts{Queued: true})
		if err != nil {
			continue
		}
		st := state.Status{Session: e.Session, Phase: phase, Reason: w.Reason, Message: msg,
			QueuePosition: w.Position, Attempt: e.Attempt, Created: e.Created, Updated: now.UTC()}
		v, err := state.Encode(st)
		if err != nil {
			continue
		}
		op := clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k.Pending(e.Session)), "=", w.Pending.Revision)},
			[]clientv3.Op{clientv3.OpPut(k.Status(e.Session), v)}, nil)
		add := state.SizeOf(nil, []clientv3.Op{op}, nil)
		if !budget.Fits(size.Plus(add)) {
			flush()
		}
		ops = append(ops, op)
		size = size.Plus(add)
		batch = append(batch, pendingWrite{e.Session, writtenStatus{reason: w.Reason, message: msg, position: w.Position, at: now, gen: gen}})
		left--
	}
	flush()
	for id, w := range p.written {
		if w.gen != gen {
			delete(p.written, id)
		}
	}
}

func ahead(n int) string {
	switch n {
	case 0:
		return "you are next in line"
	case 1:
		return "1 session ahead of you"
	}
	return fmt.Sprintf("%d sessions ahead of you", n)
}
