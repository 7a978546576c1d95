package sim

import (
	"fmt"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// benchFlood is the short version of issue 17's experiment that `make
// bench` runs: 40 nodes × 8 GPUs, two steady users offering 90% of the
// cluster, a third at 3× one steady user's rate for the middle 8 of 24
// hours, exponential run times of mean 1 h, a pass every simulated minute,
// measured over the flood.
func benchFlood(opt placer.PlanOptions, seed uint64) Config {
	d := 24 * time.Hour
	return Config{Nodes: 40, Plan: opt, Streams: Flood(40, 2, 0.9, 3, time.Hour, d/3, 2*d/3), Duration: d, Tick: time.Minute,
		Seed: seed, From: d / 3, To: 2 * d / 3}
}

// benchSteady is the two steady users alone at 90% load for 24 hours,
// measured after the first 4.
func benchSteady(opt placer.PlanOptions, seed uint64) Config {
	return Config{Nodes: 40, Plan: opt, Streams: Flood(40, 2, 0.9, 0, time.Hour, 0, 0), Duration: 24 * time.Hour, Tick: time.Minute,
		Seed: seed, From: 4 * time.Hour}
}

// seeds runs cfg for binpack and spread with the default settings, seeds
// 1–3, each strategy as a sub-benchmark; report gets each strategy's rows
// to report metrics. It prints the table of every row.
func seeds(b *testing.B, cfg func(placer.PlanOptions, uint64) Config, report func(*testing.B, []Row)) {
	var rows []Row
	for _, st := range []placer.Strategy{placer.Binpack, placer.Spread} {
		b.Run(string(st), func(b *testing.B) {
			opt := defaultOptions(b)
			opt.Strategy = st
			var got []Row
			for i := 0; i < b.N; i++ {
				got = got[:0]
				for seed := uint64(1); seed <= 3; seed++ {
					got = append(got, Row{Strategy: string(st), Seed: seed, Result: Run(cfg(opt, seed))})
				}
			}
			report(b, got)
			rows = append(rows, got...)
		})
	}
	if len(rows) > 0 {
		fmt.Print(Table(rows))
	}
}

// mean is the mean of f over rows.
func mean(rows []Row, f func(Result) float64) float64 {
	s := 0.0
	for _, r := range rows {
		s += f(r.Result)
	}
	return s / float64(max(len(rows), 1))
}

// BenchmarkFlood runs benchFlood and reports, as ratios to their
// ceilings: Jain's index (ceiling 1), utilisation while work waits and
// idle GPUs by cause (fractions of the cluster), the flooding user's
// share, the p99 wait of 8-GPU requests over that of 1-GPU ones, and
// 8-GPU slots free over floor(free GPUs / 8). It prints the table
// placer/README.md quotes.
func BenchmarkFlood(b *testing.B) {
	seeds(b, benchFlood, func(b *testing.B, rows []Row) {
		b.ReportMetric(mean(rows, func(r Result) float64 { return r.Jain }), "jain")
		b.ReportMetric(mean(rows, func(r Result) float64 { return r.Util }), "util-while-waiting")
		b.ReportMetric(mean(rows, func(r Result) float64 { return r.IdleHeld }), "idle-held")
		b.ReportMetric(mean(rows, func(r Result) float64 { return r.IdleFragmented }), "idle-fragmented")
		b.ReportMetric(mean(rows, func(r Result) float64 { return r.Share["flood"] }), "flood-share")
		b.ReportMetric(mean(rows, func(r Result) float64 {
			if p := r.Wait["1"].P99; p > 0 {
				return r.Wait["8"].P99 / p
			}
			return 0
		}), "p99-wait-8/1")
		if floor := mean(rows, func(r Result) float64 { return r.Floor8 }); floor > 0 {
			b.ReportMetric(mean(rows, func(r Result) float64 { return r.Slots8 })/floor, "8gpu-slots/floor(free/8)")
		}
	})
}

// BenchmarkSteady runs benchSteady and reports the fraction of passes
// that left work waiting and the utilisation while it waited.
func BenchmarkSteady(b *testing.B) {
	seeds(b, benchSteady, func(b *testing.B, rows []Row) {
		b.ReportMetric(mean(rows, func(r Result) float64 { return r.QueuedFraction }), "queued-fraction")
		b.ReportMetric(mean(rows, func(r Result) float64 { return r.Util }), "util-while-waiting")
	})
}
