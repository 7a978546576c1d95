package placer

// TeamStanding is where one team stands in the team tree of a snapshot
// (issue 36): what it is guaranteed, what the tree's fair share gives it
// given every team's demand now, what it holds and how much of that is
// borrowed. GPU figures count the team with the teams below it, as the
// order, reclaim and maxima count them, in GPUs (a fraction of a shared
// GPU as its share).
type TeamStanding struct {
	Team   string `json:"team"`
	Parent string `json:"parent,omitempty"`
	// GuaranteeGPUs is the team's guarantee; GuaranteeModels the part of
	// it named by GPU model.
	GuaranteeGPUs   int            `json:"guaranteeGPUs"`
	GuaranteeModels map[string]int `json:"guaranteeModels,omitempty"`
	// FairShareGPUs is the team's share of the cluster's GPUs down the
	// tree given what every team holds and waits for (the hold budgets'
	// water-filling: its guarantee first, as far as it asks, then by
	// weight, capped at its maximum); 0 for a team that holds and waits
	// for nothing.
	FairShareGPUs float64 `json:"fairShareGPUs"`
	// HeldGPUs is what the team's sessions hold now (the ledgers);
	// HeldModels what of it counts for each model of the tree's
	// guarantees.
	HeldGPUs   float64            `json:"heldGPUs"`
	HeldModels map[string]float64 `json:"heldModels,omitempty"`
	// BorrowedGPUs is what it holds beyond its guarantee; OwedGPUs what
	// it lacks of its guarantee while it has requests waiting (0 when it
	// waits for nothing).
	BorrowedGPUs float64 `json:"borrowedGPUs"`
	OwedGPUs     float64 `json:"owedGPUs"`
	// WaitingGPUs is what its queued requests ask for.
	WaitingGPUs float64 `json:"waitingGPUs"`
	// MaxGPUs is its own maximum, nil for none.
	MaxGPUs *int `json:"maxGPUs,omitempty"`
}

// TeamStandings is every team's standing in s, in the tree's order (each
// team before the teams below it, siblings by name); nil without teams.
// Pure, like NewPlan: the API's team view, its metrics and the CLI read
// the same numbers the placers plan with.
func TeamStandings(s *Snapshot) []TeamStanding {
	if len(s.Teams.Teams) == 0 {
		return nil
	}
	nodes := make([]*nodeState, len(s.Nodes))
	for i := range s.Nodes {
		nodes[i] = newNodeState(&s.Nodes[i])
	}
	u := newUsage(nodes, nil)
	tp := newTeamPlan(s, nodes, u.total, nil)
	tp.fair = map[string]int64{}
	weight := func(owner string) float64 {
		if q, ok := s.UserQuotas[owner]; ok && q.Weight != nil && *q.Weight > 0 {
			return *q.Weight
		}
		return 1
	}
	tp.entitle(u.total.gpus, s.Pending, u.shareRef, weight)
	waiting := map[string]int64{}
	for i := range s.Pending {
		e := s.Pending[i].Entry
		for _, t := range tp.path(e.Team) {
			waiting[t] += requestGPUs(e, u.shareRef)
		}
	}
	var out []TeamStanding
	var walk func(parent string)
	walk = func(parent string) {
		for _, n := range s.Teams.Children(parent) {
			t := s.Teams.Teams[n]
			held, g := tp.gpus(n), tp.guarantee(n)
			st := TeamStanding{Team: n, Parent: t.Parent, GuaranteeGPUs: t.Guarantee.GPUs, MaxGPUs: t.MaxGPUs,
				FairShareGPUs: milliToGPUs(tp.fair[n]), HeldGPUs: milliToGPUs(held), WaitingGPUs: milliToGPUs(waiting[n]),
				BorrowedGPUs: milliToGPUs(max(held-g, 0))}
			if waiting[n] > 0 {
				st.OwedGPUs = milliToGPUs(max(g-held, 0))
			}
			if len(t.Guarantee.Models) > 0 {
				st.GuaranteeModels = t.Guarantee.Models
			}
			if tp.models != nil {
				for k, h := range tp.models.held[n] {
					if h != 0 {
						if st.HeldModels == nil {
							st.HeldModels = map[string]float64{}
						}
						st.HeldModels[k] = milliToGPUs(h)
					}
				}
			}
			out = append(out, st)
			walk(n)
		}
	}
	walk("")
	return out
}

// milliToGPUs is m milli-GPUs in GPUs.
func milliToGPUs(m int64) float64 { return float64(m) / 1000 }
