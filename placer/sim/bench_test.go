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
// default reservation setting, seeds 1–3.
func benchFlood(opt placer.PlanOptions, seed uint64) Config {
	d := 24 * time.Hour
	return Config{Nodes: 40, Plan: opt, Streams: Flood(40, 2, 0.9, 3, time.Hour, d/3, 2*d/3), Duration: d, Tick: time.Minute,
		Seed: seed, From: d / 3, To: 2 * d / 3}
}

// BenchmarkFlood runs benchFlood for binpack and spread and reports, as
// ratios to their ceilings: Jain's index (ceiling 1), utilisation while
// work waits and idle GPUs by cause (fractions of the cluster), the
// flooding user's share, the p99 wait of 8-GPU requests over that of
// 1-GPU ones, and 8-GPU slots free over floor(free GPUs / 8). It prints
// the table placer/README.md quotes.
func BenchmarkFlood(b *testing.B) {
	var rows []Row
	for _, st := range []placer.Strategy{placer.Binpack, placer.Spread} {
		b.Run(string(st), func(b *testing.B) {
			opt := defaultOptions(b)
			opt.Strategy = st
			var got []Row
			for i := 0; i < b.N; i++ {
				got = got[:0]
				for seed := uint64(1); seed <= 3; seed++ {
					got = append(got, Row{Strategy: string(st), Seed: seed, Result: Run(benchFlood(opt, seed))})
				}
			}
			var jain, util, held, frag, flood, ratio, slots, floor float64
			for _, r := range got {
				res := r.Result
				jain += res.Jain / 3
				util += res.Util / 3
				held += res.IdleHeld / 3
				frag += res.IdleFragmented / 3
				flood += res.Share["flood"] / 3
				if p := res.Wait["1"].P99; p > 0 {
					ratio += res.Wait["8"].P99 / p / 3
				}
				slots += res.Slots8 / 3
				floor += res.Floor8 / 3
			}
			b.ReportMetric(jain, "jain")
			b.ReportMetric(util, "util-while-waiting")
			b.ReportMetric(held, "idle-held")
			b.ReportMetric(frag, "idle-fragmented")
			b.ReportMetric(flood, "flood-share")
			b.ReportMetric(ratio, "p99-wait-8/1")
			if floor > 0 {
				b.ReportMetric(slots/floor, "8gpu-slots/floor(free/8)")
			}
			rows = append(rows, got...)
		})
	}
	if len(rows) > 0 {
		fmt.Print(Table(rows))
	}
}

// BenchmarkSteady runs the two steady users alone at 90% load for 24
// hours (measured after the first 4) and reports the fraction of passes
// that left work waiting and the utilisation while it waited, for binpack
// and spread, seeds 1–3, printing their table.
func BenchmarkSteady(b *testing.B) {
	var rows []Row
	for _, st := range []placer.Strategy{placer.Binpack, placer.Spread} {
		b.Run(string(st), func(b *testing.B) {
			opt := defaultOptions(b)
			opt.Strategy = st
			var got []Row
			for i := 0; i < b.N; i++ {
				got = got[:0]
				for seed := uint64(1); seed <= 3; seed++ {
					d := 24 * time.Hour
					cfg := Config{Nodes: 40, Plan: opt, Streams: Flood(40, 2, 0.9, 0, time.Hour, 0, 0), Duration: d, Tick: time.Minute, Seed: seed, From: 4 * time.Hour}
					got = append(got, Row{Strategy: string(st), Seed: seed, Result: Run(cfg)})
				}
			}
			var queued, util float64
			for _, r := range got {
				queued += r.Result.QueuedFraction / 3
				util += r.Result.Util / 3
			}
			b.ReportMetric(queued, "queued-fraction")
			b.ReportMetric(util, "util-while-waiting")
			rows = append(rows, got...)
		})
	}
	if len(rows) > 0 {
		fmt.Print(Table(rows))
	}
}
