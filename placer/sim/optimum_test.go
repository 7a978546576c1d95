package sim

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// randomInstance is a small instance drawn from rng: nodes of gpus GPUs,
// jobs of 1 to gpus GPUs (now and then a gang of two parts) arriving over
// the first passes, each holding its GPUs a few passes, with fair waits
// and a slack that leave some of them binding.
func randomInstance(rng *rand.Rand, nodes, gpus, jobs, passes int) *Instance {
	in := &Instance{Nodes: nodes, GPUsPerNode: gpus, Tick: time.Minute, Passes: passes, End: time.Duration(passes) * time.Minute, Slack: float64(rng.IntN(4))}
	for j := 0; j < jobs; j++ {
		a := time.Duration(rng.IntN(passes/2)) * time.Minute
		jb := Job{ID: fmt.Sprintf("j%d", j), User: fmt.Sprintf("u%d", j%2), GPUs: 1 + rng.IntN(gpus), Parts: 1, Arrive: a, Release: int(a / time.Minute),
			Dur: 1 + rng.IntN(4), FairWait: float64(rng.IntN(3))}
		if nodes > 1 && rng.IntN(6) == 0 {
			jb.Parts = 2
		}
		in.Jobs = append(in.Jobs, jb)
	}
	return in
}

// enumerate is the lexicographic optimum over every schedule of in: each
// job at every pass from its release, or never, on every set of distinct
// nodes.
func enumerate(in *Instance) (Objectives, bool) {
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
	var best Objectives
	found := false
	var rec func(j int)
	rec = func(j int) {
		if j == len(in.Jobs) {
			o, err := in.Evaluate(s)
			if err == nil && (!found || o.Less(best)) {
				best, found = o, true
			}
			return
		}
		for _, c := range options[j] {
			s.Start[j], s.Nodes[j] = c.start, c.nodes
			rec(j + 1)
		}
	}
	rec(0)
	return best, found
}

// TestExactMatchesEnumeration: on instances small enough to enumerate
// every schedule (each job at every pass or never, on every set of
// nodes), the branch and bound finds the same lexicographic optimum (mean
// wait, then machines, then stranded GPUs), or finds none exactly when no
// schedule keeps the fair-share slack, and its schedule is feasible.
func TestExactMatchesEnumeration(t *testing.T) {
	rng := rand.New(rand.NewPCG(40, 1))
	cases := 60
	if testing.Short() || raceEnabled {
		cases = 15
	}
	feasible := 0
	for c := 0; c < cases; c++ {
		in := randomInstance(rng, 2, 4, 3+rng.IntN(2), 6)
		want, ok := enumerate(in)
		sch, got, err := in.Exact()
		if !ok {
			if !errors.Is(err, ErrInfeasible) {
				t.Fatalf("case %d: no schedule is feasible, Exact says %v (%+v)", c, err, got)
			}
			continue
		}
		feasible++
		if err != nil {
			t.Fatalf("case %d: Exact: %v; enumeration found %+v", c, err, want)
		}
		if got.Less(want) || want.Less(got) {
			t.Fatalf("case %d: Exact %+v, enumeration %+v (instance %+v)", c, got, want, in)
		}
		if o, err := in.Evaluate(sch); err != nil || o.Less(got) || got.Less(o) {
			t.Fatalf("case %d: Exact's schedule evaluates to %+v, %v; it reported %+v", c, o, err, got)
		}
	}
	if feasible < cases/2 {
		t.Fatalf("only %d of %d cases were feasible: the test checks too little", feasible, cases)
	}
}

// smallRun is a recorded simulator run small enough to solve exactly: 2
// nodes of 4 GPUs, a pass a minute, jobs of 1 to 4 GPUs from two users.
func smallRun(seed uint64) (Config, Result) {
	cfg := Config{Nodes: 2, GPUsPerNode: 4, Tick: time.Minute, Duration: 24 * time.Minute, Seed: seed, Record: true,
		Plan: placer.PlanOptions{ReserveAfter: 4 * time.Minute},
		Streams: []Stream{
			{User: "a", Rate: 9, End: 16 * time.Minute, Sizes: []Size{{GPUs: 1, Share: 2}, {GPUs: 2, Share: 1}, {GPUs: 4, Share: 1}}, Runtime: Runtime{Mean: 5 * time.Minute}},
			{User: "b", Rate: 6, End: 16 * time.Minute, Sizes: []Size{{GPUs: 3, Share: 1}, {GPUs: 4, Share: 1}}, Runtime: Runtime{Mean: 6 * time.Minute}},
		}}
	return cfg, Run(cfg)
}

// TestExactNeverWorseThanGreedy: on small recorded runs, the planner's
// own schedule evaluates to the waits the simulator measured and is
// feasible, and the exact optimum is never worse than it
// lexicographically (nor on waits).
func TestExactNeverWorseThanGreedy(t *testing.T) {
	seeds := 40
	if testing.Short() || raceEnabled {
		seeds = 10
	}
	solved, better := 0, 0
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		cfg, res := smallRun(seed)
		in, greedy, err := NewInstance(cfg, res)
		if err != nil {
			t.Fatal(err)
		}
		g, err := in.Evaluate(greedy)
		if err != nil {
			t.Fatalf("seed %d: the planner's schedule: %v", seed, err)
		}
		if sum, n := simWaits(res); n != len(in.Jobs) || math.Abs(sum/float64(n)-g.Wait) > 1e-6 {
			t.Fatalf("seed %d: the simulator measured %d waits of mean %.4f, the instance %d of mean %.4f", seed, n, sum/float64(max(n, 1)), len(in.Jobs), g.Wait)
		}
		if len(in.Jobs) > 7 || len(in.Jobs) < 2 {
			continue
		}
		_, opt, err := in.Exact()
		if err != nil {
			t.Fatalf("seed %d: Exact: %v", seed, err)
		}
		solved++
		if g.Less(opt) || opt.Wait > g.Wait+1e-9 {
			t.Fatalf("seed %d: the optimum %+v is worse than the planner's %+v", seed, opt, g)
		}
		if opt.Less(g) {
			better++
		}
		t.Logf("seed %d: %d jobs, planner %+v, optimum %+v", seed, len(in.Jobs), g, opt)
	}
	if solved < seeds/2 {
		t.Fatalf("only %d of %d runs were small enough to solve", solved, seeds)
	}
	t.Logf("%d runs solved exactly, the optimum better than the planner on %d", solved, better)
}

// simWaits is the sum and count of every wait the simulator measured.
func simWaits(res Result) (float64, int) {
	sum, n := 0.0, 0
	for _, st := range res.Wait {
		sum += st.Mean * float64(st.N)
		n += st.N
	}
	return sum, n
}

// TestSearchReportsOnlyFeasiblePlacements: every point of every front,
// on small recorded runs and on a 16-node run of the suite, is a schedule
// that Evaluate accepts (no GPU held twice, no node over its GPUs, no
// part twice on a node, no start before release or beyond the fair-share
// slack) with the objectives the front reports; on the small runs no
// point beats the exact optimum; a decoded genome that reports no
// violation is feasible too. The same seed gives the same front.
func TestSearchReportsOnlyFeasiblePlacements(t *testing.T) {
	check := func(name string, in *Instance, planner Schedule, opt SearchOptions) Front {
		t.Helper()
		f, err := in.Search(planner, opt)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(f.Points) == 0 {
			t.Fatalf("%s: empty front", name)
		}
		for i, p := range f.Points {
			o, err := in.Evaluate(p.Schedule)
			if err != nil {
				t.Fatalf("%s: point %d (%+v) is infeasible: %v", name, i, p.Objectives, err)
			}
			if o.Less(p.Objectives) || p.Objectives.Less(o) {
				t.Fatalf("%s: point %d reports %+v, evaluates to %+v", name, i, p.Objectives, o)
			}
		}
		return f
	}
	for seed := uint64(1); seed <= 12; seed++ {
		cfg, res := smallRun(seed)
		in, planner, err := NewInstance(cfg, res)
		if err != nil {
			t.Fatal(err)
		}
		if len(in.Jobs) < 2 || len(in.Jobs) > 7 {
			continue
		}
		f := check(fmt.Sprint("small ", seed), in, planner, SearchOptions{Population: 12, Generations: 10, Seed: seed})
		_, opt, err := in.Exact()
		if err != nil {
			t.Fatal(err)
		}
		if b := f.BestWait(); b.Objectives.Less(opt) {
			t.Fatalf("seed %d: the search's %+v beats the exact optimum %+v", seed, b.Objectives, opt)
		}
		// Random genomes: no violation reported means feasible.
		rng := rand.New(rand.NewPCG(seed, 2))
		for r := 0; r < 50; r++ {
			g := &genome{prio: make([]float64, len(in.Jobs)), pick: make([]float64, len(in.Jobs))}
			for j := range g.prio {
				g.prio[j], g.pick[j] = rng.Float64(), rng.Float64()
			}
			in.decode(g)
			_, err := in.Evaluate(g.sched)
			if (g.viol == 0) != (err == nil) {
				t.Fatalf("seed %d: a genome of violation %.3f evaluates with error %v", seed, g.viol, err)
			}
		}
	}
	shape := Suite(16, 0.1)[1] // flood-drain, 2.4 simulated hours
	cfg := shape.Build(placer.PlanOptions{ReserveAfter: 10 * time.Minute}, 1)
	cfg.Record = true
	res := Run(cfg)
	in, planner, err := NewInstance(cfg, res)
	if err != nil {
		t.Fatal(err)
	}
	gens := 12
	if raceEnabled {
		gens = 3
	}
	opt := SearchOptions{Population: 16, Generations: gens, Seed: 7}
	a := check(shape.Name, in, planner, opt)
	b := check(shape.Name+" again", in, planner, opt)
	if len(a.Points) != len(b.Points) || a.BestWait().Objectives != b.BestWait().Objectives {
		t.Fatalf("the same seed gave two fronts: %d points best %+v, %d points best %+v", len(a.Points), a.BestWait().Objectives, len(b.Points), b.BestWait().Objectives)
	}
	t.Logf("%s: %d jobs, %d evaluations, %d points, best on waits %+v (planner's: %v)", shape.Name, len(in.Jobs), a.Evaluations, len(a.Points), a.BestWait().Objectives, a.BestWait().Planner)
}

// TestBaselinesHoldCapacity: both first-come-first-served baselines give
// schedules that hold no node over its GPUs and start nothing before its
// release (their fair-share slack is not theirs to keep: checked with an
// unbounded slack), with the objectives they report.
func TestBaselinesHoldCapacity(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		cfg, res := smallRun(seed)
		in, _, err := NewInstance(cfg, res)
		if err != nil {
			t.Fatal(err)
		}
		in.Slack = math.Inf(1)
		for name, f := range map[string]func() (Schedule, Objectives){"online": in.OnlineFCFS, "clairvoyant": in.ClairvoyantFCFS} {
			s, o := f()
			got, err := in.Evaluate(s)
			if err != nil {
				t.Fatalf("seed %d: %s: %v", seed, name, err)
			}
			if got.Less(o) || o.Less(got) {
				t.Fatalf("seed %d: %s reports %+v, evaluates to %+v", seed, name, o, got)
			}
		}
	}
}
