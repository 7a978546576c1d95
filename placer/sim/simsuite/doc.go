// Command simsuite runs placer/sim's whole suite of workload shapes (issue
// 34) at 16, 200 and 2,000 nodes, for binpack and spread, three seeds
// each, with the placer's default settings, and prints one Markdown table
// with the goals each run misses. `make sim` runs it; it exits 1 if any
// run misses a goal. With -trace it also writes to stderr every pass whose
// Jain's index is below the goal: each waiting user's GPUs held, fair share
// and GPUs waiting, the GPUs free, the nodes held and the nodes of the
// standing reserve with GPUs free. With -trace-8 N it writes the same
// for every pass that leaves at least N 8-GPU requests waiting, with the
// requests waiting by size, each user's 8-GPU ones, and how soon as many
// nodes as there are 8-GPU requests waiting would be whole if every run
// time were known and nothing more were placed (sim.Pass.Drains): what
// no policy that stops no session can beat. -tick D plans every D
// instead of the suite's pass (the p99 8/1 floor is then one pass of D);
// -declare D has every session that declares a max runtime declare D;
// -no-limits has no session declare one, and -no-estimates gives the
// planner no run times learned from finished sessions: with both, the
// planner knows nothing of when a session ends. -extra runs the shapes
// outside the suite instead (sim.ExtraShapes: workloads the policy was
// not tuned on; `go run ./placer/sim/simsuite -extra -nodes 200`), and
// -mixed the shapes on machines of two sizes (sim.MixedShapes: 8-GPU
// machines beside 4- or 2-GPU ones); -mixed -uniform runs their control,
// the same loads on 8-GPU machines alone. -reserve-after D plans with
// that PlanOptions.ReserveAfter (0: holds and every rule that keeps GPUs
// ahead off, the policy before issue 34), and -without turns some of
// those rules off, each alone (PlanOptions.Without: reserve, claims,
// drainfit, bands, lend): what a rule buys is the same runs without
// it.
// With -teams it runs issue 36's team shapes
// (sim.TeamSuite) at the first -nodes size instead and prints their table
// (`go run ./placer/sim/simsuite -teams -nodes 16`).
package main
