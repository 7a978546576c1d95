package sim

import (
	"time"

	"github.com/voyager-gpu/voyager/placer"
)

// MixedShapes are workload shapes on a cluster of machines of two sizes,
// as a lab's cluster grows: 8-GPU servers beside 4-GPU or 2-GPU ones
// (Config.NodeGPUs). A request for 8 GPUs fits only the large machines,
// a 4-GPU request is a whole small one, and the standing reserve and the
// holds must keep the large machines for the requests only they can
// take. Built after the policy of issue 34 was set, to judge it on
// clusters it was not tuned on; loads are of the cluster's GPUs, whatever
// the machines. Each runs 24 simulated hours × hours, judged from a sixth
// of the way in, at nodes nodes, planned every SuiteTick. With uniform,
// every machine has 8 GPUs and the streams offer the same loads of the
// cluster: the control, which differs from the shape only in the
// machines' sizes.
func MixedShapes(nodes int, hours float64, uniform bool) []Shape {
	h := time.Duration(hours * float64(time.Hour))
	d := (24 * h).Round(SuiteTick)
	// sizes lays out nodes machines: every k-th of large GPUs, the rest
	// of small (interleaved, so that no strategy's order by name finds
	// one kind first).
	sizes := func(k, large, small int) []int {
		if uniform {
			k = 1
		}
		out := make([]int, nodes)
		for i := range out {
			out[i] = small
			if i%k == 0 {
				out[i] = large
			}
		}
		return out
	}
	// eff is the cluster's GPUs in 8-GPU nodes, what the streams' rates
	// are computed from.
	eff := func(gpus []int) int {
		c := Config{Nodes: nodes, NodeGPUs: gpus}
		return max(1, c.totalGPUs()/8)
	}
	cfg := func(o placer.PlanOptions, seed uint64, gpus []int, streams ...Stream) Config {
		return Config{Nodes: nodes, NodeGPUs: gpus, Plan: o, Streams: streams, Duration: d, Tick: SuiteTick, Seed: seed, From: d / 6}
	}
	half, quarter, dgx := sizes(2, 8, 4), sizes(4, 8, 4), sizes(4, 8, 2)
	hn, qn, dn := eff(half), eff(quarter), eff(dgx)
	shapes := []Shape{
		{Name: "mixed-steady", About: "half the machines 8-GPU, half 4-GPU; two users offering 45% each, DefaultMix", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, half, steady("u0", hn, 0.45), steady("u1", hn, 0.45))
		}},
		{Name: "mixed-8-vs-1-flood", About: "half the machines 8-GPU, half 4-GPU; one user asking only for 8-GPU sessions (40%, 60% of the large machines) against one flooding 1-GPU sessions (100%)", Build: func(o placer.PlanOptions, s uint64) Config {
			return cfg(o, s, half, only("big", hn, 0.4, Size{GPUs: 8}, Runtime{Mean: time.Hour}),
				only("small", hn, 1.0, Size{GPUs: 1}, Runtime{Mean: time.Hour}))
		}},
		{Name: "mixed-4-whole", About: "a quarter of the machines 8-GPU, the rest 4-GPU; 4-GPU sessions (40%) and 8-GPU sessions (15%, 38% of the large machines) against a 1-GPU flood (60%) over hours 4–16", Build: func(o placer.PlanOptions, s uint64) Config {
			f := only("flood", qn, 0.6, Size{GPUs: 1}, Runtime{Mean: time.Hour})
			f.Start, f.End = d/6, 2*d/3
			return cfg(o, s, quarter, only("four", qn, 0.4, Size{GPUs: 4}, Runtime{Mean: time.Hour}),
				only("eight", qn, 0.15, Size{GPUs: 8}, Runtime{Mean: 2 * time.Hour}), f)
		}},
		{Name: "mixed-workstations", About: "a quarter of the machines 8-GPU, the rest 2-GPU; two users offering 40% each in 1- and 2-GPU sessions (60:40) and one asking for 8-GPU sessions (20%, 35% of the large machines)", Build: func(o placer.PlanOptions, s uint64) Config {
			small := []Size{{GPUs: 1, Share: 0.6}, {GPUs: 2, Share: 0.4}}
			u := func(name string) Stream {
				return Stream{User: name, Sizes: small, Runtime: Runtime{Mean: time.Hour}, Rate: rate(dn, 0.4, meanGPUs(small), time.Hour)}
			}
			return cfg(o, s, dgx, u("u0"), u("u1"), only("big", dn, 0.2, Size{GPUs: 8}, Runtime{Mean: 2 * time.Hour}))
		}},
	}
	for i := range shapes {
		shapes[i].Nodes = nodes
	}
	return shapes
}
