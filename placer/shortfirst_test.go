package placer

import (
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// limited is req with a declared max runtime (zero: none).
func limited(id, owner string, g int, age, limit time.Duration) Pending {
	p := req(id, owner, g, age)
	p.Entry.MaxRuntime = state.Duration(limit)
	return p
}

// TestShortFirstOrdersAnOwnersRequests: with PlanOptions.ShortFirst, of
// one owner's requests that cannot all start, the one that would end
// first if started at its arrival (created plus declared max runtime)
// starts: a later 15-minute request before an older 8-hour one, an 8-hour
// request before one that declares none; aged, an 8-hour request that has
// waited 8 hours goes before a fresh 15-minute one. Without ShortFirst the
// oldest starts. Another owner's place by fair share is unchanged.
func TestShortFirstOrdersAnOwnersRequests(t *testing.T) {
	one := []NodeView{view(gpuNode("n1", 4, "A100"))}
	bound := func(s *Snapshot, opt PlanOptions) []string {
		t.Helper()
		var ids []string
		for _, d := range NewPlan(s, opt).Bound {
			ids = append(ids, d.Pending.Entry.Session)
		}
		return ids
	}
	cases := []struct {
		name      string
		pending   []Pending
		want, old string
	}{
		{"a later short request before an older long one",
			[]Pending{limited("long", "ada", 4, 10*time.Minute, 8*time.Hour), limited("short", "ada", 4, 5*time.Minute, 15*time.Minute)}, "short", "long"},
		{"a declared runtime before none",
			[]Pending{limited("none", "ada", 4, 10*time.Minute, 0), limited("eight", "ada", 4, 5*time.Minute, 8*time.Hour)}, "eight", "none"},
		{"aged: a long request that waited its runtime before a fresh short one",
			[]Pending{limited("long", "ada", 4, 8*time.Hour, 8*time.Hour), limited("short", "ada", 4, time.Minute, 15*time.Minute)}, "long", "long"},
	}
	for _, c := range cases {
		got := bound(snap(one, c.pending...), PlanOptions{ShortFirst: true})
		if len(got) != 1 || got[0] != c.want {
			t.Errorf("%s: ShortFirst bound %v, want [%s]", c.name, got, c.want)
		}
		if got := bound(snap(one, c.pending...), PlanOptions{}); len(got) != 1 || got[0] != c.old {
			t.Errorf("%s: oldest first bound %v, want [%s]", c.name, got, c.old)
		}
	}
	// Owners still go by fair share: bob holds nothing and ada holds 4 of
	// 8, so bob's long request goes before ada's short one.
	two := []NodeView{holding(view(gpuNode("n1", 4, "A100")), "ada-running", "ada", 4), view(gpuNode("n2", 4, "A100"))}
	got := bound(snap(two, limited("ada-short", "ada", 4, 10*time.Minute, 15*time.Minute), limited("bob-long", "bob", 4, 5*time.Minute, 72*time.Hour)), PlanOptions{ShortFirst: true})
	if len(got) != 1 || got[0] != "bob-long" {
		t.Errorf("owners by fair share: bound %v, want [bob-long]", got)
	}
}
