package sim

import (
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// TestShortFirstShortensWaits: on the suite's overloaded shapes at 16
// nodes, ordering each owner's requests shortest declared max runtime
// first (placer.PlanOptions.ShortFirst) lowers the mean wait by at least
// a tenth, and no request waits beyond its fair wait by more than issue
// 34's bound (twice the longest run time).
func TestShortFirstShortensWaits(t *testing.T) {
	for _, sh := range Matching(Suite(16, 0.25), "") {
		if sh.Name != "two-floods" && sh.Name != "adv-7-of-8" {
			continue
		}
		mean := func(short bool) (float64, Result) {
			res := Run(sh.Build(placer.PlanOptions{ReserveAfter: 10 * time.Minute, ShortFirst: short}, 1))
			sum, n := simWaits(res)
			return sum / float64(max(n, 1)), res
		}
		old, _ := mean(false)
		short, res := mean(true)
		t.Logf("%s: mean wait %.2f min oldest first, %.2f shortest declared first; most beyond fair wait %.0f min", sh.Name, old, short, res.MaxExcess)
		if short > 0.9*old {
			t.Errorf("%s: mean wait %.2f with ShortFirst, %.2f without: not a tenth less", sh.Name, short, old)
		}
		if bound := IssueGoals.Excess * res.LongestRuntime.Minutes(); res.MaxExcess > bound {
			t.Errorf("%s: a request waited %.0f min beyond its fair wait, over %.0f", sh.Name, res.MaxExcess, bound)
		}
	}
}
