package sim

import (
	"math"
	"sort"
	"time"
)

// Lower bounds on the optimum, cheap at any scale (issue 40). Exact solves
// at most ExactLimit sessions and Search improves on a few hundred; at 200
// and 2,000 nodes a run has 10,000 to 160,000 sessions, and the gap is
// reported against a bound that every feasible schedule is at least: "the
// planner is at most X% from the optimum". TestLowerBoundBelowExact checks
// it against Exact's optimum on many small instances.

// Bound is a lower bound on each objective over every feasible schedule of
// an instance (so on the optimum's objectives too), and what it is made of.
type Bound struct {
	Objectives
	// Rounding is the part of Wait that every schedule pays: each session
	// waits at least from its arrival to its release (the first pass).
	Rounding float64
}

// LowerBound is a bound on each objective of every feasible schedule of
// in. Node packing, gang placement and the order of starts are relaxed;
// what is kept is the cluster's GPUs, each session's GPUs and run time,
// and the fair-share slack (each session's latest start).
//
// Wait. The sum of waits is Σ_j (release_j·Tick − arrive_j), which every
// schedule pays, plus Tick times Σ_t Q(t), Q(t) the sessions released by
// pass t and not started by it (the last pass weighted by what is left of
// End). Q(t) = A(t) − N(t), A(t) the sessions released by t and N(t) those
// started by t, so an upper bound on N(t) gives a lower bound on Q(t). A
// session started by t has either finished by t (started at s ≤ t − d, so
// released by t − d, having used g·d GPU-passes of the C·t the cluster
// offers before t) or runs at t (g of the cluster's C GPUs then). A session
// whose fair-share slack makes it start by pass L ≤ t is forced: it is in
// N(t) in every feasible schedule, it used at least g·min(d, t − L)
// GPU-passes before t, and if released after t − d it certainly runs at t.
// So N(t) is at most the forced sessions, plus the most unforced finished
// candidates whose GPU-passes fit what the forced ones left of C·t (the
// smallest first), plus the most unforced released sessions whose GPUs fit
// what the forced ones running at t leave of C (the smallest first). Each
// count is a relaxation of a knapsack by cardinality, solved exactly by
// taking the smallest; the two are counted apart (a session may be in
// both), which only loosens the bound.
//
// Machines. A forced session released at r with latest start L ≤ r + d − 1
// runs through [L, r + d) in every schedule (its compulsory part); at each
// pass the nodes in use are at least the compulsory GPUs over the GPUs of a
// node, rounded up, and at least the compulsory parts of more than half a
// node's GPUs (no two share a node).
//
// Stranded GPUs: 0. A schedule that leaves nothing waiting at a pass
// strands nothing then, and no cheap relaxation rules that out.
func (in *Instance) LowerBound() Bound {
	var b Bound
	P, nj := in.Passes, len(in.Jobs)
	if P == 0 || nj == 0 {
		return b
	}
	capacity := in.Nodes * in.GPUsPerNode
	tick := in.Tick.Minutes()
	// lastW is the minutes the last pass stands for: an unstarted session
	// waits until End, not a whole pass past the last.
	lastW := (in.End - in.Tick*time.Duration(P-1)).Minutes()

	type ev struct{ t, j int }
	var (
		release, finishIn, forced []ev
		maxWork                   int
	)
	forcedAt := make([]int, nj) // each job's latest start if it is forced; else P
	for j := range in.Jobs {
		jb := &in.Jobs[j]
		b.Rounding += in.waitOf(jb, jb.Release)
		L := P
		if !in.unstartedFair(jb) {
			if l := in.latest(jb); l >= 0 && l < P {
				L = max(l, jb.Release)
			} else if l < 0 {
				L = jb.Release // infeasible instance: at least its release
			}
		}
		forcedAt[j] = L
		release = append(release, ev{jb.Release, j})
		if f := jb.Release + jb.Dur; f < L && f < P {
			finishIn = append(finishIn, ev{f, j})
		}
		if L < P {
			forced = append(forced, ev{L, j})
		}
		maxWork = max(maxWork, jb.GPUs*jb.Parts*jb.Dur)
	}
	byT := func(es []ev) { sort.Slice(es, func(a, c int) bool { return es[a].t < es[c].t }) }
	byT(release)
	byT(finishIn)
	byT(forced)

	width := func(jb *Job) int { return jb.GPUs * jb.Parts }
	// runCount[g]: unforced released jobs of g GPUs in all (a small array);
	// finTree: unforced finished candidates by GPU-passes (a Fenwick tree
	// of counts and sums).
	maxW := 0
	for j := range in.Jobs {
		maxW = max(maxW, width(&in.Jobs[j]))
	}
	runCount := make([]int, maxW+1)
	fin := newFenwick(maxWork + 1)
	inFin := make([]bool, nj)
	var (
		ri, fi, ki              int
		released, nForced       int
		forcedRun               int     // GPUs of forced jobs certainly running at t
		forcedUsed, forcedSlope float64 // GPU-passes forced jobs used before t, and its growth per pass
		slopeEnds               = map[int]float64{}
		runEnds                 = map[int]int{}
		compParts               = map[int]int{} // big compulsory parts ending at pass
		bigParts                int
		sumQ, machines          float64
	)
	for t := 0; t < P; t++ {
		// The forced jobs' use before t grows by the GPUs of those that
		// started by t − 1 at the latest and have not run d passes.
		forcedUsed += forcedSlope
		forcedSlope -= slopeEnds[t]
		forcedRun -= runEnds[t]
		bigParts -= compParts[t]
		for ri < len(release) && release[ri].t <= t {
			j := release[ri].j
			released++
			if forcedAt[j] > t {
				runCount[width(&in.Jobs[j])]++
			}
			ri++
		}
		for fi < len(finishIn) && finishIn[fi].t <= t {
			j := finishIn[fi].j
			if forcedAt[j] > t {
				fin.add(width(&in.Jobs[j])*in.Jobs[j].Dur, 1)
				inFin[j] = true
			}
			fi++
		}
		for ki < len(forced) && forced[ki].t <= t {
			j := forced[ki].j
			jb := &in.Jobs[j]
			L := forced[ki].t
			nForced++
			if jb.Release < L { // counted as a runner since its release
				runCount[width(jb)]--
			}
			if inFin[j] {
				fin.add(width(jb)*jb.Dur, -1)
				inFin[j] = false
			}
			// Used at least g per pass from L until L + d.
			forcedSlope += float64(width(jb))
			slopeEnds[L+jb.Dur] += float64(width(jb))
			if end := jb.Release + jb.Dur; end > t {
				forcedRun += width(jb)
				runEnds[end] += width(jb)
				if 2*jb.GPUs > in.GPUsPerNode {
					bigParts += jb.Parts
					compParts[end] += jb.Parts
				}
			}
			ki++
		}
		// The most unforced jobs that can run at t: the narrowest first.
		room, nRun := capacity-forcedRun, 0
		for g := 1; g < len(runCount) && room > 0; g++ {
			if c := runCount[g]; c > 0 {
				take := min(c, room/g)
				nRun += take
				room -= take * g
			}
		}
		// The most unforced jobs finished by t in what is left of C·t.
		budget := float64(capacity*t) - forcedUsed
		nFin := 0
		if budget > 0 {
			nFin = fin.most(int(math.Floor(budget + 1e-9)))
		}
		q := released - (nForced + nRun + nFin)
		if q > 0 {
			w := tick
			if t == P-1 {
				w = lastW
			}
			sumQ += float64(q) * w
		}
		machines += float64(max((forcedRun+in.GPUsPerNode-1)/in.GPUsPerNode, bigParts))
	}
	b.Wait = (b.Rounding + sumQ) / float64(nj)
	b.Rounding /= float64(nj)
	b.Machines = machines / float64(P)
	return b
}

// fenwick is a binary indexed tree over costs 0..n-1 holding a count and
// a cost sum per cost, for "how many of the cheapest fit a budget".
type fenwick struct {
	cnt []int
	sum []int
	log int
}

func newFenwick(n int) *fenwick {
	f := &fenwick{cnt: make([]int, n+1), sum: make([]int, n+1)}
	for 1<<(f.log+1) <= n {
		f.log++
	}
	return f
}

func (f *fenwick) add(cost, d int) {
	for i := cost + 1; i < len(f.cnt); i += i & -i {
		f.cnt[i] += d
		f.sum[i] += d * cost
	}
}

// most is how many items, the cheapest first, fit within budget.
func (f *fenwick) most(budget int) int {
	// Descend to the largest prefix of costs whose whole sum fits.
	pos, count, spent := 0, 0, 0
	for step := 1 << f.log; step > 0; step >>= 1 {
		if next := pos + step; next < len(f.cnt) && spent+f.sum[next] <= budget {
			pos, count, spent = next, count+f.cnt[next], spent+f.sum[next]
		}
	}
	// Items of the next cost (pos) fit in part.
	if pos < len(f.cnt)-1 {
		cost := pos // the next cost is pos (index pos+1)
		if cost > 0 {
			have := f.countAt(pos + 1)
			count += min(have, (budget-spent)/cost)
		} else {
			count += f.countAt(pos + 1)
		}
	}
	return count
}

// countAt is the count at index i (cost i−1).
func (f *fenwick) countAt(i int) int {
	c := f.cnt[i]
	for k := i - 1; k > i-(i&-i); k -= k & -k {
		c -= f.cnt[k]
	}
	return c
}
