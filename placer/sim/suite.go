package sim

import (
	"fmt"
	"math"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// Shape is one workload of the suite at one cluster size: the streams, how
// long they run, and the window over which fairness is judged.
type Shape struct {
	// Name identifies the shape in the table ("flood-drain").
	Name string
	// About says what the shape is, or what it is built to defeat.
	About string
	// Nodes is the cluster size.
	Nodes int
	// Build is the run for a strategy's options and a seed.
	Build func(opt placer.PlanOptions, seed uint64) Config
}

// SuiteTick is the simulated time between passes in every shape of the
// suite: the resolution of every wait it reports.
const SuiteTick = 2 * time.Minute

// rate is the arrivals per hour at which sessions of mean gpus GPUs,
// running mean run, offer load of a cluster of nodes 8-GPU nodes.
func rate(nodes int, load, gpus float64, run time.Duration) float64 {
	return load * float64(nodes*8) / gpus / run.Hours()
}

// meanGPUs is the mean GPUs of a session drawn from mix.
func meanGPUs(mix []Size) float64 {
	g, t := 0.0, 0.0
	for _, s := range mix {
		g += float64(s.GPUs*(s.Workers+1)) * s.Share
		t += s.Share
	}
	return g / t
}

// steady is a user offering load of the cluster in DefaultMix, exponential
// run times of mean 1 h.
func steady(user string, nodes int, load float64) Stream {
	return Stream{User: user, Rate: rate(nodes, load, meanGPUs(DefaultMix), time.Hour), Runtime: Runtime{Mean: time.Hour}}
}

// only is a user offering load of the cluster in sessions of one size.
func only(user string, nodes int, load float64, size Size, run Runtime) Stream {
	size.Share = 1
	return Stream{User: user, Rate: rate(nodes, load, float64(size.GPUs*(size.Workers+1)), run.Mean), Sizes: []Size{size}, Runtime: run}
}

// Suite is the workload shapes of issue 34 at a cluster of nodes 8-GPU
// nodes, each simulated for hours × its base duration (1 for the full
// suite; less keeps a 2,000-node run affordable). Shapes marked
// adversarial are built to defeat holds and draining: an owner trying to
// hold the whole cluster with large requests, small jobs that never let a
// node drain, requests that fit only a nearly empty node, max runtimes
// that tell nothing, and a script submitting a sweep of whole-machine
// runs at once into a full cluster. many-users is a lab's day: twenty
// users' mixed work beside one user training on whole machines;
// ray-gangs-8 has Ray gangs of eight whole nodes (half of a 16-node
// cluster); adv-burst-1 a sweep of a quarter of the GPUs in 1-GPU runs
// at once, whose ends leave free GPUs scattered over the nodes.
func Suite(nodes int, hours float64) []Shape {
	dur := func(h float64) time.Duration { return time.Duration(h * hours * float64(time.Hour)).Round(SuiteTick) }
	cfg := func(opt placer.PlanOptions, seed uint64, d, from, to time.Duration, streams ...Stream) Config {
		return Config{Nodes: nodes, Plan: opt, Streams: streams, Duration: d, Tick: SuiteTick, Seed: seed, From: from, To: to}
	}
	hour := time.Duration(float64(time.Hour) * min(1, hours*4)) // a run time's turnover, shorter in short runs
	// gangs is two users at 35% each beside Ray gangs of a head and
	// workers workers, 8 GPUs each part, offering load.
	gangs := func(workers int, load float64) func(placer.PlanOptions, uint64) Config {
		return func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			return cfg(o, s, d, d/8, 0, steady("u0", nodes, 0.35), steady("u1", nodes, 0.35),
				only("ray", nodes, load, Size{GPUs: 8, Workers: workers}, Runtime{Mean: time.Hour}))
		}
	}
	shapes := []Shape{
		{Name: "steady-90", About: "two users offering 90% together, DefaultMix, 1 h mean", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			return cfg(o, s, d, d/6, 0, steady("u0", nodes, 0.45), steady("u1", nodes, 0.45))
		}},
		{Name: "flood-drain", About: "two users at 60%; a third at 3× one's rate (90%) over hours 4–12, then the backlog drains", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			f := steady("flood", nodes, 0.9)
			f.Start, f.End = d/6, d/2
			return cfg(o, s, d, d/6+hour, d/2, steady("u0", nodes, 0.3), steady("u1", nodes, 0.3), f)
		}},
		{Name: "rising", About: "three users whose offered load rises together from 60% to 150% over the run", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			var st []Stream
			for _, u := range []string{"u0", "u1", "u2"} {
				x := steady(u, nodes, 0.2)
				x.RampTo, x.End = x.Rate*2.5, d
				st = append(st, x)
			}
			return cfg(o, s, d, d/3, 0, st...)
		}},
		{Name: "8-only-vs-1-flood", About: "one user asking only for 8-GPU sessions (60%) against one flooding 1-GPU sessions (120%)", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			return cfg(o, s, d, d/8, 0, only("big", nodes, 0.6, Size{GPUs: 8}, Runtime{Mean: time.Hour}),
				only("small", nodes, 1.2, Size{GPUs: 1}, Runtime{Mean: time.Hour}))
		}},
		{Name: "long-8-short-1", About: "8-GPU sessions of mean 8 h (60%) against 1-GPU sessions of mean 10 min (70%)", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			return cfg(o, s, d, d/4, 0, only("long", nodes, 0.6, Size{GPUs: 8}, Runtime{Mean: 8 * time.Hour}),
				only("short", nodes, 0.7, Size{GPUs: 1}, Runtime{Mean: 10 * time.Minute}))
		}},
		{Name: "two-floods", About: "two users at 60%; two floods of 90% each, over hours 4–12 and 8–16", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			a, b := steady("flood-a", nodes, 0.9), steady("flood-b", nodes, 0.9)
			a.Start, a.End = d/6, d/2
			b.Start, b.End = d/3, 2*d/3
			return cfg(o, s, d, d/6+hour, 2*d/3, steady("u0", nodes, 0.3), steady("u1", nodes, 0.3), a, b)
		}},
		{Name: "weights-3:1", About: "a user of weight 3 and one of weight 1, each offering 80%", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			c := cfg(o, s, d, d/8, 0, steady("heavy", nodes, 0.8), steady("light", nodes, 0.8))
			c.UserWeights = map[string]float64{"heavy": 3}
			return c
		}},
		{Name: "ray-gangs", About: "two users at 70%; Ray gangs of a head and 2 workers of 8 GPUs each (40%)", Build: gangs(2, 0.4)},
		{Name: "adv-hold-hog", About: "adversarial: one owner offering 150% in 8-GPU sessions, to hold every node, against two users at 30% each", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			return cfg(o, s, d, d/8, 0, only("hog", nodes, 1.5, Size{GPUs: 8}, Runtime{Mean: time.Hour}),
				steady("u0", nodes, 0.3), steady("u1", nodes, 0.3))
		}},
		{Name: "adv-sticky-small", About: "adversarial: 1-GPU sessions without a max runtime (nothing can backfill beside them) and with a long tail (log-normal, mean 4 h) at 100%, so nodes never drain by themselves, against 8-GPU sessions (50%)", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(36)
			sticky := only("sticky", nodes, 1.0, Size{GPUs: 1}, Runtime{Kind: LogNormal, Mean: 4 * time.Hour, Sigma: 1.5})
			sticky.NoLimit = true
			return cfg(o, s, d, d/6, 0, sticky, only("big", nodes, 0.5, Size{GPUs: 8}, Runtime{Mean: time.Hour}))
		}},
		{Name: "adv-7-of-8", About: "adversarial: 7-GPU sessions (fit only a node with 1 GPU used) at 50% against a 1- and 2-GPU flood at 100%", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			small := Stream{User: "small", Rate: rate(nodes, 1.0, 1.5, time.Hour), Sizes: []Size{{GPUs: 1, Share: 1}, {GPUs: 2, Share: 1}}, Runtime: Runtime{Mean: time.Hour}}
			return cfg(o, s, d, d/8, 0, only("seven", nodes, 0.5, Size{GPUs: 7}, Runtime{Mean: time.Hour}), small)
		}},
		{Name: "adv-declared-max", About: "adversarial: every session declares a max runtime of 72 h whatever it runs for, so max runtimes tell nothing: sweeps of 1/2/4-GPU runs of about 20 min (30%) and of about 6 h (35%), each user's alike (log-normal, σ 0.3), against 8-GPU sessions of about 2 h (25%)", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			sweep := []Size{{GPUs: 1, Share: 0.4}, {GPUs: 2, Share: 0.4}, {GPUs: 4, Share: 0.2}}
			short := Stream{User: "short", Sizes: sweep, Runtime: Runtime{Kind: LogNormal, Mean: 20 * time.Minute, Sigma: 0.3}}
			short.Rate = rate(nodes, 0.3, meanGPUs(sweep), short.Runtime.Mean)
			long := Stream{User: "long", Sizes: sweep, Runtime: Runtime{Kind: LogNormal, Mean: 6 * time.Hour, Sigma: 0.3}}
			long.Rate = rate(nodes, 0.35, meanGPUs(sweep), long.Runtime.Mean)
			c := cfg(o, s, d, d/4, 0, short, long, only("big", nodes, 0.25, Size{GPUs: 8}, Runtime{Kind: LogNormal, Mean: 2 * time.Hour, Sigma: 0.3}))
			c.DeclaredLimit = 72 * time.Hour
			return c
		}},
		{Name: "adv-burst-8", About: "adversarial: a script submitting sweeps of 8-GPU runs at once (a tenth of the nodes, every 2 h on average, 1 h each: 5%) against two users at 45% each", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			return cfg(o, s, d, d/8, 0, Bursts("sweep", 2*time.Hour, max(1, nodes/10), Size{GPUs: 8}, Runtime{Mean: time.Hour}),
				steady("u0", nodes, 0.45), steady("u1", nodes, 0.45))
		}},
		{Name: "many-users", About: "twenty users (a tenth of the nodes, at least two) offering 80% together (DefaultMix, 1 h mean), against one asking only for 8-GPU sessions (10%)", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			n := min(20, max(2, nodes/10))
			var st []Stream
			for i := range n {
				st = append(st, steady(fmt.Sprintf("m%02d", i), nodes, 0.8/float64(n)))
			}
			return cfg(o, s, d, d/6, 0, append(st, only("big", nodes, 0.1, Size{GPUs: 8}, Runtime{Mean: time.Hour}))...)
		}},
		{Name: "ray-gangs-8", About: "two users at 35%; Ray gangs of a head and 7 workers of 8 GPUs each, 8 whole nodes at once (30%)", Build: gangs(7, 0.3)},
		{Name: "adv-burst-1", About: "adversarial: a script submitting a sweep of 1-GPU runs at once (a quarter of the GPUs in one burst, every 2 h on average, 1 h each: 12.5%) beside one user asking only for 8-GPU sessions (50%) and one at 30%", Build: func(o placer.PlanOptions, s uint64) Config {
			d := dur(24)
			return cfg(o, s, d, d/6, 0, Bursts("sweep", 2*time.Hour, nodes*2, Size{GPUs: 1}, Runtime{Mean: time.Hour}),
				only("big", nodes, 0.5, Size{GPUs: 8}, Runtime{Mean: time.Hour}), steady("u0", nodes, 0.3))
		}},
	}
	for i := range shapes {
		shapes[i].Nodes = nodes
	}
	return shapes
}

// SuiteRow is one run of the suite: a shape, a strategy, a seed.
type SuiteRow struct {
	Shape    Shape
	Strategy placer.Strategy
	Seed     uint64
	Result   Result
}

// RunSuite runs every shape for every strategy and seed, parallel runs
// at most GOMAXPROCS at a time (each is deterministic by itself; only the
// NewPlan timings depend on the others), in the suite's order.
func RunSuite(shapes []Shape, opt placer.PlanOptions, strategies []placer.Strategy, seeds []uint64) []SuiteRow {
	var rows []SuiteRow
	for _, sh := range shapes {
		for _, st := range strategies {
			for _, seed := range seeds {
				rows = append(rows, SuiteRow{Shape: sh, Strategy: st, Seed: seed})
			}
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i := range rows {
		wg.Add(1)
		sem <- struct{}{}
		go func(r *SuiteRow) {
			defer func() { <-sem; wg.Done() }()
			o := opt
			o.Strategy = r.Strategy
			r.Result = Run(r.Shape.Build(o, r.Seed))
		}(&rows[i])
	}
	wg.Wait()
	return rows
}

// Goals is what issue 34 asks of every run, as SuiteRow.Goals checks it.
type Goals struct {
	// JainMin is the least Jain's index allowed at any pass of the window.
	JainMin float64
	// Ratio bounds the p99 wait of 8-GPU requests over that of 1-GPU
	// requests (each at least one pass's Tick: the resolution of a wait).
	Ratio float64
	// Excess bounds, in longest run times, how much longer than the wait
	// its fair share implied (Result.MaxExcess) any request waits.
	Excess float64
	// Busy is the least busy-while-waiting allowed, with binpack.
	Busy float64
}

// IssueGoals are issue 34's goals.
var IssueGoals = Goals{JainMin: 0.95, Ratio: 2, Excess: 2, Busy: 0.95}

// Ratio is the p99 wait of 8-GPU requests over that of 1-GPU requests,
// each at least one pass of the run (Tick, the resolution of a wait);
// NaN where either size is absent.
func (r Result) Ratio() float64 {
	one, eight := r.Wait["1"], r.Wait["8"]
	if one.N == 0 || eight.N == 0 {
		return math.NaN()
	}
	floor := r.Tick.Minutes()
	return max(eight.P99, floor) / max(one.P99, floor)
}

// Misses lists the goals the run misses, each with the figure and bound.
func (row SuiteRow) Misses(g Goals) []string {
	r := row.Result
	var out []string
	if r.JainMin < g.JainMin {
		out = append(out, fmt.Sprintf("Jain min %.3f < %.2f", r.JainMin, g.JainMin))
	}
	if x := r.Ratio(); !math.IsNaN(x) && x > g.Ratio {
		out = append(out, fmt.Sprintf("p99 8/1 %.2f > %.0f", x, g.Ratio))
	}
	if bound := g.Excess * r.LongestRuntime.Minutes(); r.MaxExcess > bound {
		out = append(out, fmt.Sprintf("wait beyond fair %.0f min > %.0f", r.MaxExcess, bound))
	}
	if row.Strategy == placer.Binpack && r.Busy < g.Busy {
		out = append(out, fmt.Sprintf("busy %.1f%% < %.0f%%", 100*r.Busy, 100*g.Busy))
	}
	return out
}

// sizeOrder orders wait labels: 1, 2, 4, 7, 8 GPUs, then gangs.
func sizeOrder(label string) int {
	var n int
	if _, err := fmt.Sscan(label, &n); err == nil {
		return n
	}
	return 1000 + len(label)
}

// SuiteTable writes rows as one Markdown table: per run, Jain's index
// min/mean over the window, each user's share, p50/p99 wait by request
// size, the 8/1 p99 ratio, the most any request waited beyond its fair
// wait against its bound, busy
// while waiting, 8-GPU slots against floor(free/8), NewPlan p50/p99, and
// the goals missed.
func SuiteTable(rows []SuiteRow, g Goals) string {
	var b strings.Builder
	b.WriteString("| nodes | shape | strategy | seed | sessions | Jain min / mean | shares | wait p50 / p99 by size (min) | p99 8/1 | most beyond fair wait / bound (min) | busy while waiting | 8-GPU slots / floor(free/8) | NewPlan p50 / p99 | goals missed |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, row := range rows {
		r := row.Result
		labels := make([]string, 0, len(r.Wait))
		for l := range r.Wait {
			labels = append(labels, l)
		}
		sort.Slice(labels, func(i, j int) bool { return sizeOrder(labels[i]) < sizeOrder(labels[j]) })
		var waits []string
		for _, l := range labels {
			w := r.Wait[l]
			waits = append(waits, fmt.Sprintf("%s: %.0f / %.0f", l, w.P50, w.P99))
		}
		ratio := "–"
		if x := r.Ratio(); !math.IsNaN(x) {
			ratio = fmt.Sprintf("%.2f", x)
		}
		missed := strings.Join(row.Misses(g), "; ")
		if missed == "" {
			missed = "none"
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %d | %d | %.3f / %.3f | %s | %s | %s | %.0f / %.0f | %.1f%% | %.2f / %.2f | %v / %v | %s |\n",
			row.Shape.Nodes, row.Shape.Name, row.Strategy, row.Seed, r.Sessions, r.JainMin, r.Jain, sharesCell(r.Share),
			strings.Join(waits, ", "), ratio, r.MaxExcess, g.Excess*r.LongestRuntime.Minutes(), 100*r.Busy,
			r.Slots8, r.Floor8, r.PlanP50.Round(10*time.Microsecond), r.PlanP99.Round(10*time.Microsecond), missed)
	}
	return b.String()
}
