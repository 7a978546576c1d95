package placer

import (
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// record is owner's run-time history: one finished attempt per run time,
// of gpus GPUs each, each declaring a max runtime of declared, the last
// ending just before t0.
func record(owner string, gpus int, declared time.Duration, runs ...time.Duration) *state.RuntimeRecord {
	r := &state.RuntimeRecord{Owner: owner}
	for i, d := range runs {
		r.Add(state.RuntimeSample{Session: owner + "-past", QueueRevision: int64(i + 1), GPUs: gpus, Seconds: int64(d / time.Second),
			Declared: int64(declared / time.Second), Ended: t0.Add(time.Duration(i-len(runs)) * time.Minute)})
	}
	return r
}

// minutes is each count as a duration of that many minutes.
func minutes(ms ...int) []time.Duration {
	out := make([]time.Duration, len(ms))
	for i, m := range ms {
		out[i] = time.Duration(m) * time.Minute
	}
	return out
}

// TestBindExpectsTheOwnersRecentRunTime: a session that declares a max
// runtime is bound with Ends at that bound and Expects at the plan's
// clock plus the longest of its owner's last eight finished runs of its
// size, when those declared max runtimes far beyond what they ran and
// took about as long as each other; none where the owner has fewer runs
// of that size, where they varied 8×, where its runs declared about what
// they ran (the bound says more), where the estimate is not
// below the bound, or where the session declares no max runtime (it may
// run for ever, however short its owner's runs were).
func TestBindExpectsTheOwnersRecentRunTime(t *testing.T) {
	runtimes := map[string]*state.RuntimeRecord{
		"ada": record("ada", 1, 72*time.Hour, minutes(180, 20, 40, 30, 25, 35, 22, 28, 33)...), // last eight: at most 40 min
		"bob": record("bob", 4, 72*time.Hour, minutes(30, 30, 30, 30, 30, 30, 30)...),
		"cy":  record("cy", 1, 72*time.Hour, minutes(300, 300, 300, 300, 300, 300, 300, 300)...),
		"dan": record("dan", 1, time.Hour, minutes(50, 40, 50, 45, 50, 40, 50, 45)...),
		"eve": record("eve", 1, 72*time.Hour, minutes(5, 40, 10, 20, 30, 15, 25, 35)...), // 8× apart
	}
	limited := func(id, owner string, g int, limit time.Duration) Pending {
		p := req(id, owner, g, 0)
		p.Entry.MaxRuntime = state.Duration(limit)
		return p
	}
	s := snap([]NodeView{view(gpuNode("n1", 8, "A100")), view(gpuNode("n2", 8, "A100"))},
		limited("ada-1", "ada", 1, 72*time.Hour),
		limited("ada-2", "ada", 2, 72*time.Hour), // no 2-GPU run of ada's
		limited("bob-4", "bob", 4, 72*time.Hour),
		limited("cy-1", "cy", 1, 4*time.Hour), // 5 h expected, 4 h bound
		limited("dan-1", "dan", 1, 72*time.Hour),
		limited("eve-1", "eve", 1, 72*time.Hour),
		req("ada-nolimit", "ada", 1, 0),
	)
	s.Runtimes = runtimes
	plan := NewPlan(s, PlanOptions{})
	want := map[string]time.Duration{"ada-1": 40 * time.Minute, "ada-2": 0, "bob-4": 0, "cy-1": 0, "dan-1": 0, "eve-1": 0, "ada-nolimit": 0}
	if len(plan.Bound) != len(want) {
		t.Fatalf("bound %d sessions, want %d", len(plan.Bound), len(want))
	}
	for _, d := range plan.Bound {
		id := d.Pending.Entry.Session
		pp := d.Parts[0]
		var got time.Duration
		if pp.Expects != nil {
			got = pp.Expects.Sub(t0)
		}
		if got != want[id] {
			t.Errorf("%s expected to end %v after the plan, want %v", id, got, want[id])
		}
		if limit := time.Duration(d.Pending.Entry.MaxRuntime); limit > 0 && !pp.Ends.Equal(t0.Add(limit)) {
			t.Errorf("%s ends at %v, want its bound %v", id, pp.Ends, t0.Add(limit))
		}
		a := allocation(d.Pending.Entry, pp)
		if (a.Expects == nil) != (pp.Expects == nil) || (a.Expects != nil && !a.Expects.Equal(*pp.Expects)) {
			t.Errorf("%s's allocation expects %v, its part %v", id, a.Expects, pp.Expects)
		}
	}
}

// TestHoldDrainsTheNodeItsOwnersRunShort: where every session declares
// the same long max runtime, the node whose sessions started first has
// the earliest bound, but a node running sessions its owner's history
// says end in minutes drains first, and the aged 8-GPU request holds
// that one. Without estimates (Snapshot.Runtimes nil, or every
// estimate ignored) it holds the other. A session that ran past its
// estimate counts to its bound again. The request's reason says when the
// held node is expected to have room, and from what.
func TestHoldDrainsTheNodeItsOwnersRunShort(t *testing.T) {
	fill := func(name, owner string, bound, expects time.Duration) NodeView {
		v := holding(view(gpuNode(name, 8, "A100")), name+"-1", owner, 7)
		a := v.Ledger.Allocations[name+"-1"]
		a.Ends = t0.Add(bound)
		if expects != 0 {
			e := t0.Add(expects)
			a.Expects = &e
		}
		v.Ledger.Allocations = maps.Clone(v.Ledger.Allocations)
		v.Ledger.Allocations[name+"-1"] = a
		return v
	}
	for _, tc := range []struct {
		name       string
		old, young NodeView
		want       string
		said       string
	}{
		{"by bounds alone", fill("old", "long", 70*time.Hour, 0), fill("young", "short", 71*time.Hour, 0), "old",
			"node old (1 of 8 GPUs free, the rest draining as its sessions end, room expected by 07:00 UTC by its sessions' max runtimes)"},
		{"by estimates", fill("old", "long", 70*time.Hour, 4*time.Hour), fill("young", "short", 71*time.Hour, 10*time.Minute), "young",
			"node young (1 of 8 GPUs free, the rest draining as its sessions end, room expected by 09:10 UTC by its sessions' max runtimes and their owners' recent run times)"},
		{"an estimate overrun reads as the bound", fill("old", "long", 70*time.Hour, 4*time.Hour), fill("young", "short", 71*time.Hour, -time.Minute), "old",
			"node old (1 of 8 GPUs free, the rest draining as its sessions end, room expected by 13:00 UTC by its sessions' max runtimes and their owners' recent run times)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := NewPlan(snap([]NodeView{tc.old, tc.young}, req("big", "ada", 8, time.Hour)), PlanOptions{ReserveAfter: 10 * time.Minute})
			held := heldFor(plan, "big")
			if len(held) != 1 || held[0] != tc.want {
				t.Fatalf("nodes held for the 8-GPU request: %v, want [%s]", held, tc.want)
			}
			if msg := plan.Waiting[0].Message; !strings.Contains(msg, tc.said) {
				t.Errorf("reason %q\nwant it to say %q", msg, tc.said)
			}
		})
	}
}
