package sim

import (
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// ExtraShapes are workload shapes outside the suite (Suite), built after
// the placer's policy was set, to judge it on workloads it was not tuned
// on, as issue 34 says its suite will be judged. A first eight: run
// times with a long tail; half-machine requests against a 1-GPU flood;
// sizes that do not tile a node (3, 5 and 6 GPUs); a day's load on top
// of a night's; an 8-GPU flood and a 1-GPU flood overlapping; pairs of
// whole machines; short 8-GPU runs against 1-GPU runs of hours; one user
// weighted four to one. A second eight, built after the first had been
// run: six users asking only for whole machines; gangs of two half
// machines; three users of one size each; a whole-machine user whose
// load rises eightfold; a whole-machine user weighted three to one; one
// user's sessions declaring no max runtime, as notebooks; whole-machine
// run times with a long tail; a flood of short 2-GPU runs. A third
// eight, built on 3 December 2026: half machines against a 1-GPU flood;
// three floods one after another; a flood of whole machines against
// steady users; 2-GPU sessions against 8-GPU ones; four whole-machine
// users against a 1-GPU flood; Ray gangs of four whole nodes against a
// 1-GPU flood; a weighted user of long whole-machine runs; half and
// whole machines against a flood of short 2-GPU runs. Each runs 24
// simulated hours × hours, judged from a sixth of the way in, at a
// cluster of nodes 8-GPU nodes, planned every SuiteTick; the hours in
// the shapes' About are those of a full-length run, and shorter runs
// scale them.
func ExtraShapes(nodes int, hours float64) []Shape {
	h := time.Duration(hours * float64(time.Hour))
	d := (24 * h).Round(SuiteTick)
	cfg := func(o placer.PlanOptions, seed uint64, streams ...Stream) Config {
		return Config{Nodes: nodes, Plan: o, Streams: streams, Duration: d, Tick: SuiteTick, Seed: seed, From: d / 6}
	}
	// floodBeside is a flood of user's sessions of gpus GPUs, mean run
	// time run, offering load over hours 4–12, beside two users at 45%
	// each in DefaultMix.
	floodBeside := func(o placer.PlanOptions, seed uint64, user string, gpus int, load float64, run time.Duration) Config {
		f := only(user, nodes, load, Size{GPUs: gpus}, Runtime{Mean: run})
		f.Start, f.End = d/6, d/2
		return cfg(o, seed, steady("u0", nodes, 0.45), steady("u1", nodes, 0.45), f)
	}
	odd := []Size{{GPUs: 1, Share: 0.35}, {GPUs: 3, Share: 0.2}, {GPUs: 5, Share: 0.2}, {GPUs: 6, Share: 0.15}, {GPUs: 8, Share: 0.1}}
	half := []Size{{GPUs: 4, Share: 0.6}, {GPUs: 8, Share: 0.4}}
	shapes := []Shape{
		{Name: "heavy-tail", About: "two users offering 45% each, DefaultMix, log-normal run times of mean 1 h and σ 1.5 (most runs minutes, a few days)", Build: func(o placer.PlanOptions, s uint64) Config {
			rt := Runtime{Kind: LogNormal, Mean: time.Hour, Sigma: 1.5}
			u0, u1 := steady("u0", nodes, 0.45), steady("u1", nodes, 0.45)
			u0.Runtime, u1.Runtime = rt, rt
			return cfg(o, s, u0, u1)
		}},
		{Name: "half-vs-1-flood", About: "one user of 4- and 8-GPU sessions (60:40) offering 50% against one flooding 1-GPU sessions at 100%", Build: func(o placer.PlanOptions, s uint64) Config {
			a := Stream{User: "half", Sizes: half, Runtime: Runtime{Mean: time.Hour}, Rate: rate(nodes, 0.5, meanGPUs(half), time.Hour)}
			return cfg(o, s, a, only("small", nodes, 1.0, Size{GPUs: 1}, Runtime{Mean: time.Hour}))
		}},
		{Name: "odd-sizes", About: "two users offering 50% each in sessions of 1, 3, 5, 6 and 8 GPUs (35/20/20/15/10%), sizes that do not tile a node", Build: func(o placer.PlanOptions, s uint64) Config {
			a := Stream{User: "odd", Sizes: odd, Runtime: Runtime{Mean: time.Hour}, Rate: rate(nodes, 0.5, meanGPUs(odd), time.Hour)}
			b := a
			b.User = "odd2"
			return cfg(o, s, a, b)
		}},
		{Name: "diurnal", About: "two users at 30% all day and two more at 40% each over working hours (6–18 h and 8–20 h): 140% at midday", Build: func(o placer.PlanOptions, s uint64) Config {
			day0, day1 := steady("day0", nodes, 0.4), steady("day1", nodes, 0.4)
			day0.Start, day0.End, day1.Start, day1.End = d/4, 3*d/4, d/3, 5*d/6
			return cfg(o, s, steady("u0", nodes, 0.3), steady("u1", nodes, 0.3), day0, day1)
		}},
		{Name: "8-flood-and-1-flood", About: "an 8-GPU flood at 100% over hours 4–10 and a 1-GPU flood at 100% over hours 6–14, overlapping, beside a user at 30%", Build: func(o placer.PlanOptions, s uint64) Config {
			f8 := only("f8", nodes, 1.0, Size{GPUs: 8}, Runtime{Mean: time.Hour})
			f8.Start, f8.End = d/6, 5*d/12
			f1 := only("f1", nodes, 1.0, Size{GPUs: 1}, Runtime{Mean: time.Hour})
			f1.Start, f1.End = d/4, 7*d/12
			return cfg(o, s, steady("u0", nodes, 0.3), f8, f1)
		}},
		{Name: "2-node-gangs", About: "pairs of whole machines (an 8-GPU head and one 8-GPU worker, 2 h) at 30% beside two users at 40% each", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, steady("u0", nodes, 0.4), steady("u1", nodes, 0.4),
				only("pair", nodes, 0.3, Size{GPUs: 8, Workers: 1}, Runtime{Mean: 2 * time.Hour}))
		}},
		{Name: "short-8-long-1", About: "8-GPU sessions of 10 min (40%) against 1-GPU sessions of 8 h (70%): long-8-short-1 turned round", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, only("short8", nodes, 0.4, Size{GPUs: 8}, Runtime{Mean: 10 * time.Minute}),
				only("long1", nodes, 0.7, Size{GPUs: 1}, Runtime{Mean: 8 * time.Hour}))
		}},
		{Name: "weights-1:1:4", About: "three users offering 50% each, one weighted 4 (UserWeights)", Build: func(o placer.PlanOptions, s uint64) Config {
			c := cfg(o, s, steady("a", nodes, 0.5), steady("b", nodes, 0.5), steady("vip", nodes, 0.5))
			c.UserWeights = map[string]float64{"vip": 4}
			return c
		}},
		{Name: "8-only-six-users", About: "six users asking only for 8-GPU sessions, 20% each (120%): only whole machines, every owner's queue large requests", Build: func(o placer.PlanOptions, s uint64) Config {
			var st []Stream
			for _, u := range []string{"w0", "w1", "w2", "w3", "w4", "w5"} {
				st = append(st, only(u, nodes, 0.2, Size{GPUs: 8}, Runtime{Mean: time.Hour}))
			}
			return cfg(o, s, st...)
		}},
		{Name: "half-gangs", About: "gangs of two half machines (a 4-GPU head and one 4-GPU worker, 2 h) at 30% beside two users at 40% each", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, steady("u0", nodes, 0.4), steady("u1", nodes, 0.4),
				only("halfpair", nodes, 0.3, Size{GPUs: 4, Workers: 1}, Runtime{Mean: 2 * time.Hour}))
		}},
		{Name: "one-size-each", About: "three users of one size each, 8, 4 and 1 GPUs, offering 35% each (105%)", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, only("eight", nodes, 0.35, Size{GPUs: 8}, Runtime{Mean: time.Hour}),
				only("four", nodes, 0.35, Size{GPUs: 4}, Runtime{Mean: time.Hour}),
				only("one", nodes, 0.35, Size{GPUs: 1}, Runtime{Mean: time.Hour}))
		}},
		{Name: "rising-8", About: "a user of 8-GPU sessions whose load rises from 10% to 80% over the run, beside two users at 40% each", Build: func(o placer.PlanOptions, s uint64) Config {
			r := only("big", nodes, 0.1, Size{GPUs: 8}, Runtime{Mean: time.Hour})
			r.RampTo, r.End = r.Rate*8, d
			return cfg(o, s, steady("u0", nodes, 0.4), steady("u1", nodes, 0.4), r)
		}},
		{Name: "weights-8-heavy", About: "a user of 8-GPU sessions weighted 3 against a user of 1-GPU sessions, 80% each (UserWeights)", Build: func(o placer.PlanOptions, s uint64) Config {
			c := cfg(o, s, only("heavy8", nodes, 0.8, Size{GPUs: 8}, Runtime{Mean: time.Hour}),
				only("light1", nodes, 0.8, Size{GPUs: 1}, Runtime{Mean: time.Hour}))
			c.UserWeights = map[string]float64{"heavy8": 3}
			return c
		}},
		{Name: "half-no-limit", About: "two users offering 45% each, DefaultMix; one's sessions declare no max runtime, as notebooks, so its nodes' drains are unknown", Build: func(o placer.PlanOptions, s uint64) Config {
			u1 := steady("u1", nodes, 0.45)
			u1.NoLimit = true
			return cfg(o, s, steady("u0", nodes, 0.45), u1)
		}},
		{Name: "long-tail-8", About: "8-GPU sessions with log-normal run times of mean 2 h and σ 1.5 (40%) against 1-GPU sessions of 1 h (60%)", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, only("big", nodes, 0.4, Size{GPUs: 8}, Runtime{Kind: LogNormal, Mean: 2 * time.Hour, Sigma: 1.5}),
				only("small", nodes, 0.6, Size{GPUs: 1}, Runtime{Mean: time.Hour}))
		}},
		{Name: "2-gpu-flood", About: "a flood of 2-GPU sessions of 30 min at 120% over hours 4–12 beside two users at 45% each", Build: func(o placer.PlanOptions, s uint64) Config {
			return floodBeside(o, s, "f2", 2, 1.2, 30*time.Minute)
		}},
		// A third eight, built on 3 December 2026 once the policy was
		// set, and run without changing it.
		{Name: "4-only-vs-1-flood", About: "one user asking only for 4-GPU sessions (60%) against one flooding 1-GPU sessions (120%)", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, only("four", nodes, 0.6, Size{GPUs: 4}, Runtime{Mean: time.Hour}),
				only("flood", nodes, 1.2, Size{GPUs: 1}, Runtime{Mean: time.Hour}))
		}},
		{Name: "three-floods", About: "two users at 40%; three floods of 60% each, DefaultMix, over hours 3–9, 6–12 and 9–15", Build: func(o placer.PlanOptions, s uint64) Config {
			st := []Stream{steady("u0", nodes, 0.4), steady("u1", nodes, 0.4)}
			for i, u := range []string{"fa", "fb", "fc"} {
				f := steady(u, nodes, 0.6)
				f.Start, f.End = time.Duration(1+i)*d/8, time.Duration(3+i)*d/8
				st = append(st, f)
			}
			return cfg(o, s, st...)
		}},
		{Name: "8-flood-vs-steady", About: "a flood of 8-GPU sessions at 120% over hours 4–12 against two users at 45% each, DefaultMix", Build: func(o placer.PlanOptions, s uint64) Config {
			return floodBeside(o, s, "f8", 8, 1.2, time.Hour)
		}},
		{Name: "2-vs-8", About: "one user asking only for 2-GPU sessions (70%) against one asking only for 8-GPU sessions (50%)", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, only("two", nodes, 0.7, Size{GPUs: 2}, Runtime{Mean: time.Hour}),
				only("eight", nodes, 0.5, Size{GPUs: 8}, Runtime{Mean: time.Hour}))
		}},
		{Name: "four-8-users-and-flood", About: "four users asking only for 8-GPU sessions, 15% each, against one flooding 1-GPU sessions at 100%", Build: func(o placer.PlanOptions, s uint64) Config {
			var st []Stream
			for _, u := range []string{"e0", "e1", "e2", "e3"} {
				st = append(st, only(u, nodes, 0.15, Size{GPUs: 8}, Runtime{Mean: time.Hour}))
			}
			return cfg(o, s, append(st, only("flood", nodes, 1.0, Size{GPUs: 1}, Runtime{Mean: time.Hour}))...)
		}},
		{Name: "gangs-4-vs-1-flood", About: "Ray gangs of a head and 3 workers of 8 GPUs each, four whole nodes at once (30%), against a 1-GPU flood at 100%", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, only("ray", nodes, 0.3, Size{GPUs: 8, Workers: 3}, Runtime{Mean: time.Hour}),
				only("flood", nodes, 1.0, Size{GPUs: 1}, Runtime{Mean: time.Hour}))
		}},
		{Name: "weights-2-8-long", About: "a user of 8-GPU sessions of 2 h (50%) weighted 2 against two users at 50% each, DefaultMix (UserWeights)", Build: func(o placer.PlanOptions, s uint64) Config {
			c := cfg(o, s, only("big", nodes, 0.5, Size{GPUs: 8}, Runtime{Mean: 2 * time.Hour}), steady("u0", nodes, 0.5), steady("u1", nodes, 0.5))
			c.UserWeights = map[string]float64{"big": 2}
			return c
		}},
		{Name: "4-and-8-vs-2-flood", About: "users of 4-GPU and of 8-GPU sessions of 2 h (30% each) against a flood of 20-minute 2-GPU sessions at 100% over hours 3–15", Build: func(o placer.PlanOptions, s uint64) Config {
			f := only("f2", nodes, 1.0, Size{GPUs: 2}, Runtime{Mean: 20 * time.Minute})
			f.Start, f.End = d/8, 5*d/8
			return cfg(o, s, only("four", nodes, 0.3, Size{GPUs: 4}, Runtime{Mean: 2 * time.Hour}),
				only("eight", nodes, 0.3, Size{GPUs: 8}, Runtime{Mean: 2 * time.Hour}), f)
		}},
	}
	for i := range shapes {
		shapes[i].Nodes = nodes
	}
	return shapes
}
