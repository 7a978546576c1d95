package sim

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// TestRollingSearchFeasible: the rolling-horizon search's schedule passes
// Evaluate (no node over its GPUs, no part twice on a node, no start
// before release or beyond the fair-share slack) with the objectives it
// reports, on small recorded runs and on a 16-node run of the suite; it is
// never better than the exact optimum nor below the lower bound, and the
// same seed gives the same schedule.
func TestRollingSearchFeasible(t *testing.T) {
	solved, missed := 0, 0
	for seed := uint64(1); seed <= 20; seed++ {
		cfg, res := smallRun(seed)
		in, planner, err := NewInstance(cfg, res)
		if err != nil {
			t.Fatal(err)
		}
		r, err := in.RollingSearch(planner, WindowOptions{Window: 4, Lookahead: 8, Population: 8, Generations: 4, Seed: seed})
		if errors.Is(err, ErrInfeasible) {
			missed++ // a heuristic may miss a tight slack; what it returns is never taken then
			continue
		}
		if err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
		checkRolling(t, fmt.Sprint("small ", seed), in, r)
		if len(in.Jobs) < 2 || len(in.Jobs) > 7 {
			continue
		}
		_, opt, err := in.Exact()
		if err != nil {
			t.Fatal(err)
		}
		solved++
		if r.Objectives.Less(opt) {
			t.Fatalf("seed %d: the rolling search's %+v beats the exact optimum %+v", seed, r.Objectives, opt)
		}
	}
	if solved < 5 || missed > 10 {
		t.Fatalf("%d runs compared with the exact optimum, the slack missed on %d of 20", solved, missed)
	}
	t.Logf("small runs: %d compared with the exact optimum, the slack missed on %d of 20", solved, missed)
	shape := Suite(16, 0.1)[1] // flood-drain, 2.4 simulated hours
	cfg := shape.Build(placer.PlanOptions{ReserveAfter: 10 * time.Minute}, 1)
	cfg.Record = true
	res := Run(cfg)
	in, planner, err := NewInstance(cfg, res)
	if err != nil {
		t.Fatal(err)
	}
	opt := WindowOptions{Population: 8, Generations: 3, Seed: 3}
	a, err := in.RollingSearch(planner, opt)
	if err != nil {
		t.Fatalf("%s: %v", shape.Name, err)
	}
	checkRolling(t, shape.Name, in, a)
	b, err := in.RollingSearch(planner, opt)
	if err != nil || a.Objectives != b.Objectives {
		t.Fatalf("the same seed gave %+v, then %+v (%v)", a.Objectives, b.Objectives, err)
	}
	t.Logf("%s: %d jobs, %d windows, %d evaluations, improved on %d; %+v", shape.Name, len(in.Jobs), a.Windows, a.Evaluations, a.Improved, a.Objectives)
}

func checkRolling(t *testing.T, name string, in *Instance, r Rolling) {
	t.Helper()
	o, err := in.Evaluate(r.Schedule)
	if err != nil {
		t.Fatalf("%s: infeasible: %v", name, err)
	}
	if o.Less(r.Objectives) || r.Objectives.Less(o) {
		t.Fatalf("%s: reports %+v, evaluates to %+v", name, r.Objectives, o)
	}
	if lb := in.LowerBound(); lb.Wait > o.Wait+1e-9 || lb.Machines > o.Machines+1e-9 {
		t.Fatalf("%s: below the lower bound %+v: %+v", name, lb, o)
	}
}

// TestFastDecoderHoldsCapacity: with no fair-share constraint, every key
// order decodes to a schedule Evaluate accepts, whose waits the decoder
// summed the same.
func TestFastDecoderHoldsCapacity(t *testing.T) {
	for seed := uint64(1); seed <= 10; seed++ {
		cfg, res := smallRun(seed)
		in, _, err := NewInstance(cfg, res)
		if err != nil {
			t.Fatal(err)
		}
		in.Slack = math.Inf(1)
		d := newFastDecoder(in)
		for k := 0; k < 20; k++ {
			key := make([]float64, len(in.Jobs))
			for j := range key {
				key[j] = float64((j*7919 + k*104729) % 101)
			}
			st := in.newRunState()
			r := d.run(st, 0, in.Passes, key, k%3-1, k%2 == 0, true)
			s := Schedule{Start: make([]int, len(in.Jobs)), Nodes: make([][]int, len(in.Jobs))}
			for j := range s.Start {
				s.Start[j] = -1
			}
			for j, x := range r.starts {
				s.Start[j], s.Nodes[j] = x.pass, x.nodes
			}
			o, err := in.Evaluate(s)
			if err != nil {
				t.Fatalf("seed %d order %d: %v", seed, k, err)
			}
			if n := len(in.Jobs); n > 0 && math.Abs(o.Wait-r.waitSum/float64(n)) > 1e-9 {
				t.Fatalf("seed %d order %d: decoder's mean wait %.4f, Evaluate's %.4f", seed, k, r.waitSum/float64(n), o.Wait)
			}
			if p := float64(in.Passes); math.Abs(o.Machines-r.machines/p) > 1e-9 || math.Abs(o.Stranded-r.stranded/p) > 1e-9 {
				t.Fatalf("seed %d order %d: decoder's machines %.4f stranded %.4f, Evaluate's %+v", seed, k, r.machines/p, r.stranded/p, o)
			}
		}
	}
}
