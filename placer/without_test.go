package placer

import (
	"strings"
	"testing"
	"time"
)

// TestParseRules: names read into a set and back, and an unknown name
// refused with the names that would be right.
func TestParseRules(t *testing.T) {
	r, err := ParseRules("lend, reserve,,claims")
	if err != nil {
		t.Fatal(err)
	}
	if r != RuleLend|RuleReserve|RuleClaims || r.String() != "reserve,claims,lend" {
		t.Fatalf("ParseRules = %b (%s), want reserve,claims,lend", r, r)
	}
	if r, err := ParseRules(""); err != nil || r != 0 {
		t.Fatalf("ParseRules(\"\") = %v, %v; want none", r, err)
	}
	_, err = ParseRules("reserve,holds")
	if err == nil || !strings.Contains(err.Error(), `unknown rule "holds"`) || !strings.Contains(err.Error(), "reserve, claims, drainfit, bands, lend") {
		t.Fatalf("ParseRules(reserve,holds) error %v, want the unknown name and the known ones", err)
	}
	// Every name reads as its own constant: ruleNames is in bit order.
	for name, want := range map[string]Rules{"reserve": RuleReserve, "claims": RuleClaims, "drainfit": RuleDrainFit, "bands": RuleBands, "lend": RuleLend} {
		if r, err := ParseRules(name); err != nil || r != want || r.String() != name {
			t.Errorf("ParseRules(%s) = %b (%s), %v; want %b", name, r, r, err, want)
		}
	}
}

// TestWithoutTurnsOffEachRuleAlone: on the cluster where each rule acts
// (its own test's), PlanOptions.Without naming it gives the plan without
// it, and naming the others leaves it acting: what the simulator's
// -without measures is that rule alone.
func TestWithoutTurnsOffEachRuleAlone(t *testing.T) {
	opt := PlanOptions{ReserveAfter: 10 * time.Minute}
	spread := PlanOptions{ReserveAfter: 10 * time.Minute, Strategy: Spread}
	all := RuleReserve | RuleClaims | RuleDrainFit | RuleBands | RuleLend
	reserveOwners := make([]string, 39)
	for i := range reserveOwners {
		reserveOwners[i] = []string{"bob", "ada"}[i%2]
	}
	for _, c := range []struct {
		rule Rules
		s    func() *Snapshot
		opt  PlanOptions
		acts func(*Plan) bool // whether the rule acted in plan
	}{
		{RuleReserve, func() *Snapshot { return snap(reserveCluster(reserveOwners), req("small", "bob", 1, time.Minute)) }, opt,
			func(p *Plan) bool { return len(p.Standing) == 1 && len(p.Bound) == 0 }},
		{RuleClaims, claimCluster, spread,
			func(p *Plan) bool {
				return p.Reserved["n00"] == "" && len(p.Bound) == 1 && p.Bound[0].Parts[0].Node == "n00"
			}},
		{RuleDrainFit, func() *Snapshot { return snap(drainCluster(7), req("s00", "bob", 1, time.Minute)) }, opt,
			func(p *Plan) bool {
				if len(p.Bound) != 1 {
					return false
				}
				_, ok := p.Bound[0].Parts[0].Scores["drain"]
				return ok
			}},
		{RuleBands, func() *Snapshot {
			return snap(spreadCluster(20*time.Minute, 30*time.Minute), req("small", "bob", 1, time.Minute))
		}, spread,
			func(p *Plan) bool { return len(p.Bound) == 1 && p.Bound[0].Parts[0].Node == "two" }},
		{RuleLend, func() *Snapshot {
			return snap(lendCluster(), lendMax(req("long", "bob", 1, 2*time.Minute), 8*time.Hour), req("big", "ada", 8, 0))
		}, opt,
			func(p *Plan) bool { return !boundIDs(p)["long"] }},
	} {
		t.Run(c.rule.String(), func(t *testing.T) {
			if !c.acts(NewPlan(c.s(), c.opt)) {
				t.Fatalf("the rule does not act on its cluster by default")
			}
			others := c.opt
			others.Without = all &^ c.rule
			if !c.acts(NewPlan(c.s(), others)) {
				t.Errorf("without %s the rule does not act", others.Without)
			}
			alone := c.opt
			alone.Without = c.rule
			if p := NewPlan(c.s(), alone); c.acts(p) {
				t.Errorf("without %s the rule still acts: bound %v, held %v, standing %v", c.rule, p.Bound, p.Reserved, p.Standing)
			}
		})
	}
}

// hogCluster is twenty 8-GPU nodes: hog holds twelve whole (96 GPUs,
// above its fair share of 80) and asks for three more whole machines;
// ada holds the other eight but for 4 GPUs (60, below her 80) with a
// 1-GPU request waiting past its hold delay.
func hogCluster() *Snapshot {
	nodes := append(wholeNodes(12, "hog", 7, "ada"), holding(view(gpuNode("n19", 8, "A100")), "a19", "ada", 4))
	return snap(nodes, req("hog-0", "hog", 8, time.Hour), req("hog-1", "hog", 8, time.Hour), req("hog-2", "hog", 8, time.Hour),
		req("small", "ada", 1, 20*time.Minute), req("ada-0", "ada", 8, 0), req("ada-1", "ada", 8, 0), req("ada-2", "ada", 8, 0))
}

// TestOwnerAboveShareHoldsOnItsCharge: hog, above its share with a queue
// of large requests only, holds on its charge budget (its holdings'
// worth, 96 GPUs), here for each of its three requests, while ada, below
// hers and starved, starts her 1-GPU request on the last node's free
// GPUs; and the queue tells hog that it holds its share or more and pays
// for the drain in the fair order, not that it is owed the node.
func TestOwnerAboveShareHoldsOnItsCharge(t *testing.T) {
	plan := NewPlan(hogCluster(), PlanOptions{ReserveAfter: 10 * time.Minute})
	for _, id := range []string{"hog-0", "hog-1", "hog-2"} {
		if got := heldFor(plan, id); len(got) != 1 {
			t.Errorf("%s holds %v, want one node", id, got)
		}
	}
	if len(plan.Bound) != 1 || plan.Bound[0].Pending.Entry.Session != "small" || plan.Bound[0].Parts[0].Node != "n19" {
		t.Errorf("bound %v, want ada's 1-GPU request on n19", plan.Bound)
	}
	seen := false
	for _, w := range plan.Waiting {
		if w.Pending.Entry.Session != "hog-0" {
			continue
		}
		seen = true
		want := "though its owner holds its fair share of the cluster or more: the GPUs kept idle here count as its owner's in the fair order until it starts)"
		if !strings.HasSuffix(w.Message, want) || strings.Contains(w.Message, "less than its fair share") {
			t.Errorf("hog-0's reason %q, want it to end %q", w.Message, want)
		}
		t.Logf("hog-0: %s", w.Message)
	}
	if !seen {
		t.Error("hog-0 is not in the plan's waiting list")
	}
}
