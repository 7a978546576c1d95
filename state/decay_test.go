package state_test

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestDecayedUsage: no half-life is the plain sum; an hour used one
// half-life ago (as a short burst) counts about half, two half-lives a
// quarter; splitting an interval changes nothing (the integral is
// exact); decayed use never exceeds the plain sum and grows with the
// half-life; running use up to now is not decayed; daily records spread
// evenly over their days.
func TestDecayedUsage(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	week := 7 * 24 * time.Hour
	burst := func(subject string, ago time.Duration, gpuHours float64) state.UsageInterval {
		at := now.Add(-ago)
		return state.UsageInterval{Subject: subject, From: at.Add(-30 * time.Second), To: at.Add(30 * time.Second), GPUMilliseconds: int64(gpuHours * 3.6e6)}
	}
	ivs := []state.UsageInterval{burst("a", week, 100), burst("b", 2*week, 100), burst("c", 0, 100)}
	plain := state.DecayedUsage(ivs, now, 0)
	if plain["a"] != 100 || plain["b"] != 100 {
		t.Errorf("no decay: %v", plain)
	}
	got := state.DecayedUsage(ivs, now, week)
	for s, want := range map[string]float64{"a": 50, "b": 25, "c": 100} {
		if math.Abs(got[s]-want) > 0.01 {
			t.Errorf("%s decayed to %.4f, want %.4f", s, got[s], want)
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		from := now.Add(-time.Duration(r.Int64N(int64(60 * 24 * time.Hour))))
		to := from.Add(time.Duration(r.Int64N(int64(10 * 24 * time.Hour))))
		ms := r.Int64N(1e9)
		whole := state.DecayedUsage([]state.UsageInterval{{Subject: "x", From: from, To: to, GPUMilliseconds: ms}}, now, week)["x"]
		mid := from.Add(to.Sub(from) / 3)
		part1 := int64(float64(ms) * float64(mid.Sub(from)) / float64(to.Sub(from)))
		split := state.DecayedUsage([]state.UsageInterval{{Subject: "x", From: from, To: mid, GPUMilliseconds: part1}, {Subject: "x", From: mid, To: to, GPUMilliseconds: ms - part1}}, now, week)["x"]
		if to.After(from) && math.Abs(whole-split) > 1e-6*math.Max(1, whole) {
			t.Fatalf("[%s, %s) %d ms: whole %.9f, split %.9f", from, to, ms, whole, split)
		}
		plain := float64(ms) / 3.6e6
		longer := state.DecayedUsage([]state.UsageInterval{{Subject: "x", From: from, To: to, GPUMilliseconds: ms}}, now, 2*week)["x"]
		if whole > plain*(1+1e-9) || longer < whole*(1-1e-9) {
			t.Fatalf("decayed %.6f, plain %.6f, with twice the half-life %.6f", whole, plain, longer)
		}
	}
	days := []state.UsageDay{{Day: "2026-11-21", GPUMilliseconds: map[string]int64{"vision/ada": 24 * 3600000, "/bob": 3600000}},
		{Day: "2026-11-28", GPUMilliseconds: map[string]int64{"vision/ada": 12 * 3600000}}}
	team := func(t, _ string) string {
		if t == "" {
			return "-"
		}
		return t
	}
	ivs = state.DayIntervals(days, now, team)
	today := 0
	for _, iv := range ivs {
		if iv.To.Equal(now) {
			today++
		}
	}
	if len(ivs) != 3 || today != 1 {
		t.Fatalf("intervals %+v", ivs)
	}
	d := state.DecayedUsage(ivs, now, 0)
	if d["vision"] != 36 || d["-"] != 1 {
		t.Errorf("undecayed days: %v", d)
	}
	// Day 21 is centred one half-life before now: about half of 24.
	d = state.DecayedUsage(ivs, now, week)
	if want := 24*0.5 + 12*math.Exp2(-0.25/7); math.Abs(d["vision"]-want) > 0.05 {
		t.Errorf("decayed days: %.4f, want about %.4f", d["vision"], want)
	}
}
