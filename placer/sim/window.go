package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"sync"
)

// A rolling-horizon search (issue 40): an upper bound on the optimum at
// 200 and 2,000 nodes, where Search's serial decoder (every node scanned
// at every candidate pass) is too slow for 10,000+ sessions.
//
// The decoder here is list scheduling pass by pass (a parallel
// schedule-generation scheme) with exact run times: at every pass the
// waiting sessions in priority order, each started on the fullest nodes it
// fits now (best fit, nodes kept in buckets by free GPUs); the first
// session that does not fit gets a reservation (EASY backfilling, Mu'alem
// and Feitelson 2001, with exact run times): the nodes on which its GPUs
// free earliest are held for it, and later sessions start on a held node
// only if they end by then. A session whose fair-share slack runs out
// within Urgent passes goes before the rest, earliest deadline first.
//
// The arrivals are cut into windows of Window passes. Each window's
// sessions (those waiting at its start and those released in it) get
// priorities from NSGA-II (Search's non-dominated sorting, crowding and
// constraint domination) over the window plus Lookahead passes, from the
// state the windows before it left (what runs on each node and what still
// waits), later arrivals in the lookahead served first come first served.
// The first population holds the planner's order of starts, first come
// first served, shortest first, least GPU-time first and earliest
// fair-share deadline first, and noisy copies; the best feasible point on
// waits (then machines, then stranded GPUs) is committed: its starts
// within the window are kept, the rest wait for the next window. The
// whole schedule is checked by Evaluate, so what RollingSearch returns is
// a feasible schedule: an upper bound on the optimum.

// WindowOptions tune RollingSearch.
type WindowOptions struct {
	// Window and Lookahead are in passes (defaults 30 and 60).
	Window, Lookahead int
	// Population and Generations of each window's NSGA-II (defaults 16
	// and 12; Generations below zero: none, and no noisy copies: the best
	// seed order is committed).
	Population, Generations int
	// Urgent is how many passes before its fair-share deadline a session
	// goes first (default 30).
	Urgent int
	// Seeds, when set, are the only WindowSeeds the populations start
	// from (to tell what knowing run times is worth).
	Seeds []string
	// Seed makes the search reproducible.
	Seed uint64
}

func (o *WindowOptions) defaults() {
	if o.Window <= 0 {
		o.Window = 30
	}
	if o.Lookahead < 0 {
		o.Lookahead = 0
	} else if o.Lookahead == 0 {
		o.Lookahead = 60
	}
	if o.Population <= 0 {
		o.Population = 16
	}
	o.Population += o.Population % 2
	if o.Generations == 0 {
		o.Generations = 12
	}
	if o.Urgent <= 0 {
		o.Urgent = 30
	}
}

// Rolling is what RollingSearch found.
type Rolling struct {
	Schedule   Schedule
	Objectives Objectives
	// Windows is how many windows were searched, Evaluations how many
	// window decodes ran, and Improved in how many windows the committed
	// order was not the first seed's (the planner's order).
	Windows, Evaluations, Improved int
	// Wins counts the windows whose committed order came from each seed
	// (WindowSeeds' names; a child counts for its first parent's seed).
	Wins map[string]int
}

// WindowSeeds names the orders that seed each window's population, in
// order: the planner's order of starts, first come first served, shortest
// run time first, least GPU-time first, earliest fair-share deadline
// first, and shortest declared max runtime first (what an online planner
// could know; no max runtime counts as the longest).
var WindowSeeds = []string{"planner", "fcfs", "shortest", "least GPU-time", "deadline", "shortest declared"}

// runState is the cluster between passes: free GPUs and what runs on each
// node, and the sessions waiting.
type runState struct {
	free    []int
	running [][]endGPUs // per node
	nextEnd []int       // per node: the earliest end, or MaxInt
	waiting []int       // job indices
}

type endGPUs struct{ end, gpus int }

func (s *runState) clone() *runState {
	c := &runState{free: append([]int(nil), s.free...), running: make([][]endGPUs, len(s.running)),
		nextEnd: append([]int(nil), s.nextEnd...), waiting: append([]int(nil), s.waiting...)}
	for n, r := range s.running {
		c.running[n] = append([]endGPUs(nil), r...)
	}
	return c
}

// fastDecoder holds per-instance facts the decoder reads.
type fastDecoder struct {
	in       *Instance
	latest   []int // the last pass each job may start at; Passes or more: none
	byRel    []int // jobs in release order
	relStart []int // index into byRel of the first job released at pass t (len Passes+1)
	// defKey is the key of a job outside the window searched: after
	// every window job, first come first served.
	defKey []float64
}

func newFastDecoder(in *Instance) *fastDecoder {
	d := &fastDecoder{in: in, latest: make([]int, len(in.Jobs)), byRel: make([]int, len(in.Jobs)), defKey: make([]float64, len(in.Jobs))}
	for j := range in.Jobs {
		jb := &in.Jobs[j]
		d.defKey[j] = 1e9 + float64(jb.Release) + float64(j)*1e-9
		d.latest[j] = math.MaxInt
		if !in.unstartedFair(jb) {
			d.latest[j] = max(in.latest(jb), jb.Release)
		}
		d.byRel[j] = j
	}
	sort.SliceStable(d.byRel, func(a, b int) bool { return in.Jobs[d.byRel[a]].Release < in.Jobs[d.byRel[b]].Release })
	d.relStart = make([]int, in.Passes+2)
	i := 0
	for t := 0; t <= in.Passes+1; t++ {
		for i < len(d.byRel) && in.Jobs[d.byRel[i]].Release < t {
			i++
		}
		d.relStart[t] = i
	}
	return d
}

// windowResult is what one decode of passes [from, to) gave.
type windowResult struct {
	waitSum, machines, stranded, viol float64
	starts                            map[int]startAt
}

type startAt struct {
	pass  int
	nodes []int
}

// run decodes passes [from, to) from st (changed in place) with priority
// key[j] (lower first; jobs without a key go after, by release), urgent
// sessions first (urgent below zero: none), the first that does not fit
// held nodes if reserve. It returns, for the jobs released before to, their
// waits counted up to to (or their start), the machines and stranded
// GPUs summed over the passes, and the minutes beyond the fair-share
// slack of every start, and of every session still waiting at to whose
// deadline has passed. With record it returns the starts.
func (d *fastDecoder) run(st *runState, from, to int, key []float64, urgent int, reserve, record bool) windowResult {
	in := d.in
	G := in.GPUsPerNode
	var res windowResult
	if record {
		res.starts = map[int]startAt{}
	}
	// Buckets of nodes by free GPUs; pos is a node's index in its bucket.
	bucket := make([][]int, G+1)
	pos := make([]int, in.Nodes)
	for n, f := range st.free {
		pos[n] = len(bucket[f])
		bucket[f] = append(bucket[f], n)
	}
	totalFree := 0
	for _, f := range st.free {
		totalFree += f
	}
	move := func(n, f int) {
		old := st.free[n]
		b := bucket[old]
		last := b[len(b)-1]
		b[pos[n]] = last
		pos[last] = pos[n]
		bucket[old] = b[:len(b)-1]
		st.free[n] = f
		totalFree += f - old
		pos[n] = len(bucket[f])
		bucket[f] = append(bucket[f], n)
	}
	held := map[int]int{} // node → the pass its reservation starts
	var fit, heldOrder []int
	type shadowNode struct{ n, at int }
	var cand []shadowNode
	// The waiting sessions in two lists kept sorted across passes (a sort
	// of the whole queue every pass is what made this slow at 2,000
	// nodes): urg, those within urgent passes of their deadline, by
	// deadline then key; norm, the rest by key. A session turns urgent at
	// the pass in becomes; in marks which list holds it.
	byKey := func(a, b int) int {
		if key[a] != key[b] {
			if key[a] < key[b] {
				return -1
			}
			return 1
		}
		return a - b
	}
	byDeadline := func(a, b int) int {
		if d.latest[a] != d.latest[b] {
			if d.latest[a] < d.latest[b] {
				return -1
			}
			return 1
		}
		return byKey(a, b)
	}
	isUrgent := func(j, t int) bool { return urgent >= 0 && d.latest[j] != math.MaxInt && d.latest[j]-t <= urgent }
	const inNorm, inUrg = 1, 2
	in8 := make(map[int]uint8, len(st.waiting))
	becomes := map[int][]int{}
	waitCount := make([]int, G+1) // waiting sessions by GPUs a part
	var urg, norm, batch []int
	enter := func(j, t int) {
		waitCount[min(in.Jobs[j].GPUs, G)]++
		if isUrgent(j, t) {
			in8[j] = inUrg
			i, _ := slices.BinarySearchFunc(urg, j, byDeadline)
			urg = slices.Insert(urg, i, j)
			return
		}
		in8[j] = inNorm
		batch = append(batch, j)
		if urgent >= 0 && d.latest[j] != math.MaxInt {
			if at := d.latest[j] - urgent; at < to {
				becomes[at] = append(becomes[at], j)
			}
		}
	}
	for _, j := range st.waiting {
		enter(j, from)
	}
	slices.SortFunc(batch, byKey)
	norm, batch = append(norm, batch...), batch[:0]
	for t := from; t < to && t < in.Passes; t++ {
		for n := range st.nextEnd {
			if st.nextEnd[n] > t {
				continue
			}
			r := st.running[n][:0]
			next, f := math.MaxInt, st.free[n]
			for _, e := range st.running[n] {
				if e.end <= t {
					f += e.gpus
				} else {
					r = append(r, e)
					next = min(next, e.end)
				}
			}
			st.running[n], st.nextEnd[n] = r, next
			move(n, f)
		}
		for i := d.relStart[t]; i < d.relStart[t+1]; i++ {
			enter(d.byRel[i], t)
		}
		if len(batch) > 0 {
			slices.SortFunc(batch, byKey)
			merged := make([]int, 0, len(norm)+len(batch))
			a, b := 0, 0
			for a < len(norm) || b < len(batch) {
				if b == len(batch) || (a < len(norm) && byKey(norm[a], batch[b]) < 0) {
					merged = append(merged, norm[a])
					a++
				} else {
					merged = append(merged, batch[b])
					b++
				}
			}
			norm, batch = merged, batch[:0]
		}
		for _, j := range becomes[t] {
			if in8[j] == inNorm { // still waiting: to the urgent list
				in8[j] = inUrg
				i, _ := slices.BinarySearchFunc(urg, j, byDeadline)
				urg = slices.Insert(urg, i, j)
			}
		}
		delete(becomes, t)
		clear(held)
		heldOrder = heldOrder[:0]
		reserved := false
		// try starts j if it fits; false if it waits.
		try := func(j int) bool {
			jb := &in.Jobs[j]
			fit = fit[:0]
			// Best fit among nodes not held, then held nodes the job
			// leaves before their reservation starts.
			for f := jb.GPUs; f <= G && len(fit) < jb.Parts; f++ {
				for _, n := range bucket[f] {
					if _, h := held[n]; h {
						continue
					}
					fit = append(fit, n)
					if len(fit) == jb.Parts {
						break
					}
				}
			}
			if len(fit) < jb.Parts {
				for _, n := range heldOrder { // in a fixed order: the same run every time
					if at := held[n]; st.free[n] >= jb.GPUs && t+jb.Dur <= at && len(fit) < jb.Parts && !contains(fit, n) {
						fit = append(fit, n)
					}
				}
			}
			if len(fit) >= jb.Parts {
				nodes := append([]int(nil), fit[:jb.Parts]...)
				sort.Ints(nodes)
				for _, n := range nodes {
					move(n, st.free[n]-jb.GPUs)
					st.running[n] = insertByEnd(st.running[n], endGPUs{t + jb.Dur, jb.GPUs})
					st.nextEnd[n] = min(st.nextEnd[n], t+jb.Dur)
				}
				w := in.waitOf(jb, t)
				res.waitSum += w
				if over := w - jb.FairWait - in.Slack; over > 1e-9 {
					res.viol += over
				}
				if record {
					res.starts[j] = startAt{t, nodes}
				}
				delete(in8, j)
				waitCount[jb.GPUs]--
				return true
			}
			if reserved || !reserve {
				return false
			}
			// EASY: the first that does not fit is held the nodes on
			// which its GPUs free earliest.
			reserved = true
			cand = cand[:0]
			for n := 0; n < in.Nodes; n++ {
				if _, h := held[n]; h {
					continue
				}
				at, f := t, st.free[n]
				if f < jb.GPUs {
					at = math.MaxInt
					for _, e := range st.running[n] { // by end
						f += e.gpus
						if f >= jb.GPUs {
							at = e.end
							break
						}
					}
				}
				cand = append(cand, shadowNode{n, at})
			}
			sort.Slice(cand, func(a, b int) bool {
				if cand[a].at != cand[b].at {
					return cand[a].at < cand[b].at
				}
				return cand[a].n < cand[b].n
			})
			if len(cand) >= jb.Parts {
				at := cand[jb.Parts-1].at
				for _, c := range cand[:jb.Parts] {
					held[c.n] = at
					heldOrder = append(heldOrder, c.n)
				}
			}
			return false
		}
		// Urgent first, then the rest; once no GPU is free nothing more
		// can start this pass.
		keptU := urg[:0]
		for _, j := range urg {
			if totalFree == 0 || !try(j) {
				keptU = append(keptU, j)
			}
		}
		urg = keptU
		keptN := norm[:0]
		for i, j := range norm {
			if totalFree == 0 {
				for _, j := range norm[i:] {
					if in8[j] == inNorm {
						keptN = append(keptN, j)
					}
				}
				break
			}
			if in8[j] != inNorm {
				continue // turned urgent: in urg now
			}
			if !try(j) {
				keptN = append(keptN, j)
			}
		}
		norm = keptN
		// Machines and stranded GPUs at pass t.
		smallest := math.MaxInt
		for g := 1; g <= G; g++ {
			if waitCount[g] > 0 {
				smallest = g
				break
			}
		}
		for f := 0; f <= G; f++ {
			c := len(bucket[f])
			if f < G {
				res.machines += float64(c)
			}
			if f > 0 && f < smallest && smallest != math.MaxInt {
				res.stranded += float64(c * f)
			}
		}
	}
	st.waiting = append(urg, norm...)
	// Sessions still waiting: their wait up to to, and a violation if
	// their deadline has passed.
	end := min(to, in.Passes)
	for _, j := range st.waiting {
		jb := &in.Jobs[j]
		var w float64
		if end >= in.Passes {
			w = in.waitOf(jb, -1)
		} else {
			w = in.waitOf(jb, end)
		}
		res.waitSum += w
		if d.latest[j] < end {
			res.viol += math.Max(w-jb.FairWait-in.Slack, 1e-6)
		}
	}
	return res
}

// insertByEnd adds e to rs, kept in order of end.
func insertByEnd(rs []endGPUs, e endGPUs) []endGPUs {
	i := len(rs)
	rs = append(rs, e)
	for i > 0 && rs[i-1].end > e.end {
		rs[i] = rs[i-1]
		i--
	}
	rs[i] = e
	return rs
}

func contains(xs []int, x int) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// RollingSearch is the rolling-horizon search over in (see above),
// seeded with planner, the planner's own schedule. The result is
// feasible; where no window beat the planner's order it may equal the
// planner's waits or be worse, and the caller keeps the better.
func (in *Instance) RollingSearch(planner Schedule, opt WindowOptions) (Rolling, error) {
	opt.defaults()
	d := newFastDecoder(in)
	rng := rand.New(rand.NewPCG(opt.Seed, 0x726f6c6c)) // "roll"
	st := in.newRunState()
	nj := len(in.Jobs)
	out := Rolling{Schedule: Schedule{Start: make([]int, nj), Nodes: make([][]int, nj)}, Wins: map[string]int{}}
	for j := range out.Schedule.Start {
		out.Schedule.Start[j] = -1
	}
	plannerStart := func(j int) float64 {
		if k := planner.Start[j]; k >= 0 {
			return float64(k)
		}
		return float64(in.Passes)
	}
	workers := max(1, runtime.GOMAXPROCS(0))
	for w0 := 0; w0 < in.Passes; w0 += opt.Window {
		w1 := min(w0+opt.Window, in.Passes)
		to := min(w1+opt.Lookahead, in.Passes)
		// The window's jobs: waiting now and released in the window.
		jobs := append([]int(nil), st.waiting...)
		for i := d.relStart[w0]; i < d.relStart[w1]; i++ {
			jobs = append(jobs, d.byRel[i])
		}
		out.Windows++
		if len(jobs) == 0 {
			d.run(st, w0, w1, d.defKey, opt.Urgent, true, true)
			continue
		}
		rank := func(score func(j int) float64) []float64 {
			idx := append([]int(nil), jobs...)
			sort.SliceStable(idx, func(a, b int) bool { return score(idx[a]) < score(idx[b]) })
			keys := make([]float64, len(jobs))
			at := map[int]int{}
			for i, j := range idx {
				at[j] = i
			}
			for i, j := range jobs {
				keys[i] = float64(at[j]) / float64(len(jobs))
			}
			return keys
		}
		seeds := [][]float64{
			rank(plannerStart),
			rank(func(j int) float64 { return float64(in.Jobs[j].Arrive) }),
			rank(func(j int) float64 { return float64(in.Jobs[j].Dur) }),
			rank(func(j int) float64 {
				jb := &in.Jobs[j]
				return float64(jb.GPUs * jb.Parts * jb.Dur)
			}),
			rank(func(j int) float64 { return float64(d.latest[j]) }),
			rank(func(j int) float64 {
				if l := in.Jobs[j].Limit; l > 0 {
					return float64(l)
				}
				return math.MaxFloat64
			}),
		}
		if len(opt.Seeds) > 0 {
			var kept [][]float64
			for i, s := range seeds {
				if slices.Contains(opt.Seeds, WindowSeeds[i]) {
					kept = append(kept, s)
				}
			}
			seeds = kept
		}
		eval := func(gs []*genome) {
			var wg sync.WaitGroup
			work := make(chan *genome)
			for w := 0; w < workers; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for g := range work {
						key := append([]float64(nil), d.defKey...)
						for i, j := range jobs {
							key[j] = g.prio[i]
						}
						r := d.run(st.clone(), w0, to, key, opt.Urgent, true, false)
						span := float64(max(1, to-w0))
						g.obj = Objectives{Wait: r.waitSum / float64(len(jobs)), Machines: r.machines / span, Stranded: r.stranded / span}
						g.viol = r.viol
					}
				}()
			}
			for _, g := range gs {
				work <- g
			}
			close(work)
			wg.Wait()
			out.Evaluations += len(gs)
		}
		var pop []*genome
		origin := map[*genome]int{}
		for i, s := range seeds {
			g := &genome{prio: append([]float64(nil), s...)}
			origin[g] = i
			pop = append(pop, g)
		}
		for opt.Generations >= 0 && len(pop) < opt.Population {
			base := seeds[len(pop)%len(seeds)]
			g := &genome{prio: make([]float64, len(jobs))}
			origin[g] = len(pop) % len(seeds)
			noise := 0.02 + 0.2*rng.Float64()
			for i := range g.prio {
				g.prio[i] = base[i] + noise*rng.NormFloat64()
			}
			pop = append(pop, g)
		}
		eval(pop)
		// best: feasible before infeasible, then the least violation,
		// then lexicographically on the objectives.
		first, best := pop[0], pop[0]
		consider := func(gs []*genome) {
			for _, g := range gs {
				switch {
				case g.viol == 0 && best.viol > 0,
					g.viol > 0 && best.viol > 0 && g.viol < best.viol,
					g.viol == 0 && best.viol == 0 && g.obj.Less(best.obj):
					best = g
				}
			}
		}
		consider(pop)
		sortFronts(pop)
		mutation := math.Min(1, 2/float64(len(jobs)))
		for gen := 0; gen < opt.Generations; gen++ {
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
			var kids []*genome
			for len(kids) < opt.Population {
				p1, p2 := tournament(), tournament()
				c1 := &genome{prio: append([]float64(nil), p1.prio...)}
				c2 := &genome{prio: append([]float64(nil), p2.prio...)}
				origin[c1], origin[c2] = origin[p1], origin[p2]
				if rng.Float64() < 0.9 {
					for i := range c1.prio {
						if rng.Float64() < 0.5 {
							c1.prio[i], c2.prio[i] = c2.prio[i], c1.prio[i]
						}
					}
				}
				for _, c := range []*genome{c1, c2} {
					for i := range c.prio {
						if rng.Float64() < mutation {
							c.prio[i] += 0.05 * rng.NormFloat64()
						}
					}
				}
				kids = append(kids, c1, c2)
			}
			eval(kids)
			consider(kids)
			all := append(pop, kids...)
			sortFronts(all)
			pop = all[:opt.Population]
		}
		if best != first {
			out.Improved++
		}
		out.Wins[seedName(opt.Seeds, origin[best])]++
		key := append([]float64(nil), d.defKey...)
		for i, j := range jobs {
			key[j] = best.prio[i]
		}
		r := d.run(st, w0, w1, key, opt.Urgent, true, true)
		for j, s := range r.starts {
			out.Schedule.Start[j], out.Schedule.Nodes[j] = s.pass, s.nodes
		}
	}
	o, err := in.Evaluate(out.Schedule)
	if err != nil {
		return out, fmt.Errorf("rolling search: the committed schedule: %w", err)
	}
	out.Objectives = o
	return out, nil
}

// newRunState is an empty cluster.
func (in *Instance) newRunState() *runState {
	st := &runState{free: make([]int, in.Nodes), running: make([][]endGPUs, in.Nodes), nextEnd: make([]int, in.Nodes)}
	for n := range st.free {
		st.free[n], st.nextEnd[n] = in.GPUsPerNode, math.MaxInt
	}
	return st
}

// FastFCFS is first come, first served by the list scheduler above, fast
// at any scale: without reserve, at every pass the waiting sessions in
// arrival order each started on the fullest nodes it fits now (online
// FCFS, as OnlineFCFS, ties between equally full nodes aside); with
// reserve, the first that does not fit is held the nodes on which its
// GPUs free earliest, later ones backfilled only where they end by then
// (EASY backfilling with exact run times: clairvoyant). It may break the
// fair-share slack.
func (in *Instance) FastFCFS(reserve bool) (Schedule, Objectives) {
	d := newFastDecoder(in)
	key := make([]float64, len(in.Jobs))
	for j := range key {
		key[j] = float64(in.Jobs[j].Arrive) + float64(j)*1e-6
	}
	r := d.run(in.newRunState(), 0, in.Passes, key, -1, reserve, true)
	s := Schedule{Start: make([]int, len(in.Jobs)), Nodes: make([][]int, len(in.Jobs))}
	for j := range s.Start {
		s.Start[j] = -1
	}
	for j, x := range r.starts {
		s.Start[j], s.Nodes[j] = x.pass, x.nodes
	}
	o := Objectives{Wait: r.waitSum / float64(max(len(in.Jobs), 1))}
	if in.Passes > 0 {
		o.Machines, o.Stranded = r.machines/float64(in.Passes), r.stranded/float64(in.Passes)
	}
	return s, o
}

// seedName is the name of the i-th seed of a population started from
// only (all of WindowSeeds if empty).
func seedName(only []string, i int) string {
	n := 0
	for _, name := range WindowSeeds {
		if len(only) > 0 && !slices.Contains(only, name) {
			continue
		}
		if n == i {
			return name
		}
		n++
	}
	return "?"
}
