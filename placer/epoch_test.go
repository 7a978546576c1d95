package placer

import (
	"fmt"
	"maps"
	"math/rand"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// applyPart is s with the decisions ds bound in epoch: their allocations
// (recording the epoch and when each was queued) in the ledgers they went
// to, each such ledger at a new revision, their sessions off the queue, as
// a placer's caches show another placer's commits of part of its plan.
func applyPart(s *Snapshot, ds []Decision, epoch int64) *Snapshot {
	out := &Snapshot{Now: s.Now, UserQuotas: s.UserQuotas, GroupQuotas: s.GroupQuotas, QuotaRevisions: s.QuotaRevisions}
	byNode := map[string]map[string]state.Allocation{}
	bound := map[string]bool{}
	for _, d := range ds {
		bound[d.Pending.Entry.Session] = true
		for _, pp := range d.Parts {
			if byNode[pp.Node] == nil {
				byNode[pp.Node] = map[string]state.Allocation{}
			}
			a := allocation(d.Pending.Entry, pp)
			a.Plan, a.Queued = epoch, d.Pending.Entry.Created
			byNode[pp.Node][d.Pending.Entry.Session] = a
		}
	}
	for _, v := range s.Nodes {
		if add := byNode[v.Node.Name]; add != nil {
			all := maps.Clone(v.Ledger.Allocations)
			if all == nil {
				all = map[string]state.Allocation{}
			}
			maps.Copy(all, add)
			v.Ledger = state.Ledger{Node: v.Node.Name, Allocations: all}
			v.LedgerRevision = epoch + 1 + int64(len(out.Nodes))
		}
		out.Nodes = append(out.Nodes, v)
	}
	for _, p := range s.Pending {
		if !bound[p.Entry.Session] {
			out.Pending = append(out.Pending, p)
		}
	}
	return out
}

// planKey is a plan's outcome as text: each decision's session, nodes and
// devices, in order, then each waiting session with its position and
// reason.
func planKey(p *Plan, skip map[string]bool) (bound, waiting []string) {
	for _, d := range p.Bound {
		if skip[d.Pending.Entry.Session] {
			continue
		}
		bound = append(bound, fmt.Sprintf("%s@%v", d.Pending.Entry.Session, d.Parts))
	}
	for _, w := range p.Waiting {
		waiting = append(waiting, fmt.Sprintf("%d:%s:%s", w.Position, w.Pending.Entry.Session, w.Reason))
	}
	return bound, waiting
}

// TestPinnedEpochPlansTheRestOfThePlan: a placer whose snapshot shows part
// of an epoch's plan bound (another placer's share, committed before this
// one took its snapshot) plans, with the epoch's binds pinned, exactly the
// rest of that plan: the same sessions on the same nodes and devices, and
// the same sessions waiting with the same positions and reasons. Without
// pinning (the epoch taken as done, as a placer would before epochs) the
// plan of the rest differs, so this test can fail.
func TestPinnedEpochPlansTheRestOfThePlan(t *testing.T) {
	unpinnedDiffers, runs := 0, 0
	for _, strategy := range []Strategy{Binpack, Spread} {
		for seed := int64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("%s/seed=%d", strategy, seed), func(t *testing.T) {
				s := newPlanBenchSnapshot(60, 1500)
				fresh := int64(len(s.Pending) + 1)
				PinEpoch(s, 0, fresh)
				if s.Epoch != fresh {
					t.Fatalf("epoch of a snapshot with no binds = %d, want the newest revision read, %d", s.Epoch, fresh)
				}
				opt := PlanOptions{Strategy: strategy}
				whole := NewPlan(s, opt)
				if len(whole.Bound) < 100 || len(whole.Waiting) == 0 {
					t.Fatalf("the plan binds %d and leaves %d waiting: want a full cluster and a queue", len(whole.Bound), len(whole.Waiting))
				}
				// Another placer's share: the decisions on a third of the
				// nodes, of which it has committed a random part.
				rng := rand.New(rand.NewSource(seed))
				var part []Decision
				applied := map[string]bool{}
				for _, d := range whole.Bound {
					if int(d.Parts[0].Node[len(d.Parts[0].Node)-1]-'0')%3 == 0 && rng.Intn(3) > 0 {
						part = append(part, d)
						applied[d.Pending.Entry.Session] = true
					}
				}
				later := applyPart(s, part, s.Epoch)
				PinEpoch(later, 0, fresh+int64(len(part)))
				if later.Epoch != s.Epoch {
					t.Fatalf("a snapshot showing %d binds of epoch %d and nothing newer plans epoch %d", len(part), s.Epoch, later.Epoch)
				}
				runs++
				rest := NewPlan(later, opt)
				wantBound, wantWaiting := planKey(whole, applied)
				gotBound, gotWaiting := planKey(rest, nil)
				if fmt.Sprint(gotBound) != fmt.Sprint(wantBound) {
					t.Fatalf("with %d of the epoch's binds pinned, the plan of the rest differs from the epoch's:\n got %d decisions %.300v\nwant %d decisions %.300v", len(part), len(gotBound), gotBound, len(wantBound), wantBound)
				}
				if fmt.Sprint(gotWaiting) != fmt.Sprint(wantWaiting) {
					t.Fatalf("with the epoch's binds pinned, the waiting sessions differ:\n got %.300v\nwant %.300v", gotWaiting, wantWaiting)
				}
				// The control: the same snapshot, the epoch taken as
				// done, plans the rest on the state as it is.
				unpinned := applyPart(s, part, s.Epoch)
				PinEpoch(unpinned, s.Epoch, fresh+int64(len(part)))
				other := NewPlan(unpinned, opt)
				if b, w := planKey(other, nil); fmt.Sprint(b) == fmt.Sprint(wantBound) && fmt.Sprint(w) == fmt.Sprint(wantWaiting) {
					t.Logf("without pinning the plan of the rest is the same for this seed")
				} else {
					unpinnedDiffers++
				}
			})
		}
	}
	if unpinnedDiffers == 0 {
		t.Fatalf("without pinning, every plan of the rest equalled the epoch's: the test cannot tell pinning from none")
	}
	t.Logf("without pinning, %d of %d plans of the rest differed from the epoch's", unpinnedDiffers, runs)
}
