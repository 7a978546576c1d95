package placer

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// lendCluster is twenty 8-GPU A100 nodes: bob holds the first fifteen
// whole (120 GPUs, above his fair share of 116 once ada waits too),
// carol the next four (32, all she asks for), ada 4 GPUs of the last, so
// 4 are free and no node is whole. Lending acts from 20 nodes.
func lendCluster() []NodeView {
	nodes := wholeNodes(15, "bob", 4, "carol")
	return append(nodes, holding(view(gpuNode("n19", 8, "A100")), "a0", "ada", 4))
}

// wholeNodes is 8-GPU A100 nodes n00, n01, … each held whole by one
// session: the first n1 by owner1, the next n2 by owner2.
func wholeNodes(n1 int, owner1 string, n2 int, owner2 string) []NodeView {
	var nodes []NodeView
	for i := range n1 + n2 {
		owner := owner1
		if i >= n1 {
			owner = owner2
		}
		nodes = append(nodes, holding(view(gpuNode(fmt.Sprintf("n%02d", i), 8, "A100")), fmt.Sprintf("s%02d", i), owner, 8))
	}
	return nodes
}

// lendMax is p with a max runtime of d.
func lendMax(p Pending, d time.Duration) Pending {
	p.Entry.MaxRuntime = state.Duration(d)
	return p
}

// boundIDs is the sessions plan binds.
func boundIDs(plan *Plan) map[string]bool {
	out := map[string]bool{}
	for _, d := range plan.Bound {
		out[d.Pending.Entry.Session] = true
	}
	return out
}

// TestLendOnlyShortWork: while ada, below her fair share, waits for a
// whole machine that no node has free, bob, above his, starts only work
// expected to end within lendFor: his 30-minute request takes a free GPU,
// his 8-hour one and his notebook with no max runtime wait, told why. His
// long work starts where nothing keeps it back: without ada's request,
// with holds off (the policy before issue 34), with lending off alone
// (PlanOptions.Without), on four nodes (lending
// acts from 20, as the standing reserve), at a higher priority than
// hers, where she waits for a GPU model his request does not ask for, and
// where she waits on her quota rather than for room.
func TestLendOnlyShortWork(t *testing.T) {
	opt := PlanOptions{ReserveAfter: 10 * time.Minute}
	short := lendMax(req("short", "bob", 1, time.Minute), 30*time.Minute)
	long := lendMax(req("long", "bob", 1, 2*time.Minute), 8*time.Hour)
	notebook := req("notebook", "bob", 1, 3*time.Minute)
	big := req("big", "ada", 8, 0)

	plan := NewPlan(snap(lendCluster(), short, long, notebook, big), opt)
	got := boundIDs(plan)
	if !got["short"] || got["long"] || got["notebook"] || got["big"] {
		t.Fatalf("bound %v; want only bob's 30-minute request while ada's 8-GPU request waits", got)
	}
	msgs := map[string]string{}
	for _, w := range plan.Waiting {
		msgs[w.Pending.Entry.Session] = w.Message
		if w.Reason != "Capacity" {
			t.Errorf("%s waits as %q, want Capacity", w.Pending.Entry.Session, w.Reason)
		}
	}
	for id, want := range map[string]string{
		"long":     "bob holds its fair share of the cluster or more while an owner below theirs waits for room (ada's request for 8×GPU); until it starts, only work expected to end within 1h0m0s starts for bob, and this request is expected to run until 17:00 UTC",
		"notebook": "and this request declares no max runtime",
	} {
		if !strings.Contains(msgs[id], want) {
			t.Errorf("%s's reason %q, want it to contain %q", id, msgs[id], want)
		}
	}
	t.Logf("long: %s", msgs["long"])

	for _, c := range []struct {
		name    string
		s       *Snapshot
		opt     PlanOptions
		want    string // the request of bob's that starts
		because string
	}{
		{"ada waits for nothing", snap(lendCluster(), long), opt, "long", "no owner below its share waits"},
		{"holds off", snap(lendCluster(), long, big), PlanOptions{}, "long", "ReserveAfter zero is the policy before issue 34"},
		{"lending off", snap(lendCluster(), long, big), PlanOptions{ReserveAfter: opt.ReserveAfter, Without: RuleLend}, "long", "PlanOptions.Without turns the rule off alone"},
		{"four nodes", func() *Snapshot { c := lendCluster(); return snap([]NodeView{c[0], c[1], c[2], c[19]}, long, big) }(), opt, "long", "lending acts from 20 nodes"},
		{"higher priority", snap(lendCluster(), func() Pending { p := lendMax(req("urgent", "bob", 1, 0), 8*time.Hour); p.Entry.Priority = 10; return p }(), big), opt, "urgent", "a waiting request keeps back only requests of at most its priority"},
		{"another model", snap(append(lendCluster(), holding(view(gpuNode("h0", 8, "H100")), "a1", "ada", 8)),
			func() Pending {
				p := lendMax(req("a100", "bob", 1, 0), 8*time.Hour)
				p.Entry.Request.GPUModel = "A100"
				return p
			}(),
			func() Pending { p := req("h100", "ada", 8, 0); p.Entry.Request.GPUModel = "H100"; return p }()), opt, "a100", "bob asks for A100s, ada waits for H100s"},
		{"ada at her quota", func() *Snapshot {
			s := snap(lendCluster(), long, big)
			four := int64(4)
			s.UserQuotas = map[string]state.Quota{"ada": {GPUs: &four}}
			return s
		}(), opt, "long", "ada waits on her quota, not for room"},
	} {
		plan := NewPlan(c.s, c.opt)
		if got := boundIDs(plan); !got[c.want] {
			t.Errorf("%s: bound %v, waiting %+v; want %s bound (%s)", c.name, got, plan.Waiting, c.want, c.because)
		}
	}
}

// TestLendingKeepsNoHeldNodeIdle: a request of an owner above its share
// that holds a node (its holds granted against its charge budget) starts
// there when the node is free, though an owner below its share waits for
// room: lending keeps back only requests that hold nothing.
func TestLendingKeepsNoHeldNodeIdle(t *testing.T) {
	nodes := lendCluster()
	nodes = append(nodes, view(gpuNode("n20", 8, "A100")))
	bobBig := lendMax(req("bob-big", "bob", 8, time.Hour), 8*time.Hour)
	s := snap(nodes, bobBig, req("big", "ada", 8, 0), req("big2", "ada", 8, 0))
	s.Held = map[string]string{"n20": "bob-big"}
	plan := NewPlan(s, PlanOptions{ReserveAfter: 10 * time.Minute})
	if got := boundIDs(plan); !got["bob-big"] {
		t.Fatalf("bound %v, waiting %+v; want bob-big on n20, the node held for it", got, plan.Waiting)
	}
}
