package sim

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// PowerShapes are the workloads on which the pack strategy (placer/pack.go)
// is measured against binpack and spread (issue 40): low and moderate
// steady load, a day whose load rises from 10% to 70% and falls back, and
// two of the suite's shapes at high load. Each runs 24 hours × hours.
func PowerShapes(nodes int, hours float64) []Shape {
	dur := time.Duration(24 * hours * float64(time.Hour)).Round(SuiteTick)
	cfg := func(opt placer.PlanOptions, seed uint64, streams ...Stream) Config {
		return Config{Nodes: nodes, Plan: opt, Streams: streams, Duration: dur, Tick: SuiteTick, Seed: seed, From: dur / 8}
	}
	shapes := []Shape{
		{Name: "low-20", About: "two users offering 20% together, DefaultMix, 1 h mean", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, steady("u0", nodes, 0.1), steady("u1", nodes, 0.1))
		}},
		{Name: "low-40", About: "two users offering 40% together", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, steady("u0", nodes, 0.2), steady("u1", nodes, 0.2))
		}},
		{Name: "diurnal", About: "two users whose load rises from 10% to 70% over the first half of the day and falls back over the second", Build: func(o placer.PlanOptions, s uint64) Config {
			var st []Stream
			for _, u := range []string{"u0", "u1"} {
				up, down := steady(u, nodes, 0.05), steady(u, nodes, 0.35)
				up.RampTo, up.End = up.Rate*7, dur/2
				down.RampTo, down.Start = down.Rate/7, dur/2
				st = append(st, up, down)
			}
			return cfg(o, s, st...)
		}},
		{Name: "low-long-short", About: "8-GPU sessions of mean 8 h (15%) against 1-GPU sessions of mean 10 min (15%)", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, only("long", nodes, 0.15, Size{GPUs: 8}, Runtime{Mean: 8 * time.Hour}),
				only("short", nodes, 0.15, Size{GPUs: 1}, Runtime{Mean: 10 * time.Minute}))
		}},
	}
	for _, sh := range Suite(nodes, hours) {
		if sh.Name == "steady-90" || sh.Name == "long-8-short-1" {
			shapes = append(shapes, sh)
		}
	}
	for i := range shapes {
		shapes[i].Nodes = nodes
	}
	return shapes
}

// PowerTable writes rows as one Markdown table: per run, the mean active
// machines (holding a session) and the mean machines empty for at least
// 30 minutes, over the window, with the mean and p99 wait over every
// request and the p99 of 1- and 8-GPU requests.
func PowerTable(rows []SuiteRow) string {
	var b strings.Builder
	b.WriteString("| nodes | shape | strategy | seed | sessions | active machines | empty ≥ 30 min | wait mean / worst p99 of a size (min) | p99 1-GPU / 8-GPU (min) |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range rows {
		r := row.Result
		var all []float64
		sum := 0.0
		n := 0
		for _, st := range r.Wait {
			sum += st.Mean * float64(st.N)
			n += st.N
			all = append(all, st.P99)
		}
		sort.Float64s(all)
		mean := 0.0
		if n > 0 {
			mean = sum / float64(n)
		}
		p99 := 0.0
		if len(all) > 0 {
			p99 = all[len(all)-1] // the worst size's p99
		}
		cell := func(label string) string {
			if st, ok := r.Wait[label]; ok {
				return fmt.Sprintf("%.0f", st.P99)
			}
			return "–"
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %d | %d | %.1f (%.0f%%) | %.1f | %.1f / %.0f | %s / %s |\n",
			row.Shape.Nodes, row.Shape.Name, row.Strategy, row.Seed, r.Sessions, r.ActiveNodes, 100*r.ActiveNodes/float64(row.Shape.Nodes), r.IdleNodes,
			mean, p99, cell("1"), cell("8"))
	}
	return b.String()
}
