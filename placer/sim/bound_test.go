package sim

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestLowerBoundBelowExact: on many small random instances (2–3 nodes,
// 3–8 sessions, gangs among them, fair-share slacks that bind) the lower
// bound is at most the exact optimum's wait and machines (Exact is
// lexicographic, so its machines are those of a wait-optimal schedule, at
// least the least machines of any feasible schedule), and at most every
// feasible schedule's when enumerated; stranded GPUs are bounded by 0.
// The bound is not trivial: on some instances it is above the rounding
// every schedule pays, and on some it is the optimum exactly.
func TestLowerBoundBelowExact(t *testing.T) {
	rng := rand.New(rand.NewPCG(40, 7))
	cases := 400
	if testing.Short() || raceEnabled {
		cases = 80
	}
	solved, above, tight, machAbove := 0, 0, 0, 0
	for c := 0; c < cases; c++ {
		nodes := 2 + rng.IntN(2)
		in := randomInstance(rng, nodes, 4, 3+rng.IntN(6), 8+rng.IntN(6))
		if rng.IntN(3) == 0 {
			in.Slack = math.Inf(1) // no fair-share constraint
		}
		lb := in.LowerBound()
		if lb.Stranded != 0 || lb.Wait < lb.Rounding-1e-9 {
			t.Fatalf("case %d: bound %+v", c, lb)
		}
		_, opt, err := in.Exact()
		if errors.Is(err, ErrInfeasible) {
			continue
		}
		if err != nil {
			t.Fatalf("case %d: Exact: %v", c, err)
		}
		solved++
		if lb.Wait > opt.Wait+1e-9 || lb.Machines > opt.Machines+1e-9 {
			t.Fatalf("case %d: bound %+v above the optimum %+v (instance %+v)", c, lb, opt, in)
		}
		if lb.Wait > lb.Rounding+1e-9 {
			above++
		}
		if lb.Machines > 0 {
			machAbove++
		}
		if math.Abs(lb.Wait-opt.Wait) < 1e-9 && opt.Wait > lb.Rounding+1e-9 {
			tight++
		}
	}
	t.Logf("%d of %d instances solved: the wait bound above the rounding on %d, equal to a non-trivial optimum on %d; the machines bound above 0 on %d", solved, cases, above, tight, machAbove)
	if solved < cases/2 || above < solved/10 || tight == 0 || machAbove == 0 {
		t.Fatalf("the bound is checked on too little, or trivial: %d solved, above the rounding on %d, tight on %d, machines above 0 on %d", solved, above, tight, machAbove)
	}
}

// TestLowerBoundBelowEverySchedule: the bound is at most the objectives
// of every feasible schedule of small instances (each session at every
// pass or never, on every set of nodes), not only the optimum's; and at
// most the planner's on recorded runs.
func TestLowerBoundBelowEverySchedule(t *testing.T) {
	rng := rand.New(rand.NewPCG(40, 8))
	for c := 0; c < 40; c++ {
		in := randomInstance(rng, 2, 4, 3+rng.IntN(2), 6)
		lb := in.LowerBound()
		forEachSchedule(in, func(o Objectives) {
			if lb.Wait > o.Wait+1e-9 || lb.Machines > o.Machines+1e-9 {
				t.Fatalf("case %d: bound %+v above a feasible schedule's %+v (instance %+v)", c, lb, o, in)
			}
		})
	}
	for seed := uint64(1); seed <= 20; seed++ {
		cfg, res := smallRun(seed)
		in, planner, err := NewInstance(cfg, res)
		if err != nil {
			t.Fatal(err)
		}
		o, err := in.Evaluate(planner)
		if err != nil {
			t.Fatal(err)
		}
		if lb := in.LowerBound(); lb.Wait > o.Wait+1e-9 || lb.Machines > o.Machines+1e-9 {
			t.Fatalf("seed %d: bound %+v above the planner's %+v", seed, lb, o)
		}
	}
}

// forEachSchedule calls f with the objectives of every feasible schedule
// of in (the enumeration of optimum_test.go's enumerate).
func forEachSchedule(in *Instance, f func(Objectives)) {
	type choice struct {
		start int
		nodes []int
	}
	options := make([][]choice, len(in.Jobs))
	for j, jb := range in.Jobs {
		options[j] = append(options[j], choice{start: -1})
		var sets [][]int
		var pick func(from int, acc []int)
		pick = func(from int, acc []int) {
			if len(acc) == jb.Parts {
				sets = append(sets, append([]int(nil), acc...))
				return
			}
			for n := from; n < in.Nodes; n++ {
				pick(n+1, append(acc, n))
			}
		}
		pick(0, nil)
		for k := jb.Release; k < in.Passes; k++ {
			for _, s := range sets {
				options[j] = append(options[j], choice{k, s})
			}
		}
	}
	s := Schedule{Start: make([]int, len(in.Jobs)), Nodes: make([][]int, len(in.Jobs))}
	var rec func(j int)
	rec = func(j int) {
		if j == len(in.Jobs) {
			if o, err := in.Evaluate(s); err == nil {
				f(o)
			}
			return
		}
		for _, c := range options[j] {
			s.Start[j], s.Nodes[j] = c.start, c.nodes
			rec(j + 1)
		}
	}
	rec(0)
}

// TestFenwickMost: the count of the cheapest items within a budget
// matches sorting them.
func TestFenwickMost(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for c := 0; c < 200; c++ {
		n := 1 + rng.IntN(60)
		f := newFenwick(n)
		var costs []int
		for i := 0; i < rng.IntN(30); i++ {
			x := 1 + rng.IntN(n-1+1)
			if x >= n {
				x = n - 1
			}
			if x == 0 {
				x = 1
			}
			if x >= n {
				continue
			}
			f.add(x, 1)
			costs = append(costs, x)
		}
		budget := rng.IntN(200)
		want, spent := 0, 0
		sorted := append([]int(nil), costs...)
		for i := range sorted {
			for k := i + 1; k < len(sorted); k++ {
				if sorted[k] < sorted[i] {
					sorted[i], sorted[k] = sorted[k], sorted[i]
				}
			}
		}
		for _, x := range sorted {
			if spent+x > budget {
				break
			}
			spent += x
			want++
		}
		if got := f.most(budget); got != want {
			t.Fatalf("case %d: costs %v budget %d: most %d, want %d", c, costs, budget, got, want)
		}
	}
}
