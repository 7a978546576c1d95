package placer

import (
	"math"
	"sort"

	"github.com/voyager-gpu/voyager/state"
)

// Goodput-aware elasticity (ElasticOptions.Goodput, VOYAGER_PLACER_GOODPUT),
// Pollux's idea simplified. An elastic job may report its throughput at the
// size it runs at (state.GoodputReport, published in its status); from
// the reports at the sizes it ran at, the planner estimates its speedup
// curve and so the throughput one more or one fewer GPU would add or take:
//
//   - grows: the idle GPUs of a node go one at a time to the ready job
//     there whose next GPU adds the most speedup, while that is at least
//     MinMarginalSpeedup, and a job grows only if the speedup it gains is
//     at least GrowGain of what it has (a resize costs a restart);
//   - shrinks: among the jobs whose shrink by the same number of GPUs
//     lets a waiter fit, the one that loses the least speedup.
//
// Speedup is measured in GPU-equivalents (a job's throughput over its
// throughput at one GPU), so that jobs whose samples differ in cost
// compare. A job with reports at two sizes or more gets Amdahl's law
// fitted to them (fitAmdahl); a job with fewer is taken to scale
// linearly, as size-blind elasticity assumes of every job; with no job
// reporting anything, nothing changes.

// Thresholds of goodput-aware grows.
const (
	// MinMarginalSpeedup is the least speedup, in GPU-equivalents, one
	// more GPU must add to be given to a job.
	MinMarginalSpeedup = 0.25
	// GrowGain is the least relative speedup a grow must bring.
	GrowGain = 0.10
)

// curve is a job's estimated speedup by size: Amdahl's law with parallel
// fraction p; p = 1 for a job that scales linearly (or reported too
// little to tell).
type curve struct{ p float64 }

// speedup is the throughput at n GPUs over that at one.
func (c curve) speedup(n int) float64 {
	if n <= 0 {
		return 0
	}
	return 1 / ((1 - c.p) + c.p/float64(n))
}

// marginal is the speedup the (n+1)-th GPU adds.
func (c curve) marginal(n int) float64 { return c.speedup(n+1) - c.speedup(n) }

// curveOf estimates a job's curve from its reports: linear with fewer
// than two distinct sizes reported, else Amdahl's law fitted to them.
func curveOf(samples []state.GoodputSample) curve {
	sizes := map[int]bool{}
	for _, s := range samples {
		if s.Size > 0 && s.Goodput() > 0 {
			sizes[s.Size] = true
		}
	}
	if len(sizes) < 2 {
		return curve{p: 1}
	}
	return curve{p: fitAmdahl(samples)}
}

// fitAmdahl is the parallel fraction p in [0, 1] (in steps of 0.001) whose
// Amdahl curve a/((1-p)+p/n), with the best scale a, is nearest the
// reported goodputs in relative squared error.
func fitAmdahl(samples []state.GoodputSample) float64 {
	best, bestErr := 1.0, math.Inf(1)
	for i := 0; i <= 1000; i++ {
		p := float64(i) / 1000
		c := curve{p: p}
		// The scale a minimising Σ((a·s_k − g_k)/g_k)², s_k the speedup
		// at the k-th size: a = Σ(s_k/g_k) / Σ(s_k/g_k)².
		var num, den float64
		for _, s := range samples {
			g := s.Goodput()
			if s.Size <= 0 || g <= 0 {
				continue
			}
			x := c.speedup(s.Size) / g
			num += x
			den += x * x
		}
		if den == 0 {
			continue
		}
		a := num / den
		var e float64
		for _, s := range samples {
			g := s.Goodput()
			if s.Size <= 0 || g <= 0 {
				continue
			}
			d := (a*c.speedup(s.Size) - g) / g
			e += d * d
		}
		if e < bestErr-1e-12 {
			best, bestErr = p, e
		}
	}
	return best
}

// anyGoodput reports whether some job reported a goodput.
func anyGoodput(jobs map[string]ElasticJob) bool {
	for _, j := range jobs {
		if len(j.Goodput) > 0 {
			return true
		}
	}
	return false
}

// goodputTargets is, for each ready job of jobs placed on a node (where),
// the size goodput-aware grows take it to: each node's idle GPUs handed
// out one at a time to the job whose next GPU adds the most speedup (ties
// by session), while that is at least MinMarginalSpeedup and the job is
// below its maximum; a job whose speedup would grow by less than GrowGain
// stays at its size. A job absent from the answer is not grown.
func goodputTargets(views map[string]*NodeView, where map[string]string, jobs map[string]ElasticJob, decided map[string]bool) map[string]int {
	byNode := map[string][]string{}
	for id, node := range where {
		if j := jobs[id]; j.Ready && j.Target == 0 && !decided[id] {
			byNode[node] = append(byNode[node], id)
		}
	}
	out := map[string]int{}
	for node, ids := range byNode {
		sort.Strings(ids)
		v := views[node]
		req := state.Resources{GPUs: 1}
		free := newNodeState(v).freeDevices(&req)
		size, to, curves := map[string]int{}, map[string]int{}, map[string]curve{}
		for _, id := range ids {
			size[id] = len(v.Ledger.Allocations[id].GPUs)
			to[id] = size[id]
			curves[id] = curveOf(jobs[id].Goodput)
		}
		for ; free > 0; free-- {
			pick, gain := "", MinMarginalSpeedup
			for _, id := range ids {
				if to[id] >= jobs[id].Max {
					continue
				}
				if m := curves[id].marginal(to[id]); m >= gain && (pick == "" || m > gain) {
					pick, gain = id, m
				}
			}
			if pick == "" {
				break
			}
			to[pick]++
		}
		for _, id := range ids {
			c := curves[id]
			if to[id] > size[id] && c.speedup(to[id]) >= (1+GrowGain)*c.speedup(size[id]) {
				out[id] = to[id]
			}
		}
	}
	return out
}

// shrinkLoss is the speedup, in GPU-equivalents, job j loses going from
// from GPUs to to: what a goodput-aware shrink minimises.
func shrinkLoss(j ElasticJob, from, to int) float64 {
	c := curveOf(j.Goodput)
	return c.speedup(from) - c.speedup(to)
}
