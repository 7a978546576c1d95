package sim

import "sort"

// Baselines that tell where a gap to the optimum comes from (gap.go).

// OnlineFCFS is the schedule of a planner that knows nothing of the
// future: at every pass the waiting jobs in arrival order, each started
// at once on the fullest nodes it fits if any (backfill without
// reservations, holds or fair share). Its gap to the optimum is what
// knowing run times and arrivals in advance is worth to the optimum; the
// planner's gap to it is what the planner's policy (fair share, holds)
// costs or gains. It may break the fair-share slack.
func (in *Instance) OnlineFCFS() (Schedule, Objectives) {
	nj := len(in.Jobs)
	order := make([]int, nj)
	for j := range order {
		order[j] = j
	}
	sort.SliceStable(order, func(a, b int) bool { return in.Jobs[order[a]].Arrive < in.Jobs[order[b]].Arrive })
	prof := newProfile(in)
	s := Schedule{Start: make([]int, nj), Nodes: make([][]int, nj)}
	for j := range s.Start {
		s.Start[j] = -1
	}
	var fit []int
	sum := 0.0
	for k := 0; k < in.Passes; k++ {
		for _, j := range order {
			jb := &in.Jobs[j]
			if jb.Release > k || s.Start[j] >= 0 {
				continue
			}
			fit = fit[:0]
			for n := 0; n < in.Nodes; n++ {
				if prof.used[n][k]+jb.GPUs <= in.GPUsPerNode {
					fit = append(fit, n)
				}
			}
			if len(fit) < jb.Parts {
				continue
			}
			sort.SliceStable(fit, func(a, b int) bool { return prof.used[fit[a]][k] > prof.used[fit[b]][k] })
			nodes := append([]int(nil), fit[:jb.Parts]...)
			s.Start[j], s.Nodes[j] = k, nodes
			prof.add(jb, nodes, k, 1)
		}
	}
	for j := range in.Jobs {
		sum += in.waitOf(&in.Jobs[j], s.Start[j])
	}
	o := Objectives{Wait: sum / float64(max(nj, 1))}
	o.Machines, o.Stranded = in.occupancy(s, prof.used)
	return s, o
}

// ClairvoyantFCFS is the serial scheme in arrival order with best fit:
// first come, first served, each job reserved the first pass its GPUs
// are free on what the jobs before it hold, and later jobs backfilled
// into the gaps, all with exact run times (conservative backfilling with
// perfect estimates). It may break the fair-share slack.
func (in *Instance) ClairvoyantFCFS() (Schedule, Objectives) {
	g := &genome{prio: make([]float64, len(in.Jobs)), pick: make([]float64, len(in.Jobs))}
	for j := range in.Jobs {
		g.prio[j] = float64(in.Jobs[j].Arrive) + float64(j)*1e-3
	}
	in.decode(g)
	return g.sched, g.obj
}
