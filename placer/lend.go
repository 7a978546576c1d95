package placer

import (
	"fmt"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// Lending only short work (issue 34). The fair order serves owners below
// their fair share first; what they cannot use this pass (a request for
// a whole machine finds none, however many single GPUs are free) goes to
// owners at or above their share. A GPU lent that way for hours is one a
// drain must wait for: the below-share owner's large request waits for
// the long session an above-share owner started beside it. So while a
// request of an owner below its fair share waits for room in this pass,
// an owner at or above its share starts only work expected to end within
// lendFor: by its max runtime, or by its owner's recent run times where
// those say it ends sooner (endsOf). Longer work, and work that declares
// no max runtime, waits until no owner below its share waits for room, or
// until its owner falls below its share. The GPUs it leaves free go to
// the waiting owner's holds and drains, or to short work.
//
// What it costs: GPUs that no waiting request could use stay idle while
// the below-share request waits; busy while waiting with binpack fell by
// at most 0.2 points at 200 nodes, 0.6 at 100 and 0.9 at 40
// (placer/README.md, item 9). What it buys: whole machines drain sooner
// for the owners owed them: at 200 nodes 27 of the suite's 96 runs miss
// a goal against 31, at 100 nodes 38 against 43, and at 40 nodes
// steady-90's 8/1 with binpack is 2.96–3.90 against 5.33–8.67.
//
// The rule reads only what the pass has decided: an above-share request
// is held back only by a below-share request of at least its priority
// left waiting earlier in the fair order (owners go by weighted share,
// so those below their fair share are mostly read first; one read later
// keeps back only what follows it), for capacity rather than a quota or
// a model no node has, that
// could use the same GPUs (either asks for any model, or both for the
// same). A request for no GPUs is not held back (fair share counts GPUs
// only), nor is a request holding nodes: its holds were
// granted against its owner's charge budget (hold.go), and a node drained
// for it would otherwise stand idle. With ReserveAfter zero (holds off)
// nothing is lent short, nor below 20 nodes, as the standing reserve,
// claims and the drain fit: there the owner above its share loses most
// of what it gets to a rule that keeps GPUs for others (at 16 nodes it
// broke 14 of TestSuiteGoals' floors, adv-sticky-small's Jain's least
// with spread seed 3 falling to 0.500 and adv-burst-1's with binpack
// seed 2 to 0.56).

// lendFor is how soon the work of an owner at or above its fair share
// must be expected to end to start while an owner below its share waits
// for room. Swept from 30 minutes to 4 hours at 200 nodes without a
// change beyond noise (placer/README.md, item 9): the sessions it holds
// back are those of hours, which every such limit catches.
const lendFor = time.Hour

// lender is a waiting request that keeps back requests of at most its
// priority that may use the GPUs it asks for (model: its GPU model
// pattern, "" for any), and who it is, for their messages.
type lender struct {
	priority   int
	model, who string
}

// noteWaiting records e, just left waiting for reason, as keeping long
// work of owners at or above their share back, if its owner is below its
// fair share and it waits for room (reason Capacity).
func (p *planner) noteWaiting(e *state.QueueEntry, reason string) {
	p.noteWaitingAs(e.Owner, p.ownerHoldsOf(e.Owner).budget > 0, e.Priority, e.Request.GPUModel, func() *state.QueueEntry { return e }, reason)
}

// noteWaitingAs is noteWaiting with e's owner, whether it has a hold
// budget (is below its fair share), priority and GPU model given (the
// tail's facts, tail.go): it asks entry for e only to note it (the tail
// reads no entry of the thousands of requests it answers).
func (p *planner) noteWaitingAs(owner string, budget bool, priority int, model string, entry func() *state.QueueEntry, reason string) {
	if !p.on(RuleLend) || !p.keepsAhead() || reason != "Capacity" || !budget {
		return
	}
	for _, l := range p.lenders {
		if l.priority == priority && l.model == model {
			return // the first of its kind speaks for it
		}
	}
	p.lenders = append(p.lenders, lender{priority, model, fmt.Sprintf("%s's request for %s", owner, describe(&entry().Request))})
}

// shortOnly reports why e may not start this pass under lending, or ""
// where it may: its owner is at or above its fair share, a request noted
// by noteWaiting keeps it back, it asks for GPUs, it holds no nodes, and
// it is not expected to end within lendFor. open is e's tail facts where
// it is on the tail's path (place), or nil: such a request holds no
// nodes, and its owner's budget is read from them.
func (p *planner) shortOnly(e *state.QueueEntry, open *tailFacts) string {
	if len(p.lenders) == 0 {
		return ""
	}
	if open != nil {
		if open.owner.backfill {
			return ""
		}
	} else if p.ownerHoldsOf(e.Owner).budget > 0 || len(p.holding[e.Session]) > 0 || p.holds[e.Session] {
		return ""
	}
	if requestGPUs(e, p.usage.shareRef) == 0 {
		return "" // takes no GPU: fair share, counted in GPUs, says nothing of it
	}
	var by string
	for _, l := range p.lenders { // in the order noted: the same message on every placer
		if l.priority >= e.Priority && (l.model == "" || e.Request.GPUModel == "" || l.model == e.Request.GPUModel) {
			by = l.who
			break
		}
	}
	if by == "" {
		return ""
	}
	limit := p.snap.Now.Add(lendFor)
	end := p.plannedEnd(e)
	if !end.IsZero() && !end.After(limit) {
		return ""
	}
	// Written piece by piece, not by fmt: at 2,000 owners thousands of
	// requests a pass get it (fmt's were 3% of the pass).
	b := make([]byte, 0, 320)
	b = append(b, "waiting for "...)
	b = append(b, describe(&e.Request)...)
	b = append(b, ": "...)
	b = append(b, e.Owner...)
	b = append(b, " holds its fair share of the cluster or more while an owner below theirs waits for room ("...)
	b = append(b, by...)
	b = append(b, "); until it starts, only work expected to end within "...)
	b = append(b, lendForWords...)
	b = append(b, " starts for "...)
	b = append(b, e.Owner...)
	if end.IsZero() {
		b = append(b, ", and this request declares no max runtime"...)
	} else {
		b = append(b, ", and this request is expected to run until "...)
		b = end.UTC().AppendFormat(b, "15:04 MST")
	}
	return string(b)
}

// lendForWords is lendFor as shortOnly's message says it.
var lendForWords = lendFor.String()
