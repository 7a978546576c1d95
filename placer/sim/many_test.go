package sim

import (
	"slices"
	"testing"

	"github.com/voyager-gpu/voyager/placer"
)

// TestManyUsersAt200Nodes runs many-users at 200 nodes, binpack and
// spread, seeds 1-3 (binpack seed 1 under the race detector): twenty
// users offering 4% each beside one offering 10% in 8-GPU sessions. The
// p99 8/1 goal is not reached there (6.9-18.0; placer/README.md, "Goals
// not reached"), so the test holds the runs to suite200Shortfalls'
// floors, as TestSuiteAt200Nodes does: p99 8/1 at most 20 (a tenth above
// the worst measured, 17.95), Jain's index at least 0.92 at every pass
// (0.927-0.981), and every other goal (Jain's mean, busy while waiting
// with binpack 98.9-99.2%).
// It also asserts where the miss is (Result.UserWait): the 8-GPU p99 of
// the user asking only for whole machines, above its share whenever the
// twenty's queues grow together, is at least twice the median of
// the twenty users' 8-GPU p99s (measured 17-44 min against 3.4-5.5).
func TestManyUsersAt200Nodes(t *testing.T) {
	shape := suiteByName(200)["many-users"]
	strategies, seeds := []placer.Strategy{placer.Binpack, placer.Spread}, []uint64{1, 2, 3}
	if raceEnabled {
		strategies, seeds = strategies[:1], seeds[:1]
	}
	for _, st := range strategies {
		for _, seed := range seeds {
			t.Run(string(st)+"/"+string(rune('0'+seed)), func(t *testing.T) {
				t.Parallel()
				o := defaultOptions(t)
				o.Strategy = st
				r := Run(shape.Build(o, seed))
				t.Logf("p99 8/1 %.2f; Jain least %.3f, mean %.3f; busy %.1f%%", r.Ratio(), r.JainMin, r.Jain, 100*r.Busy)
				// The floors TestSuiteAt200Nodes holds many-users to.
				checkGoals(t, "", shape.Name, st, r, suite200Shortfalls, "suite200Shortfalls")
				var twenty []float64
				for u, w := range r.UserWait {
					if s, ok := w["8"]; ok && u != "big" {
						twenty = append(twenty, s.P99)
					}
				}
				if len(twenty) < 15 {
					t.Fatalf("8-GPU waits of %d of the twenty users; want at least 15", len(twenty))
				}
				slices.Sort(twenty)
				big, median := r.UserWait["big"]["8"].P99, twenty[len(twenty)/2]
				t.Logf("8-GPU p99: the whole-machine user's %.0f min, the median of the twenty's %.1f min (of %d)", big, median, len(twenty))
				if big < 2*median {
					t.Errorf("8-GPU p99 of the whole-machine user %.0f min, under twice the median of the %d others' (%.1f min)", big, len(twenty), median)
				}
			})
		}
	}
}
