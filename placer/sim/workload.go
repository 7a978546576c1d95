package sim

import "time"

// Flood is the issue-17 workload: users steady users ("u0", "u1", …)
// arrive at equal rates that together offer load of the cluster's GPUs
// (exponential run times of mean run, DefaultMix), and between from and
// to one more user, "flood", arrives at factor times one steady user's
// rate.
func Flood(nodes, users int, load, factor float64, run time.Duration, from, to time.Duration) []Stream {
	gpusPerSession := 0.0
	for _, s := range DefaultMix {
		gpusPerSession += float64(s.GPUs) * s.Share
	}
	// sessions per hour per user so that all users together offer load.
	rate := load * float64(nodes*8) / gpusPerSession / run.Hours() / float64(users)
	rt := Runtime{Kind: Exponential, Mean: run}
	var out []Stream
	for u := 0; u < users; u++ {
		out = append(out, Stream{User: userName(u), Rate: rate, Runtime: rt})
	}
	return append(out, Stream{User: "flood", Rate: rate * factor, Start: from, End: to, Runtime: rt})
}

// Bursts adds, every period on average, count sessions of size at once
// from user.
func Bursts(user string, period time.Duration, count int, size Size, run Runtime) Stream {
	size.Share = 1
	return Stream{User: user, Rate: 1 / period.Hours(), Burst: count, Sizes: []Size{size}, Runtime: run}
}

// Gangs is a stream of Ray gangs from user: a head and workers parts of
// gpus GPUs each, at rate per hour.
func Gangs(user string, rate float64, workers, gpus int, run Runtime) Stream {
	return Stream{User: user, Rate: rate, Sizes: []Size{{GPUs: gpus, Workers: workers, Share: 1}}, Runtime: run}
}

func userName(i int) string { return "u" + string(rune('0'+i)) }
