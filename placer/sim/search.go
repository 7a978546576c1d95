package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"sort"
	"sync"
)

// Search is ε-NSGA-II (Kollat and Reed, 2006) over an instance too large
// for Exact: NSGA-II (Deb et al., 2002: non-dominated sorting, crowding
// distance, binary tournaments, constraint domination) whose every
// feasible point is offered to an ε-dominance archive (Laumanns et al.,
// 2002: one point per ε-box of the objectives, boxes dominated by another
// removed), with time continuation: when the archive has not changed for
// Stall generations the population restarts from the archive's points
// and mutated copies of them. Simplified from Kollat and Reed in one way:
// the population keeps its size at a restart (theirs grows with the
// archive).
//
// A genome is two keys per job in [0, 1): a priority and a node pick. It
// decodes by the same serial scheme as Exact: jobs in priority order, each
// started at the first pass at which enough nodes fit it on what the jobs
// before it left; among the nodes that fit then, ordered fullest first, a
// pick below 0.5 takes the fullest (best fit) and a pick above takes the
// nodes at offset (pick-0.5)·2 of the list. A job started later than its
// fair-share slack allows is a constraint violation (its minutes beyond
// the slack, summed), which constraint domination ranks below every
// feasible genome.
//
// The first population holds the arrival order (first come, first
// served, best fit), the planner's own order of starts, and the arrival
// order with noise; the planner's own schedule enters the archive as a
// point as it is, so the front holds a point at least as good as the
// planner on every objective it is not beaten on. The same instance,
// options and seed give the same front.
type SearchOptions struct {
	// Population is the number of genomes (default 40).
	Population int
	// Generations is how many generations run (default 60).
	Generations int
	// Crossover is the probability a pair of parents is crossed
	// (uniform crossover of their keys; default 0.9).
	Crossover float64
	// Mutation is the probability each key of a child is moved (default
	// 2 / jobs), by a normal step of Sigma (default 0.05) for a
	// priority, or drawn anew for a pick.
	Mutation, Sigma float64
	// Epsilon is the archive's box size on (Wait minutes, Machines,
	// Stranded GPUs) (default 0.05, 0.05, 0.05).
	Epsilon [3]float64
	// Stall is the generations without a change of the archive before a
	// restart (default 10).
	Stall int
	// Seed makes the search reproducible.
	Seed uint64
	// Extra are more schedules to start from (gap.go gives the
	// first-come-first-served baselines): each feasible one enters the
	// archive as it is, and its order of starts joins the first
	// population.
	Extra []Schedule
}

func (o *SearchOptions) defaults(jobs int) {
	if o.Population <= 0 {
		o.Population = 40
	}
	o.Population += o.Population % 2
	if o.Generations <= 0 {
		o.Generations = 60
	}
	if o.Crossover <= 0 {
		o.Crossover = 0.9
	}
	if o.Mutation <= 0 {
		o.Mutation = math.Min(1, 2/float64(max(jobs, 1)))
	}
	if o.Sigma <= 0 {
		o.Sigma = 0.05
	}
	for i := range o.Epsilon {
		if o.Epsilon[i] <= 0 {
			o.Epsilon[i] = 0.05
		}
	}
	if o.Stall <= 0 {
		o.Stall = 10
	}
}

// Point is one schedule of a front with its objectives; Planner marks the
// planner's own schedule, given to Search.
type Point struct {
	Objectives
	Schedule Schedule
	Planner  bool
}

// Front is what Search found: the ε-archive's points (feasible, no two in
// one ε-box, none dominating another's box), ordered by Wait, and how many
// schedules it decoded.
type Front struct {
	Points      []Point
	Evaluations int
	Restarts    int
}

// BestWait is the front's point of least wait (ties: fewer machines, then
// fewer stranded GPUs).
func (f Front) BestWait() Point {
	best := f.Points[0]
	for _, p := range f.Points[1:] {
		if p.Objectives.Less(best.Objectives) {
			best = p
		}
	}
	return best
}

type genome struct {
	prio, pick []float64
	obj        Objectives
	viol       float64
	sched      Schedule
	rank       int
	crowd      float64
}

// decode builds g's schedule and objectives on the serial scheme.
func (in *Instance) decode(g *genome) {
	nj := len(in.Jobs)
	order := make([]int, nj)
	for j := range order {
		order[j] = j
	}
	sort.SliceStable(order, func(a, b int) bool { return g.prio[order[a]] < g.prio[order[b]] })
	prof := newProfile(in)
	s := Schedule{Start: make([]int, nj), Nodes: make([][]int, nj)}
	var fit []int
	sum, viol := 0.0, 0.0
	for _, j := range order {
		jb := &in.Jobs[j]
		k := prof.anyStart(jb, &fit)
		s.Start[j] = k
		w := in.waitOf(jb, k)
		sum += w
		if over := w - jb.FairWait - in.Slack; over > 1e-9 {
			viol += over
		}
		if k < 0 {
			continue
		}
		sort.SliceStable(fit, func(a, b int) bool { return prof.used[fit[a]][k] > prof.used[fit[b]][k] })
		off := 0
		if p := g.pick[j]; p >= 0.5 {
			off = int((p - 0.5) * 2 * float64(len(fit)))
		}
		nodes := make([]int, jb.Parts)
		for i := range nodes {
			nodes[i] = fit[(off+i)%len(fit)]
		}
		s.Nodes[j] = nodes
		prof.add(jb, nodes, k, 1)
	}
	g.sched, g.viol = s, viol
	g.obj = Objectives{Wait: sum / float64(max(nj, 1))}
	g.obj.Machines, g.obj.Stranded = in.occupancy(s, prof.used)
}

// better is constraint domination: a feasible genome beats an infeasible
// one, of two infeasible the smaller violation wins, of two feasible the
// dominating one.
func better(a, b *genome) bool {
	switch {
	case a.viol == 0 && b.viol > 0:
		return true
	case a.viol > 0 && b.viol == 0:
		return false
	case a.viol > 0:
		return a.viol < b.viol
	}
	return a.obj.dominates(b.obj)
}

// sortFronts gives every genome its non-domination rank and crowding
// distance and orders pop by (rank, -crowding).
func sortFronts(pop []*genome) {
	n := len(pop)
	dominated := make([][]int, n)
	count := make([]int, n)
	var front []int
	for i := 0; i < n; i++ {
		for j := 0; j < n; j++ {
			if i == j {
				continue
			}
			if better(pop[i], pop[j]) {
				dominated[i] = append(dominated[i], j)
			} else if better(pop[j], pop[i]) {
				count[i]++
			}
		}
		if count[i] == 0 {
			front = append(front, i)
		}
	}
	for rank := 0; len(front) > 0; rank++ {
		crowding(pop, front)
		var next []int
		for _, i := range front {
			pop[i].rank = rank
			for _, j := range dominated[i] {
				if count[j]--; count[j] == 0 {
					next = append(next, j)
				}
			}
		}
		front = next
	}
	sort.SliceStable(pop, func(a, b int) bool {
		if pop[a].rank != pop[b].rank {
			return pop[a].rank < pop[b].rank
		}
		return pop[a].crowd > pop[b].crowd
	})
}

// crowding sets the crowding distance of the genomes of one front.
func crowding(pop []*genome, front []int) {
	for _, i := range front {
		pop[i].crowd = 0
	}
	for m := 0; m < 3; m++ {
		idx := append([]int(nil), front...)
		sort.SliceStable(idx, func(a, b int) bool { return pop[idx[a]].obj.vec()[m] < pop[idx[b]].obj.vec()[m] })
		lo, hi := pop[idx[0]].obj.vec()[m], pop[idx[len(idx)-1]].obj.vec()[m]
		pop[idx[0]].crowd, pop[idx[len(idx)-1]].crowd = math.Inf(1), math.Inf(1)
		if hi == lo {
			continue
		}
		for k := 1; k < len(idx)-1; k++ {
			pop[idx[k]].crowd += (pop[idx[k+1]].obj.vec()[m] - pop[idx[k-1]].obj.vec()[m]) / (hi - lo)
		}
	}
}

// archive is an ε-dominance archive of feasible points.
type archive struct {
	eps    [3]float64
	points []Point
	boxes  [][3]float64
}

func (a *archive) box(o Objectives) [3]float64 {
	v := o.vec()
	return [3]float64{math.Floor(v[0] / a.eps[0]), math.Floor(v[1] / a.eps[1]), math.Floor(v[2] / a.eps[2])}
}

func boxDominates(a, b [3]float64) bool {
	return a[0] <= b[0] && a[1] <= b[1] && a[2] <= b[2] && a != b
}

// offer adds p unless a point's box dominates its box, or one shares its
// box and is as close to the box's corner; it removes the points whose
// boxes p's box dominates. It reports whether the archive changed.
func (a *archive) offer(p Point) bool {
	b := a.box(p.Objectives)
	corner := func(o Objectives, bx [3]float64) float64 {
		v, d := o.vec(), 0.0
		for i := range v {
			x := (v[i] - bx[i]*a.eps[i]) / a.eps[i]
			d += x * x
		}
		return d
	}
	for i, q := range a.boxes {
		if boxDominates(q, b) {
			return false
		}
		if q == b {
			if p.Objectives.dominates(a.points[i].Objectives) || (!a.points[i].Objectives.dominates(p.Objectives) && corner(p.Objectives, b) < corner(a.points[i].Objectives, b)) {
				a.points[i], a.boxes[i] = p, b
				return true
			}
			return false
		}
	}
	kept, keptB := a.points[:0], a.boxes[:0]
	for i, q := range a.boxes {
		if !boxDominates(b, q) {
			kept, keptB = append(kept, a.points[i]), append(keptB, q)
		}
	}
	a.points, a.boxes = append(kept, p), append(keptB, b)
	return true
}

// Search runs ε-NSGA-II on in with planner's schedule (the planner's own,
// which must be feasible) as a point of the archive and a seed of the
// first population, and returns the archive.
func (in *Instance) Search(planner Schedule, opt SearchOptions) (Front, error) {
	nj := len(in.Jobs)
	opt.defaults(nj)
	po, err := in.Evaluate(planner)
	if err != nil {
		return Front{}, fmt.Errorf("search: the planner's schedule: %w", err)
	}
	rng := rand.New(rand.NewPCG(opt.Seed, 0x6e736761)) // "nsga"
	arch := &archive{eps: opt.Epsilon}
	arch.offer(Point{Objectives: po, Schedule: planner, Planner: true})
	front := Front{}
	evaluate := func(gs []*genome) bool {
		var wg sync.WaitGroup
		work := make(chan *genome)
		for w := 0; w < runtime.GOMAXPROCS(0); w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for g := range work {
					in.decode(g)
				}
			}()
		}
		for _, g := range gs {
			work <- g
		}
		close(work)
		wg.Wait()
		front.Evaluations += len(gs)
		changed := false
		for _, g := range gs { // in order: the archive is the same on every run
			if g.viol == 0 && arch.offer(Point{Objectives: g.obj, Schedule: g.sched}) {
				changed = true
			}
		}
		return changed
	}
	span := float64(max(in.Passes, 1))
	fresh := func() *genome { return &genome{prio: make([]float64, nj), pick: make([]float64, nj)} }
	var pop []*genome
	fifo := fresh()
	for j := range in.Jobs {
		fifo.prio[j] = (float64(in.Jobs[j].Release) + float64(j)/float64(nj+1)) / (span + 1)
	}
	mine := fresh()
	for j := range in.Jobs {
		k := planner.Start[j]
		if k < 0 {
			k = in.Passes
		}
		mine.prio[j] = (float64(k) + float64(j)/float64(nj+1)) / (span + 1)
	}
	pop = append(pop, fifo, mine)
	for _, x := range opt.Extra {
		o, err := in.Evaluate(x)
		if err == nil {
			arch.offer(Point{Objectives: o, Schedule: x})
		}
		g := fresh()
		for j := range in.Jobs {
			k := x.Start[j]
			if k < 0 {
				k = in.Passes
			}
			g.prio[j] = (float64(k) + float64(j)/float64(nj+1)) / (span + 1)
		}
		if len(pop) < opt.Population {
			pop = append(pop, g)
		}
	}
	seeded := len(pop)
	for len(pop) < opt.Population {
		g := fresh()
		base := pop[len(pop)%seeded]
		noise := rng.Float64() * 0.3
		for j := range in.Jobs {
			g.prio[j] = base.prio[j] + noise*rng.NormFloat64()*float64(in.Jobs[j].Dur)/span
			if rng.Float64() < 0.5 {
				g.pick[j] = rng.Float64()
			}
		}
		pop = append(pop, g)
	}
	evaluate(pop)
	sortFronts(pop)
	tournament := func() *genome {
		a, b := pop[rng.IntN(len(pop))], pop[rng.IntN(len(pop))]
		if a.rank != b.rank {
			if a.rank < b.rank {
				return a
			}
			return b
		}
		if a.crowd >= b.crowd {
			return a
		}
		return b
	}
	mutate := func(g *genome) {
		for j := 0; j < nj; j++ {
			if rng.Float64() < opt.Mutation {
				g.prio[j] += opt.Sigma * rng.NormFloat64()
			}
			if rng.Float64() < opt.Mutation {
				g.pick[j] = rng.Float64()
			}
		}
	}
	stall := 0
	for gen := 0; gen < opt.Generations; gen++ {
		var kids []*genome
		for len(kids) < opt.Population {
			p1, p2 := tournament(), tournament()
			c1, c2 := fresh(), fresh()
			copy(c1.prio, p1.prio)
			copy(c1.pick, p1.pick)
			copy(c2.prio, p2.prio)
			copy(c2.pick, p2.pick)
			if rng.Float64() < opt.Crossover {
				for j := 0; j < nj; j++ {
					if rng.Float64() < 0.5 {
						c1.prio[j], c2.prio[j] = c2.prio[j], c1.prio[j]
						c1.pick[j], c2.pick[j] = c2.pick[j], c1.pick[j]
					}
				}
			}
			mutate(c1)
			mutate(c2)
			kids = append(kids, c1, c2)
		}
		changed := evaluate(kids)
		all := append(pop, kids...)
		sortFronts(all)
		pop = all[:opt.Population]
		if changed {
			stall = 0
		} else {
			stall++
		}
		if stall >= opt.Stall && gen < opt.Generations-1 {
			// Time continuation: restart from the archive's genomes, kept
			// by their schedules' start order, and mutated copies.
			front.Restarts++
			stall = 0
			var next []*genome
			for _, p := range arch.points {
				g := fresh()
				for j := range in.Jobs {
					k := p.Schedule.Start[j]
					if k < 0 {
						k = in.Passes
					}
					g.prio[j] = (float64(k) + float64(j)/float64(nj+1)) / (span + 1)
				}
				next = append(next, g)
				if len(next) >= opt.Population/4 {
					break
				}
			}
			for i := 0; len(next) < opt.Population; i++ {
				g := fresh()
				src := next[i%max(1, min(len(next), opt.Population/4))]
				copy(g.prio, src.prio)
				copy(g.pick, src.pick)
				mutate(g)
				next = append(next, g)
			}
			evaluate(next)
			pop = next
			sortFronts(pop)
		}
	}
	front.Points = append([]Point(nil), arch.points...)
	sort.SliceStable(front.Points, func(i, j int) bool { return front.Points[i].Objectives.Less(front.Points[j].Objectives) })
	return front, nil
}
