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

// GapOptions say how RunGaps looks for the optimum.
type GapOptions struct {
	// Search is ε-NSGA-II's options; it runs on runs of at most
	// SearchLimit sessions (default 5,000: above, a generation takes
	// minutes).
	Search      SearchOptions
	SearchLimit int
	// Window is the rolling-horizon search's options (window.go); it runs
	// on every run of more than ExactLimit sessions.
	Window WindowOptions
	// Orders, when set, also schedules each run by each of WindowSeeds'
	// orders alone (GapRow.Orders): what each order is worth.
	Orders bool
}

// GapRow is the planner's gap to the optimum on one run of the suite: the
// planner's objectives on the run's arrivals, the best schedule found
// (Exact's when the run has at most ExactLimit sessions, else the best
// of Search's front, the rolling-horizon search's and the planner's own),
// a lower bound on the optimum (LowerBound), and how long the optimisers
// took.
type GapRow struct {
	Shape    Shape
	Strategy placer.Strategy
	Seed     uint64
	Jobs     int
	Planner  Objectives
	Optimum  Objectives
	// Exact is whether Optimum is Exact's; otherwise it is the best
	// schedule found, an upper bound on the optimum, so the gap is a lower
	// bound on the true gap. By names what found it.
	Exact bool
	By    string
	// Lower bounds the optimum on each objective: the planner's gap to it
	// bounds the true gap from above.
	Lower Bound
	// Rolling is the rolling-horizon search's schedule's objectives, and
	// RollingErr why it has none (a fair-share slack it missed).
	Rolling    Objectives
	RollingErr error
	// RollingWins counts the windows whose committed order came from each
	// of WindowSeeds.
	RollingWins map[string]int
	// Orders is the mean wait of the rolling scheduler committing one
	// seed order alone, without search, by WindowSeeds' name ("†" cases,
	// which break the fair-share slack, are NaN); GapOptions.Orders.
	Orders map[string]float64
	// FromPlanner is whether the best point is the planner's own schedule
	// (Search found nothing better on waits).
	FromPlanner bool
	// Online and Clairvoyant are the baselines of baseline.go: first come,
	// first served knowing nothing of the future, and knowing run times
	// (above SearchLimit sessions, FastFCFS's: online, and EASY
	// backfilling with exact run times).
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
func (r GapRow) Gap() [3]float64 { return gap(r.Planner, r.Optimum) }

// GapBound is (planner − bound) / bound of each objective, the most the
// planner can be from the optimum; NaN where the bound is zero.
func (r GapRow) GapBound() [3]float64 { return gap(r.Planner, r.Lower.Objectives) }

func gap(planner, ref Objectives) [3]float64 {
	p, o := planner.vec(), ref.vec()
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
func RunGaps(shapes []Shape, opt placer.PlanOptions, strategies []placer.Strategy, seeds []uint64, gopt GapOptions) []GapRow {
	if gopt.SearchLimit <= 0 {
		gopt.SearchLimit = 5000
	}
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
			r.Lower = in.LowerBound()
			online, onlineObj := in.FastFCFS(false)
			clair, clairObj := in.FastFCFS(true)
			if len(in.Jobs) <= gopt.SearchLimit {
				online, onlineObj = in.OnlineFCFS()
				clair, clairObj = in.ClairvoyantFCFS()
			}
			r.Online, r.Clairvoyant = onlineObj, clairObj
			_, err1 := in.Evaluate(online)
			_, err2 := in.Evaluate(clair)
			r.OnlineFair, r.ClairvoyantFair = err1 == nil, err2 == nil
			start := time.Now()
			if len(in.Jobs) <= ExactLimit {
				_, r.Optimum, r.Err = in.Exact()
				r.Exact, r.Front, r.By = true, 1, "exact"
				r.Took = time.Since(start)
				return
			}
			// The best of the planner's own schedule, the baselines that
			// keep the slack, the rolling search's and ε-NSGA-II's.
			r.Optimum, r.By, r.FromPlanner = r.Planner, "planner", true
			offer := func(o Objectives, by string) {
				if o.Less(r.Optimum) {
					r.Optimum, r.By, r.FromPlanner = o, by, false
				}
			}
			if r.OnlineFair {
				offer(onlineObj, "online FCFS")
			}
			if r.ClairvoyantFair {
				offer(clairObj, "clairvoyant FCFS")
			}
			wo := gopt.Window
			wo.Seed = r.Seed
			roll, err := in.RollingSearch(planner, wo)
			r.Rolling, r.RollingErr, r.RollingWins = roll.Objectives, err, roll.Wins
			r.Evaluations += roll.Evaluations
			if err == nil {
				offer(roll.Objectives, "rolling")
			}
			if gopt.Orders {
				r.Orders = map[string]float64{}
				for _, name := range WindowSeeds {
					wo := gopt.Window
					wo.Seed, wo.Generations, wo.Seeds = r.Seed, -1, []string{name}
					one, err := in.RollingSearch(planner, wo)
					r.Orders[name] = one.Objectives.Wait
					if err != nil {
						r.Orders[name] = math.NaN()
					}
				}
			}
			if len(in.Jobs) <= gopt.SearchLimit {
				so := gopt.Search
				so.Seed = r.Seed
				so.Extra = []Schedule{online, clair}
				f, err := in.Search(planner, so)
				if err != nil {
					r.Err = err
					return
				}
				b := f.BestWait()
				r.Front, r.Evaluations = len(f.Points), r.Evaluations+f.Evaluations
				if !b.Planner {
					offer(b.Objectives, "ε-NSGA-II")
				}
			}
			r.Took = time.Since(start)
		}(&rows[i])
	}
	wg.Wait()
	return rows
}

// GapTable writes rows as one Markdown table: per run, the sessions; the
// planner's, the best found's and the lower bound's mean wait and active
// machines, with the planner's gap to the best found (at least the true
// gap) and to the bound (at most the true gap), over 10% in bold; stranded
// GPUs, planner against best found (the bound is 0); the mean wait of the
// two first-come-first-served baselines (baseline.go; † where they break
// the fair-share slack) and of the rolling-horizon search; what found the
// best; and the optimisers' time.
func GapTable(rows []GapRow) string {
	var b strings.Builder
	b.WriteString("| nodes | shape | strategy | seed | sessions | wait (min) planner / best found / bound | gap to best / at most | machines planner / best / bound | gap to best / at most | stranded GPUs planner / best | gap | wait online / clairvoyant FCFS | wait rolling | best by | evaluations | took |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		if r.Err != nil {
			fmt.Fprintf(&b, "| %d | %s | %s | %d | %d | error: %v |||||||||| \n", r.Shape.Nodes, r.Shape.Name, r.Strategy, r.Seed, r.Jobs, r.Err)
			continue
		}
		g, gb := r.Gap(), r.GapBound()
		p, o, l := r.Planner.vec(), r.Optimum.vec(), r.Lower.vec()
		cell := func(g [3]float64, i int) string {
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
		by := r.By
		if by == "" {
			by = "exact"
		}
		rolling := "–"
		switch {
		case r.Exact:
		case r.RollingErr != nil:
			rolling = "missed the slack"
		default:
			rolling = fmt.Sprintf("%.2f", r.Rolling.Wait)
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %d | %d | %.2f / %.2f / %.2f | %s / %s | %.2f / %.2f / %.2f | %s / %s | %.2f / %.2f | %s | %s / %s | %s | %s | %d | %v |\n",
			r.Shape.Nodes, r.Shape.Name, r.Strategy, r.Seed, r.Jobs, p[0], o[0], l[0], cell(g, 0), cell(gb, 0), p[1], o[1], l[1], cell(g, 1), cell(gb, 1),
			p[2], o[2], cell(g, 2), fair(r.Online.Wait, r.OnlineFair), fair(r.Clairvoyant.Wait, r.ClairvoyantFair), rolling, by, r.Evaluations, r.Took.Round(100*time.Millisecond))
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
