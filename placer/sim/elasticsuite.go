package sim

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// ElasticShape is one workload of the elastic suite: how its jobs arrive,
// for every mode.
type ElasticShape struct {
	Name, About string
	Nodes       int
	Build       func(mode ElasticMode, seed uint64) ElasticConfig
}

// ElasticParallel is the parallel fractions elastic jobs draw from: from
// a job that gains a third from 2 to 8 GPUs (0.5) to one that scales
// nearly linearly (0.99).
var ElasticParallel = []float64{0.5, 0.75, 0.9, 0.97, 0.99}

// elasticUsers is how many users bring elastic jobs in each shape.
const elasticUsers = 3

// elasticStreams are elasticUsers users offering load of nodes 8-GPU
// nodes together, at their minimum, in jobs of 2-8 GPUs that run 2 hours
// on average at 2 GPUs.
func elasticStreams(nodes int, load float64) []ElasticStream {
	run := Runtime{Mean: 2 * time.Hour}
	var out []ElasticStream
	for u := 0; u < elasticUsers; u++ {
		st := Stream{User: fmt.Sprintf("e%d", u), Rate: rate(nodes, load/elasticUsers, 2, run.Mean),
			Sizes: []Size{{GPUs: 2, Share: 1}}, Runtime: run, NoLimit: true}
		out = append(out, ElasticStream{Stream: st, Min: 2, Max: 8, Parallel: ElasticParallel})
	}
	return out
}

// ElasticSuite is the elastic suite at a cluster of nodes 8-GPU nodes:
// low and high load of elastic jobs alone, bursts of them, and elastic
// jobs beside fixed-size work at two loads; 24 simulated hours of
// arrivals each.
func ElasticSuite(nodes int) []ElasticShape {
	const day = 24 * time.Hour
	cfg := func(mode ElasticMode, seed uint64, el []ElasticStream, fixed ...Stream) ElasticConfig {
		return ElasticConfig{Nodes: nodes, Plan: placer.PlanOptions{ReserveAfter: 10 * time.Minute}, Elastic: el, Fixed: fixed,
			Duration: day, Drain: 2 * day, Tick: time.Minute, Seed: seed, Mode: mode, Cost: DefaultElasticCost}
	}
	shapes := []ElasticShape{
		{Name: "low-30", About: "elastic jobs of 2-8 GPUs offering 30% at their minimum", Build: func(m ElasticMode, s uint64) ElasticConfig {
			return cfg(m, s, elasticStreams(nodes, 0.3))
		}},
		{Name: "high-90", About: "elastic jobs of 2-8 GPUs offering 90% at their minimum", Build: func(m ElasticMode, s uint64) ElasticConfig {
			return cfg(m, s, elasticStreams(nodes, 0.9))
		}},
		{Name: "bursts", About: "each of 3 users submits bursts of 12 elastic jobs (at 16 nodes), every 4 h on average (about 28%)", Build: func(m ElasticMode, s uint64) ElasticConfig {
			el := elasticStreams(nodes, 0.3)
			for i := range el {
				el[i].Rate, el[i].Burst = 1.0/4, max(1, 12*nodes/16)
			}
			return cfg(m, s, el)
		}},
		{Name: "mixed-30+40", About: "elastic jobs offering 30% beside fixed-size sessions (DefaultMix, 1 h mean) offering 40%", Build: func(m ElasticMode, s uint64) ElasticConfig {
			return cfg(m, s, elasticStreams(nodes, 0.3), steady("fixed", nodes, 0.4))
		}},
		{Name: "mixed-50+40", About: "elastic jobs offering 50% beside fixed-size sessions offering 40%", Build: func(m ElasticMode, s uint64) ElasticConfig {
			return cfg(m, s, elasticStreams(nodes, 0.5), steady("fixed", nodes, 0.4))
		}},
	}
	for i := range shapes {
		shapes[i].Nodes = nodes
	}
	return shapes
}

// ElasticRow is one shape and seed run in every mode.
type ElasticRow struct {
	Shape  ElasticShape
	Seed   uint64
	Result map[ElasticMode]ElasticResult
}

// RunElasticSuite runs every shape for every seed in every mode, at most
// GOMAXPROCS runs at a time; each run is deterministic by itself.
func RunElasticSuite(shapes []ElasticShape, seeds []uint64) []ElasticRow {
	var rows []ElasticRow
	for _, sh := range shapes {
		for _, seed := range seeds {
			rows = append(rows, ElasticRow{Shape: sh, Seed: seed, Result: map[ElasticMode]ElasticResult{}})
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i := range rows {
		for _, m := range ElasticModes {
			wg.Add(1)
			sem <- struct{}{}
			go func(r *ElasticRow, m ElasticMode) {
				defer func() { <-sem; wg.Done() }()
				res := RunElastic(r.Shape.Build(m, r.Seed))
				mu.Lock()
				r.Result[m] = res
				mu.Unlock()
			}(&rows[i], m)
		}
	}
	wg.Wait()
	return rows
}

// Best is the mode of the two fixed ones whose elastic jobs' mean
// completion time is the lower, and that mean.
func (r ElasticRow) Best() (ElasticMode, float64) {
	lo, hi := r.Result[FixedMin].Elastic.Mean, r.Result[FixedMax].Elastic.Mean
	if hi < lo {
		return FixedMax, hi
	}
	return FixedMin, lo
}

// ElasticTable writes rows as one Markdown table: per shape and seed,
// the elastic jobs' mean / p99 completion time in minutes in every mode,
// elastic's and goodput's mean against the better fixed choice, their
// resizes and mean size, and the fixed-size work's mean completion time
// beside them.
func ElasticTable(rows []ElasticRow) string {
	var b strings.Builder
	b.WriteString("| shape | seed | jobs | fixed at min: mean / p99 | fixed at max: mean / p99 | elastic: mean / p99 | goodput: mean / p99 | elastic, goodput vs better fixed | resizes (elastic / goodput) | mean size (elastic / goodput) | fixed work: mean (min / max / elastic / goodput) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		cell := func(m ElasticMode) string {
			j := r.Result[m].Elastic
			s := fmt.Sprintf("%.0f / %.0f", j.Mean, j.P99)
			if j.Unfinished > 0 {
				s += fmt.Sprintf(" (%d unfinished)", j.Unfinished)
			}
			return s
		}
		_, best := r.Best()
		vs := fmt.Sprintf("%+.0f%%, %+.0f%%", 100*(r.Result[SizeBlind].Elastic.Mean/best-1), 100*(r.Result[GoodputAware].Elastic.Mean/best-1))
		fixed := "–"
		if r.Result[FixedMin].Fixed.N > 0 {
			fixed = fmt.Sprintf("%.0f / %.0f / %.0f / %.0f", r.Result[FixedMin].Fixed.Mean, r.Result[FixedMax].Fixed.Mean,
				r.Result[SizeBlind].Fixed.Mean, r.Result[GoodputAware].Fixed.Mean)
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %s | %s | %s | %d / %d | %.1f / %.1f | %s |\n",
			r.Shape.Name, r.Seed, r.Result[FixedMin].Elastic.N, cell(FixedMin), cell(FixedMax), cell(SizeBlind), cell(GoodputAware), vs,
			r.Result[SizeBlind].Resizes, r.Result[GoodputAware].Resizes, r.Result[SizeBlind].MeanSize, r.Result[GoodputAware].MeanSize, fixed)
	}
	return b.String()
}
