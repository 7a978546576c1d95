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
