package sim

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/config"
	"github.com/voyager-gpu/voyager/placer"
)

// defaultOptions are the placer's default settings as the settings table
// gives them (VOYAGER_PLACER_STRATEGY, VOYAGER_PLACER_RESERVE_AFTER).
func defaultOptions(t testing.TB) placer.PlanOptions {
	cfg, err := config.Load(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	return placer.PlanOptions{Strategy: placer.Strategy(cfg.PlacerStrategy), ReserveAfter: cfg.PlacerReserveAfter}
}

// floodConfig is issue 17's experiment, smaller so that it runs in seconds
// under -race: 16 nodes × 8 GPUs (not 200), two steady users offering 90%
// of the cluster, a third flooding at 3× one steady user's rate for the
// middle third of 15 hours (about 1,000 sessions, not 20,000), exponential
// run times of mean 1 h, a pass every 3 simulated minutes. Smaller
// clusters are noisier: at 12 nodes one seed's Jain fell to 0.961.
func floodConfig(opt placer.PlanOptions, seed uint64) Config {
	d := 15 * time.Hour
	return Config{Nodes: 16, Plan: opt,
		Streams: Flood(16, 2, 0.9, 3, time.Hour, d/3, 2*d/3), Duration: d, Tick: 3 * time.Minute, Seed: seed, From: d / 3, To: 2 * d / 3}
}

// TestFloodFairAndNoStarvation: with default settings, during a 3× flood
// by one user, Jain's index over users with waiting work is at least 0.95,
// and the p99 wait of 8-GPU requests is at most twice that of 1-GPU
// requests. Before issue 17's change (aged requests ordered by age ahead
// of fair share) this measured Jain 0.76–0.78 on these seeds.
func TestFloodFairAndNoStarvation(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3} {
		r := Run(floodConfig(defaultOptions(t), seed))
		one, eight := r.Wait["1"], r.Wait["8"]
		t.Logf("seed %d: Jain %.3f, shares %v, 1-GPU wait p99 %.0f min, 8-GPU p99 %.0f min (%d sessions)", seed, r.Jain, r.Share, one.P99, eight.P99, r.Sessions)
		if r.Jain < 0.95 {
			t.Errorf("seed %d: Jain's index %.3f during the flood, want ≥ 0.95 (shares %v)", seed, r.Jain, r.Share)
		}
		if one.N == 0 || eight.N == 0 {
			t.Fatalf("seed %d: no 1-GPU (%d) or 8-GPU (%d) requests", seed, one.N, eight.N)
		}
		if eight.P99 > 2*one.P99 {
			t.Errorf("seed %d: p99 wait of 8-GPU requests %.0f min is more than twice that of 1-GPU requests %.0f min", seed, eight.P99, one.P99)
		}
	}
}

// TestRunDeterministic: the same config and seed give the same result; a
// different seed gives different arrivals.
func TestRunDeterministic(t *testing.T) {
	opt := defaultOptions(t)
	opt.Strategy = placer.Spread
	cfg := floodConfig(opt, 7)
	cfg.Duration, cfg.From, cfg.To = 4*time.Hour, time.Hour, 3*time.Hour
	a, b := Run(cfg), Run(cfg)
	if a.Jain != b.Jain || a.Sessions != b.Sessions || a.Wait["1"] != b.Wait["1"] || a.Util != b.Util {
		t.Errorf("two runs of one seed differ: %+v vs %+v", a, b)
	}
	cfg.Seed = 8
	if c := Run(cfg); c.Sessions == a.Sessions && c.Wait["1"] == a.Wait["1"] {
		t.Errorf("seeds 7 and 8 gave the same arrivals")
	}
}

// TestGangsBurstsAndRuntimes: a light steady load with bursts of 8-GPU
// requests and Ray gangs of three 8-GPU parts: every gang and burst binds
// before the run ends (reservations let them drain nodes), and run-time
// distributions keep their mean.
func TestGangsBurstsAndRuntimes(t *testing.T) {
	fixed := Runtime{Kind: Fixed, Mean: 30 * time.Minute}
	streams := Flood(12, 2, 0.5, 0, time.Hour, 0, 0)
	streams = append(streams,
		Bursts("burst", 2*time.Hour, 4, Size{GPUs: 8}, fixed),
		Gangs("ray", 0.5, 2, 8, Runtime{Kind: LogNormal, Mean: 30 * time.Minute, Sigma: 1}))
	d := 12 * time.Hour
	r := Run(Config{Nodes: 12, Plan: defaultOptions(t), Streams: streams, Duration: d, Tick: 2 * time.Minute, Seed: 5})
	gang, eight := r.Wait["gang 3×8"], r.Wait["8"]
	t.Logf("gangs %+v, 8-GPU %+v", gang, eight)
	if gang.N == 0 || eight.N == 0 {
		t.Fatalf("no gangs (%d) or 8-GPU requests (%d) arrived", gang.N, eight.N)
	}
	// Arrivals in the last two hours may still wait; none earlier.
	if gang.StillWaits > 1 || eight.StillWaits > 4 {
		t.Errorf("gangs still waiting %d of %d, 8-GPU %d of %d", gang.StillWaits, gang.N, eight.StillWaits, eight.N)
	}
	if gang.P99 > 6*60 {
		t.Errorf("p99 wait of gangs %.0f min under half load", gang.P99)
	}

	rng := rand.New(rand.NewPCG(1, 2))
	for _, rt := range []Runtime{fixed, {Kind: LogNormal, Mean: time.Hour, Sigma: 1}, {Kind: Exponential, Mean: time.Hour}} {
		var sum time.Duration
		const n = 20000
		for i := 0; i < n; i++ {
			sum += rt.draw(rng)
		}
		if mean := sum / n; mean < rt.Mean*95/100 || mean > rt.Mean*105/100 {
			t.Errorf("%s run times: mean %v, want %v ± 5%%", rt.Kind, mean, rt.Mean)
		}
	}
}

// suiteByName is the suite's shapes at nodes nodes, full length, by name.
func suiteByName(nodes int) map[string]Shape {
	shapes := map[string]Shape{}
	for _, sh := range Suite(nodes, 1) {
		shapes[sh.Name] = sh
	}
	return shapes
}
