package placer

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// transferCluster is 40 nodes of 8 GPUs: flood runs seven 1-GPU
// sessions on each of the first 24 (one GPU free; node i's last session
// ends by its max runtime at i+1 hours), e0 and e1 one 8-GPU session
// each on the others (ending within 20 minutes: the nodes that free a
// whole machine soonest), e0 on 8 of them.
func transferCluster() []NodeView {
	nodes := make([]NodeView, 0, 40)
	for i := range 40 {
		v := view(gpuNode(fmt.Sprintf("n%02d", i), 8, "A100"))
		if i < 24 {
			for g := range 7 {
				v.Ledger.Allocations[fmt.Sprintf("f%02d-%d", i, g)] = state.Allocation{
					Owner: "flood", Role: state.RoleSingle, CPUMilli: 1000, MemoryMiB: 1024,
					GPUs: []string{v.Node.GPUs[g].UUID}, Ends: t0.Add(time.Duration(i+1) * time.Hour),
				}
			}
		} else {
			owner := "e1"
			if i < 32 {
				owner = "e0"
			}
			v = holding(v, fmt.Sprintf("s%02d", i), owner, 8)
			a := v.Ledger.Allocations[fmt.Sprintf("s%02d", i)]
			a.Ends = t0.Add(20 * time.Minute)
			v.Ledger.Allocations[fmt.Sprintf("s%02d", i)] = a
		}
		v.LedgerRevision = 7
		nodes = append(nodes, v)
	}
	return nodes
}

// TestTransferDrainsNodesOfAnOwnerAboveItsShare: flood holds 168 GPUs,
// above its fair share (136: e1's demand is what it holds, 64, and e0's
// 128 with the eight 8-GPU requests it waits for), and e0, below its
// share, waits for whole machines. e0's holds take the nodes that free
// soonest, which are e0's and e1's own; those only move whole machines
// between the two. So beside them flood's nodes drain, the soonest by
// their sessions' max runtimes first, as many as whole machines of
// flood's excess and e0's wait, at most a tenth of the nodes: n00–n03.
// flood's 1-GPU requests fill the other free GPUs and are told why not
// those four. With the rule off (PlanOptions.Without) they take all 24.
func TestTransferDrainsNodesOfAnOwnerAboveItsShare(t *testing.T) {
	pending := []Pending{}
	for i := range 8 {
		pending = append(pending, req(fmt.Sprintf("e0-%d", i), "e0", 8, time.Hour))
	}
	for i := range 24 {
		pending = append(pending, lendMax(req(fmt.Sprintf("flood-%d", i), "flood", 1, time.Duration(i)*time.Second), 30*time.Minute))
	}
	opt := PlanOptions{ReserveAfter: 10 * time.Minute}
	plan := NewPlan(snap(transferCluster(), pending...), opt)
	var onNodes []string
	for _, d := range plan.Bound {
		if d.Pending.Entry.Owner != "flood" {
			t.Fatalf("bound %s on %s, want only flood's 1-GPU requests placed", d.Pending.Entry.Session, d.Parts[0].Node)
		}
		onNodes = append(onNodes, d.Parts[0].Node)
	}
	slices.Sort(onNodes)
	for _, kept := range []string{"n00", "n01", "n02", "n03"} {
		if slices.Contains(onNodes, kept) {
			t.Errorf("a flood request placed on %s, want it kept draining for e0", kept)
		}
	}
	if len(onNodes) != 20 {
		t.Errorf("flood placed on %d nodes (%v), want the 20 not draining", len(onNodes), onNodes)
	}
	if want := []string{"n00", "n01", "n02", "n03"}; !slices.Equal(plan.Standing, want) {
		t.Errorf("kept nodes with GPUs free %v, want %v", plan.Standing, want)
	}
	var told bool
	for _, w := range plan.Waiting {
		if w.Pending.Entry.Owner == "flood" && strings.Contains(w.Message, "owners below their fair share") {
			told = true
			t.Logf("flood's reason: %s", w.Message)
			break
		}
	}
	if !told {
		t.Errorf("waiting %+v, want flood's requests told the nodes drain for owners below their share", plan.Waiting)
	}
	for _, id := range []string{"e0-0", "e0-1"} {
		held := heldFor(plan, id)
		if len(held) != 1 || held[0] < "n24" {
			t.Errorf("%s holds %v, want one of e0's or e1's nodes (they free soonest)", id, held)
		}
	}

	opt.Without = RuleTransfer
	plan = NewPlan(snap(transferCluster(), pending...), opt)
	if len(plan.Bound) != 24 || len(plan.Standing) != 0 {
		t.Errorf("without transfer: %d bound, kept %v; want all 24 flood requests placed, none kept", len(plan.Bound), plan.Standing)
	}
}

// TestNoTransferForSmallRequests: flood is above its share as before,
// but the owners below it wait only for single GPUs, which the free GPUs
// of flood's nodes fit: no node is kept, and each request starts.
func TestNoTransferForSmallRequests(t *testing.T) {
	var pending []Pending
	for i := range 8 {
		pending = append(pending, req(fmt.Sprintf("e0-%d", i), "e0", 1, time.Hour))
	}
	for i := range 24 {
		pending = append(pending, lendMax(req(fmt.Sprintf("flood-%d", i), "flood", 1, time.Duration(i)*time.Second), 30*time.Minute))
	}
	plan := NewPlan(snap(transferCluster(), pending...), PlanOptions{ReserveAfter: 10 * time.Minute})
	if len(plan.Standing) != 0 {
		t.Errorf("kept %v, want none: no one below its share waits for a whole machine", plan.Standing)
	}
	if len(plan.Bound) != 24 || plan.Bound[0].Pending.Entry.Owner != "e0" {
		t.Errorf("%d bound, first %v; want 24, e0's eight first", len(plan.Bound), plan.Bound[0].Pending.Entry.Session)
	}
}
