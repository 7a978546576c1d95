package sim

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// TestSteadyAt200Nodes asserts every goal of issue 34 on steady-90 at 200
// nodes, seeds 1-3, binpack and spread: two users offering 90% of the
// cluster, whose 8-GPU requests' p99 wait must stay within twice their
// 1-GPU requests'. Before equal nodes were told apart by drain fit
// (placer/drainfit.go) five of the six runs missed the ratio (binpack
// 2.37 and 4.71 on seeds 1 and 2, spread 2.15, 9.72 and 4.96): small
// requests went by a hash to nodes about to drain, so bursts of 8-GPU
// requests waited out full drains. Under the race detector, binpack
// seed 2 only.
func TestSteadyAt200Nodes(t *testing.T) {
	type run struct {
		strategy placer.Strategy
		seed     uint64
	}
	runs := []run{{placer.Binpack, 2}}
	if !raceEnabled {
		for _, s := range []placer.Strategy{placer.Binpack, placer.Spread} {
			for seed := uint64(1); seed <= 3; seed++ {
				if s != placer.Binpack || seed != 2 {
					runs = append(runs, run{s, seed})
				}
			}
		}
	}
	shape := suiteByName(200)["steady-90"]
	for _, r := range runs {
		t.Run(fmt.Sprintf("%s/%d", r.strategy, r.seed), func(t *testing.T) {
			t.Parallel()
			assertIssueGoals(t, shape, r.strategy, r.seed)
		})
	}
}

// TestSteadyAtAPassAMinute runs steady-90 at 200 nodes, seeds 1-3, both
// strategies, planned every minute rather than every two (the suite's
// pass): the 1-GPU p99 is then one or two minutes, and the 8/1 goal asks
// the 8-GPU requests to start within two to four. It asserts the goal,
// p99 8/1 at most 2 (measured 0.40-0.99). Before an owner a little above
// an equal split could take the standing reserve (placer's
// reserveSlack), all six were over 2 (2.04-5.56): the user just above
// the split waited beside the reserve's idle nodes; before the reserve
// counted short runs that ended (stillRunning), binpack seeds 1 and 2
// were at 2.22 and 2.23. Under the race detector, binpack seed 2 only.
func TestSteadyAtAPassAMinute(t *testing.T) {
	shape := suiteByName(200)["steady-90"]
	for _, st := range []placer.Strategy{placer.Binpack, placer.Spread} {
		for seed := uint64(1); seed <= 3; seed++ {
			if raceEnabled && (st != placer.Binpack || seed != 2) {
				continue
			}
			t.Run(fmt.Sprintf("%s/%d", st, seed), func(t *testing.T) {
				t.Parallel()
				o := defaultOptions(t)
				o.Strategy = st
				c := shape.Build(o, seed)
				c.Tick = time.Minute
				r := Run(c)
				t.Logf("p99 8/1 %.2f (8-GPU p99 %.1f min, 1-GPU %.1f)", r.Ratio(), r.Wait["8"].P99, r.Wait["1"].P99)
				if x := r.Ratio(); x > 2 {
					t.Errorf("p99 8/1 %.2f at a pass a minute, above 2 (8-GPU p99 %.1f min, 1-GPU %.1f)", x, r.Wait["8"].P99, r.Wait["1"].P99)
				}
			})
		}
	}
}

// assertIssueGoals runs shape with strategy at the default settings and
// fails t with every goal of issue 34 the run misses.
func assertIssueGoals(t *testing.T, shape Shape, strategy placer.Strategy, seed uint64) {
	t.Helper()
	o := defaultOptions(t)
	o.Strategy = strategy
	row := SuiteRow{Shape: shape, Strategy: strategy, Seed: seed, Result: Run(shape.Build(o, seed))}
	if m := row.Misses(IssueGoals); len(m) > 0 {
		t.Errorf("goals missed: %s (Jain least %.3f, mean %.3f; p99 8/1 %.2f)",
			strings.Join(m, "; "), row.Result.JainMin, row.Result.Jain, row.Result.Ratio())
	}
}
