package sim

import (
	"testing"

	"github.com/voyager-gpu/voyager/placer"
)

// suite200Shortfalls are the goals not reached at 200 nodes, each with
// the floor asserted instead: the worst figure of seeds 1–3 and both
// strategies at the policy of 1 December 2026 (without one hold at a
// time for an all-large owner, placer/hold.go), with a margin.
// placer/README.md ("Goals not reached") says why for each.
var suite200Shortfalls = []shortfall{
	{"adv-hold-hog", "ratio", 300},                                   // 89–216: not reachable by a policy that stops no session
	{"adv-declared-max", "ratio", 3.3},                               // 3.00, spread seed 2: bursts of 8-GPU arrivals beyond the standing reserve
	{"adv-burst-8", "jain-min", 0.62}, {"adv-burst-8", "ratio", 3.5}, // 0.696–0.751, 2.40–2.55: the sweep's arrival at a full cluster
	{"many-users", "jain-min", 0.92}, {"many-users", "ratio", 20}, // 0.936–0.941, 6.74–15.16: the whole-machine user above its share
	{"ray-gangs-8", "jain-min", 0.93},                                                            // 0.946, spread seed 1: a gang's eight nodes draining
	{"adv-burst-1", "jain-min", 0.72}, {"adv-burst-1", "ratio", 3}, {"adv-burst-1", "busy", 0.9}, // 0.733–0.855, 2.15–2.26, 90.8–93.2%: the sweep's ends scattered
}

// TestSuiteAt200Nodes runs every shape of the suite at 200 nodes, binpack
// and spread, seeds 1–3, at the default settings, and asserts issue 34's
// goals on every run, or suite200Shortfalls' floors where a goal is not
// reached. From 20 nodes the planner keeps the standing reserve, claims,
// spread's bands and the drain fit, which are off at 16 nodes
// (TestSuiteGoals), so this is where they are held to the suite: with
// the standing reserve off (standingReserve returning at once) 20 checks
// fail, steady-90's p99 8/1 on all six runs (2.33–5.75) and
// adv-hold-hog's past its floor (323–476) among them. About 5
// CPU-minutes: binpack seed 1 with -short; under the race detector steady-90
// with binpack, seed 1, alone (make test runs this package again without
// it).
func TestSuiteAt200Nodes(t *testing.T) {
	shapes := Suite(200, 1)
	strategies := []placer.Strategy{placer.Binpack, placer.Spread}
	seeds := []uint64{1, 2, 3}
	if testing.Short() {
		strategies, seeds = strategies[:1], seeds[:1]
	}
	if raceEnabled {
		shapes, strategies, seeds = []Shape{suiteByName(200)["steady-90"]}, strategies[:1], seeds[:1]
	}
	assertSuite(t, shapes, strategies, seeds, suite200Shortfalls, "suite200Shortfalls")
}

// suite2000Shortfalls are the goals not reached at 2,000 nodes on seed 1
// (TestSuiteAt2000Nodes), each with the floor asserted instead: the
// worst figure of both strategies at the policy of 1 December 2026, with
// a margin. placer/README.md ("2,000 nodes, seeds 1–3" and "Goals not
// reached") says why.
var suite2000Shortfalls = []shortfall{
	{"two-floods", "jain-min", 0.93}, // 0.941: binpack, the second flood's first passes
	{"adv-hold-hog", "ratio", 60},    // 37.70–38.76: not reachable by a policy that stops no session
}

// TestSuiteAt2000Nodes runs every shape of the suite at 2,000 nodes over
// a quarter of its hours, as make sim does there, binpack and spread,
// seed 1, and asserts issue 34's goals on every run, or
// suite2000Shortfalls' floors where a goal is not reached. With the
// standing reserve off 4 checks fail: 8-only-vs-1-flood's Jain's least
// (0.929 and 0.933) and adv-hold-hog's p99 8/1 (118). About 2
// CPU-minutes; not under -short or the race detector (make test runs
// this package again without it).
func TestSuiteAt2000Nodes(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("2,000 nodes: about 2 CPU-minutes; make test runs it without the race detector")
	}
	assertSuite(t, Suite(2000, 0.25), []placer.Strategy{placer.Binpack, placer.Spread}, []uint64{1}, suite2000Shortfalls, "suite2000Shortfalls")
}
