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
	{"8-flood-and-1-flood", "jain-min", 0.92}, // 0.925–0.969: the 1-GPU flood's arrival at a full cluster
}

// TestExtraShapesAt200Nodes runs the shapes outside the suite
// (ExtraShapes: workloads the policy was not tuned on) at 200 nodes,
// binpack and spread, seeds 1–3 (seed 1 with -short; under the race
// detector heavy-tail with binpack, seed 1, alone), and asserts issue
// 34's goals on every run, or extraShortfalls' floors where a goal is
// not reached. On 8-flood-and-1-flood it also asserts what the floor is
// for: every pass below the Jain goal comes within half an hour of the
// 1-GPU flood's arrival (a newcomer gets only the GPUs that free; 6h20
// to 6h28 at seeds 1–3, the flood arriving at 6h).
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
					if sh.Name == "8-flood-and-1-flood" {
						var arrive time.Duration // the 1-GPU flood's start
						for _, s := range c.Streams {
							if s.User == "f1" {
								arrive = s.Start
							}
						}
						for _, at := range below {
							if at < arrive || at > arrive+30*time.Minute {
								t.Errorf("Jain's index below %.2f at %v, not within half an hour of the 1-GPU flood's arrival at %v", IssueGoals.JainMin, at, arrive)
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
// and spread, seed 1, and asserts every goal of issue 34 on every run:
// all are met there (placer/README.md, "Shapes outside the suite"). With
// the standing reserve off it fails: odd-sizes with spread misses the
// p99 8/1 (2.71). Not under -short or the race detector (make test runs
// this package again without it); about a CPU-minute.
func TestExtraShapesAt2000Nodes(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("2,000 nodes: about a CPU-minute; make test runs it without the race detector")
	}
	assertSuite(t, ExtraShapes(2000, 0.25), []placer.Strategy{placer.Binpack, placer.Spread}, []uint64{1}, nil, "")
}
