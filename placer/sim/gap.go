package sim

import (
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// GapRow is the planner's gap to the optimum on one run of the suite: the
// planner's objectives on the run's arrivals, the optimum's (Exact when
// the run has at most ExactLimit sessions, else the point of least wait
// of Search's front), and how long the optimiser took.
type GapRow struct {
	Shape    Shape
	Strategy placer.Strategy
	Seed     uint64
	Jobs     int
	Planner  Objectives
	Optimum  Objectives
	// Exact is whether Optimum is Exact's; otherwise it is the best
	// schedule Search found, an upper bound on the optimum, so the gap is
	// a lower bound on the true gap.
	Exact bool
	// FromPlanner is whether the best point is the planner's own schedule
	// (Search found nothing better on waits).
	FromPlanner bool
	// Online and Clairvoyant are the baselines of baseline.go: first come,
	// first served knowing nothing of the future, and knowing run times.
	Online, Clairvoyant Objectives
	// OnlineFair and ClairvoyantFair are whether each keeps the fair-share
	// slack (a feasible point of the search).
	OnlineFair, ClairvoyantFair bool
	Front                       int
	Evaluations                 int
	Took                        time.Duration
	Err                         error
}

// Gap is (planner − optimum) / optimum of each objective; NaN where the
// optimum is zero (GapTable then prints the planner's figure).
func (r GapRow) Gap() [3]float64 {
	p, o := r.Planner.vec(), r.Optimum.vec()
	var g [3]float64
	for i := range g {
		if o[i] == 0 {
			g[i] = math.NaN()
			continue
		}
		g[i] = (p[i] - o[i]) / o[i]
	}
	return g
}

// RunGaps measures the planner's gap to the optimum on every shape, for
// every strategy and seed: each run is simulated with Record, made an
// Instance, and solved (runs in parallel, at most GOMAXPROCS at a time;
// each Search is deterministic by its seed, the run's seed).
func RunGaps(shapes []Shape, opt placer.PlanOptions, strategies []placer.Strategy, seeds []uint64, search SearchOptions) []GapRow {
	var rows []GapRow
	for _, sh := range shapes {
		for _, st := range strategies {
			for _, seed := range seeds {
				rows = append(rows, GapRow{Shape: sh, Strategy: st, Seed: seed})
			}
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, max(1, runtime.GOMAXPROCS(0)/2))
	for i := range rows {
		wg.Add(1)
		sem <- struct{}{}
		go func(r *GapRow) {
			defer func() { <-sem; wg.Done() }()
			o := opt
			o.Strategy = r.Strategy
			cfg := r.Shape.Build(o, r.Seed)
			cfg.Record = true
			res := Run(cfg)
			in, planner, err := NewInstance(cfg, res)
			if err != nil {
				r.Err = err
				return
			}
			r.Jobs = len(in.Jobs)
			if r.Planner, err = in.Evaluate(planner); err != nil {
				r.Err = err
				return
			}
			online, onlineObj := in.OnlineFCFS()
			clair, clairObj := in.ClairvoyantFCFS()
			r.Online, r.Clairvoyant = onlineObj, clairObj
			_, err1 := in.Evaluate(online)
			_, err2 := in.Evaluate(clair)
			r.OnlineFair, r.ClairvoyantFair = err1 == nil, err2 == nil
			start := time.Now()
			if len(in.Jobs) <= ExactLimit {
				_, r.Optimum, r.Err = in.Exact()
				r.Exact, r.Front = true, 1
			} else {
				so := search
				so.Seed = r.Seed
				so.Extra = []Schedule{online, clair}
				f, err := in.Search(planner, so)
				if err != nil {
					r.Err = err
					return
				}
				b := f.BestWait()
				r.Optimum, r.FromPlanner, r.Front, r.Evaluations = b.Objectives, b.Planner, len(f.Points), f.Evaluations
			}
			r.Took = time.Since(start)
		}(&rows[i])
	}
	wg.Wait()
	return rows
}

// GapTable writes rows as one Markdown table: per run, the sessions, the
// planner's and the optimum's mean wait, active machines and stranded
// GPUs with the planner's gap on each (over 10% in bold), the mean wait
// of the two first-come-first-served baselines (baseline.go), the front's
// size, the evaluations and the optimiser's time.
func GapTable(rows []GapRow) string {
	var b strings.Builder
	b.WriteString("| nodes | shape | strategy | seed | sessions | wait (min) planner / optimum | gap | machines planner / optimum | gap | stranded GPUs planner / optimum | gap | wait (min) online / clairvoyant FCFS | optimum by | front | evaluations | took |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.Err != nil {
			fmt.Fprintf(&b, "| %d | %s | %s | %d | %d | error: %v |||||||||| \n", r.Shape.Nodes, r.Shape.Name, r.Strategy, r.Seed, r.Jobs, r.Err)
			continue
		}
		g := r.Gap()
		p, o := r.Planner.vec(), r.Optimum.vec()
		cell := func(i int) string {
			if math.IsNaN(g[i]) {
				if p[i] == 0 {
					return "0"
				}
				return fmt.Sprintf("+%.2f", p[i])
			}
			s := fmt.Sprintf("%.1f%%", 100*g[i])
			if g[i] > 0.10 {
				s = "**" + s + "**"
			}
			return s
		}
		by := "ε-NSGA-II"
		switch {
		case r.Exact:
			by = "exact"
		case r.FromPlanner:
			by = "ε-NSGA-II (planner's own point)"
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %d | %d | %.2f / %.2f | %s | %.2f / %.2f | %s | %.2f / %.2f | %s | %s / %s | %s | %d | %d | %v |\n",
			r.Shape.Nodes, r.Shape.Name, r.Strategy, r.Seed, r.Jobs, p[0], o[0], cell(0), p[1], o[1], cell(1), p[2], o[2], cell(2),
			fair(r.Online.Wait, r.OnlineFair), fair(r.Clairvoyant.Wait, r.ClairvoyantFair), by, r.Front, r.Evaluations, r.Took.Round(100*time.Millisecond))
	}
	return b.String()
}

// fair is a baseline's wait, marked "†" where it breaks the fair-share
// slack.
func fair(wait float64, ok bool) string {
	if ok {
		return fmt.Sprintf("%.2f", wait)
	}
	return fmt.Sprintf("%.2f†", wait)
}
