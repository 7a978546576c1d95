package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// extraShortfalls are the goals not reached on the shapes outside the
// suite (ExtraShapes) at 200 nodes, each with the floor asserted instead:
// the worst figure of seeds 1–3 and both strategies when it was
// written, with a margin. placer/README.md ("Shapes outside the suite")
// says why for each.
var extraShortfalls = []shortfall{
	{"odd-sizes", "ratio", 20},                // 5.16–13.63: 5- and 6-GPU requests fit no node a 1-GPU one leaves
	{"8-flood-and-1-flood", "jain-min", 0.92}, // 0.925–0.976: the 1-GPU flood's arrival at a full cluster
	{"2-gpu-flood", "jain-min", 0.88},         // 0.896–0.966: the 2-GPU flood's arrival at a full cluster
	{"half-no-limit", "ratio", 4.5},           // 0.34–3.88: bursts of 8-GPU arrivals wait out drains a 1-GPU request does not
	// The third eight (3 December 2026), run at the policy as it was set:
	{"8-flood-vs-steady", "jain-min", 0.85},      // 0.869–0.947: the 8-GPU flood's arrival at a full cluster, whole nodes only as they drain
	{"four-8-users-and-flood", "jain-min", 0.78}, // 0.806–0.904: the flood's excess, taken while the others asked for little, back only as its nodes drain (0.776–0.877 without transfer, its mean 0.941–0.966)
	{"gangs-4-vs-1-flood", "jain-min", 0.66},     // 0.680–0.838: the drain bound, four whole nodes at once from a flood of 1-hour exponential runs
	{"gangs-4-vs-1-flood", "jain-mean", 0.92},    // 0.937–0.973
}

// extra2000Shortfalls are the goals not reached on the shapes outside the
// suite at 2,000 nodes over a quarter of their hours, each with its
// floor, as extraShortfalls.
var extra2000Shortfalls = []shortfall{
	{"weights-8-heavy", "jain-min", 0.89},        // 0.911–0.946: the start; the 1-GPU user filled the empty cluster before the window opened
	{"four-8-users-and-flood", "jain-min", 0.92}, // 0.940–0.942: as at 200 nodes (0.856–0.877 without transfer, its mean 0.950–0.953)
}

// extraArrivals names, for the shapes outside the suite whose Jain goal
// is missed at a flood's arrival, the flooding user: every pass below
// the goal must come within half an hour of its stream's start.
var extraArrivals = map[string]string{"8-flood-and-1-flood": "f1", "2-gpu-flood": "f2", "8-flood-vs-steady": "f8"}

// TestExtraShapesAt200Nodes runs the shapes outside the suite
// (ExtraShapes: workloads the policy was not tuned on) at 200 nodes,
// binpack and spread, seeds 1–3 (seed 1 with -short; under the race
// detector heavy-tail with binpack, seed 1, alone), and asserts issue
// 34's goals on every run, or extraShortfalls' floors where a goal is
// not reached. On the shapes of extraArrivals it also asserts what the
// floor is for: every pass below the Jain goal comes within half an hour
// of the flood's arrival (a newcomer gets only the GPUs that free:
// 8-flood-and-1-flood's 1-GPU flood arrives at 6h, the passes below are
// at 6h20 to 6h28 on seeds 1–3; 2-gpu-flood's arrives at 4h, at 4h06 to
// 4h12; 8-flood-vs-steady's 8-GPU flood at 4h, at 4h08 to 4h28).
func TestExtraShapesAt200Nodes(t *testing.T) {
	seeds := []uint64{1, 2, 3}
	if testing.Short() {
		seeds = seeds[:1]
	}
	for _, sh := range ExtraShapes(200, 1) {
		for _, st := range []placer.Strategy{placer.Binpack, placer.Spread} {
			for _, seed := range seeds {
				if raceEnabled && (sh.Name != "heavy-tail" || st != placer.Binpack || seed != 1) {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s/%d", sh.Name, st, seed), func(t *testing.T) {
					t.Parallel()
					o := defaultOptions(t)
					o.Strategy = st
					c := sh.Build(o, seed)
					var below []time.Duration
					c.Trace = func(p Pass) {
						if p.Jain < IssueGoals.JainMin {
							below = append(below, p.Now)
						}
					}
					r := Run(c)
					checkGoals(t, "", sh.Name, st, r, extraShortfalls, "extraShortfalls")
					if flooder, ok := extraArrivals[sh.Name]; ok {
						var arrive time.Duration // the flood's start
						for _, s := range c.Streams {
							if s.User == flooder {
								arrive = s.Start
							}
						}
						for _, at := range below {
							if at < arrive || at > arrive+30*time.Minute {
								t.Errorf("Jain's index below %.2f at %v, not within half an hour of %s's arrival at %v", IssueGoals.JainMin, at, flooder, arrive)
							}
						}
					}
				})
			}
		}
	}
}

// TestExtraShapesAt2000Nodes runs the shapes outside the suite at 2,000
// nodes over a quarter of their hours (as the suite runs there), binpack
// and spread, seed 1, and asserts every goal of issue 34 on every run,
// or extra2000Shortfalls' floors (placer/README.md, "Shapes outside the
// suite"). With the standing reserve off it fails: odd-sizes with spread
// misses the p99 8/1 (2.71). Not under -short or the race detector (make
// test runs this package again without it); about two CPU-minutes.
func TestExtraShapesAt2000Nodes(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("2,000 nodes: about two CPU-minutes; make test runs it without the race detector")
	}
	assertSuite(t, ExtraShapes(2000, 0.25), []placer.Strategy{placer.Binpack, placer.Spread}, []uint64{1}, extra2000Shortfalls, "extra2000Shortfalls")
}
