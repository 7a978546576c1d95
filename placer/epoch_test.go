package placer

import (
	"fmt"
	"maps"
	"math/rand"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// applyPart is s with the decisions ds bound in epoch: their allocations
// (recording the epoch and when each was queued) in the ledgers they went
// to, each such ledger at a new revision, their sessions off the queue, as
// a placer's caches show another placer's commits of part of its plan.
func applyPart(s *Snapshot, ds []Decision, epoch int64) *Snapshot {
	out := &Snapshot{Now: s.Now, UserQuotas: s.UserQuotas, GroupQuotas: s.GroupQuotas, QuotaRevisions: s.QuotaRevisions, Teams: s.Teams}
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

// TestReleaseEndsTheEpoch: a release after an epoch's binds ends the epoch.
// Planned again with the freed GPUs, the epoch's order (which counts each
// pinned session's GPUs only from its turn) gave them to the owner who
// came first in it, and let the sessions before the pins take the pins'
// devices. The control plans the same snapshot without telling PinEpoch of
// the release, and must show that plan wrong, so this test can fail.
func TestReleaseEndsTheEpoch(t *testing.T) {
	// n1 is bob's (4 of 4 GPUs), carol holds 1 of n2's 4. ada queued first:
	// a 4-GPU session that fits nowhere, then three of 1 GPU; bob four of 1.
	n1 := holding(view(gpuNode("n1", 4, "A100")), "b0", "bob", 4)
	n2 := holding(view(gpuNode("n2", 4, "A100")), "c0", "carol", 1)
	pending := []Pending{req("a1", "ada", 4, 10*time.Minute)}
	for i := 2; i <= 4; i++ {
		pending = append(pending, req(fmt.Sprintf("a%d", i), "ada", 1, time.Duration(10-i)*time.Minute))
	}
	for i := 1; i <= 4; i++ {
		pending = append(pending, req(fmt.Sprintf("b%d", i), "bob", 1, time.Duration(5-i)*time.Minute))
	}
	s := snap([]NodeView{n1, n2}, pending...)
	PinEpoch(s, 0, 100)
	epoch := NewPlan(s, PlanOptions{})
	if b, _ := planKey(epoch, nil); len(b) != 3 {
		t.Fatalf("the epoch's plan binds %v: want ada's three 1-GPU sessions on n2", b)
	}
	// The epoch's binds land, then bob's b0 ends: n1 is free.
	released := func(freed int64) *Snapshot {
		later := applyPart(s, epoch.Bound, s.Epoch)
		v := &later.Nodes[0]
		v.Ledger.Allocations = maps.Clone(v.Ledger.Allocations)
		delete(v.Ledger.Allocations, "b0")
		v.LedgerRevision = 120
		later.Freed = freed
		PinEpoch(later, 0, 121)
		return later
	}
	check := func(later *Snapshot, plan func(*Snapshot, PlanOptions) *Plan) error {
		p := plan(later, PlanOptions{})
		if err := checkPlan(later, p); err != nil {
			return err
		}
		got := map[string]int{}
		for _, d := range p.Bound {
			for _, pp := range d.Parts {
				got[d.Pending.Entry.Owner] += len(pp.Devices)
			}
		}
		// ada holds 3, bob none: the freed GPUs are bob's until he
		// passes her (3 of them, or all 4: the order breaks the tie).
		if got["bob"] < 3 || got["ada"] != 0 {
			return fmt.Errorf("the freed GPUs went %v: want bob at least 3, ada none", got)
		}
		return nil
	}
	later := released(120)
	if later.Epoch < 120 {
		t.Fatalf("after a release at 120 the snapshot plans epoch %d: want a new epoch", later.Epoch)
	}
	if err := check(later, NewPlan); err != nil {
		t.Fatal(err)
	}
	// The control: the release unknown to PinEpoch, and the epoch planned
	// again as it is (newPlan: NewPlan would find that a pinned session's
	// devices went to an earlier one, and plan afresh).
	stale := released(0)
	if stale.Epoch != s.Epoch {
		t.Fatalf("control: the snapshot plans epoch %d, want the old epoch %d planned again", stale.Epoch, s.Epoch)
	}
	pinned := func(s *Snapshot, opt PlanOptions) *Plan {
		p, _ := newPlan(s, opt, nil)
		return p
	}
	if err := check(stale, pinned); err == nil {
		t.Fatal("control: planning the old epoch again with the release was right too: the test cannot fail")
	} else {
		t.Logf("control, the old epoch planned again: %v", err)
	}
	// NewPlan finds the pinned sessions' devices taken before their
	// turn, leaves the epoch and plans afresh: right even so.
	if err := check(stale, NewPlan); err != nil {
		t.Errorf("NewPlan on the old epoch, the release unknown: %v", err)
	}
}

// TestTakesOff: the ledgers watch tells a release (an allocation gone from
// a ledger, or a ledger deleted with allocations) from a bind (allocations
// only added), which ends no epoch.
func TestTakesOff(t *testing.T) {
	l := func(ids ...string) state.Ledger {
		out := state.Ledger{Node: "n1", Allocations: map[string]state.Allocation{}}
		for _, id := range ids {
			out.Allocations[id] = state.Allocation{Owner: "ada"}
		}
		return out
	}
	ptr := func(v state.Ledger) *state.Ledger { return &v }
	for _, tc := range []struct {
		name string
		ev   watcher.Event[state.Ledger]
		want bool
	}{
		{"first write", watcher.Event[state.Ledger]{Type: watcher.Added, Value: l("s1")}, false},
		{"a bind", watcher.Event[state.Ledger]{Type: watcher.Modified, Prev: ptr(l("s1")), Value: l("s1", "s2")}, false},
		{"a release", watcher.Event[state.Ledger]{Type: watcher.Modified, Prev: ptr(l("s1", "s2")), Value: l("s2")}, true},
		{"a release and a bind", watcher.Event[state.Ledger]{Type: watcher.Modified, Prev: ptr(l("s1")), Value: l("s2")}, true},
		{"the same ledger again", watcher.Event[state.Ledger]{Type: watcher.Modified, Prev: ptr(l("s1")), Value: l("s1")}, false},
		{"a ledger deleted with a session", watcher.Event[state.Ledger]{Type: watcher.Deleted, Value: l("s1"), Prev: ptr(l("s1"))}, true},
		{"an empty ledger deleted", watcher.Event[state.Ledger]{Type: watcher.Deleted, Value: l(), Prev: ptr(l())}, false},
	} {
		if got := takesOff(tc.ev); got != tc.want {
			t.Errorf("%s: takesOff = %v, want %v", tc.name, got, tc.want)
		}
	}
}
