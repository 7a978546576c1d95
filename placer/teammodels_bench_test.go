package placer

import (
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// BenchmarkNewPlanTeamModels is NewPlan at 2,000 nodes with 20,000
// queued (backlogSnapshot), a third of the nodes H100s and requests of
// either model or of any, owners in four teams of a tree, with guarantees
// by count ("count") and with guarantees by model ("models"), with no
// teams ("no-teams"), and with guarantees by count and no request naming
// a model ("count-any-model"): what per-model guarantees, and model
// patterns, cost a pass.
func BenchmarkNewPlanTeamModels(b *testing.B) {
	base := backlogSnapshot(2000, 20000)
	names := []string{"a1", "a2", "b", "c"}
	teamOf := func(owner string) string { return names[int(owner[len(owner)-1])%len(names)] }
	for _, models := range []bool{false, true} {
		s := *base
		s.Nodes = append([]NodeView(nil), base.Nodes...)
		for i := range s.Nodes {
			v := &s.Nodes[i]
			allocs := make(map[string]state.Allocation, len(v.Ledger.Allocations))
			for id, a := range v.Ledger.Allocations {
				a.Team = teamOf(a.Owner)
				allocs[id] = a
			}
			v.Ledger.Allocations = allocs
			if i%3 == 0 {
				gs := append([]state.GPU(nil), v.Node.GPUs...)
				for j := range gs {
					gs[j].Model = h100
				}
				v.Node.GPUs = gs
			}
		}
		s.Pending = append([]Pending(nil), base.Pending...)
		for i := range s.Pending {
			e := *s.Pending[i].Entry
			e.Team = teamOf(e.Owner)
			e.Request.GPUModel = []string{"", "*H100*", "*A100*"}[i%3]
			s.Pending[i].Entry = &e
		}
		s.Teams = state.NewTeamTree(team("a", "", 8000, 1), team("a1", "a", 4000, 2), team("a2", "a", 0, 1), team("b", "", 4000, 3), withMax(team("c", "", 0, 1), 6000))
		name := "count"
		if models {
			name = "models"
			s.Teams = state.NewTeamTree(team("a", "", 8000, 1), withModels(team("a1", "a", 4000, 2), map[string]int{"H100": 2000}), team("a2", "a", 0, 1),
				withModels(team("b", "", 4000, 3), map[string]int{"A100": 2000, "H100": 1000}), withMax(team("c", "", 0, 1), 6000))
		}
		if !models {
			b.Run("no-teams", func(b *testing.B) {
				nt := s
				nt.Teams = state.TeamTree{}
				nt.Cache = NewPlanCache()
				opt := PlanOptions{ReserveAfter: 10 * time.Minute}
				for b.Loop() {
					NewPlan(&nt, opt)
				}
			})
			b.Run("count-any-model", func(b *testing.B) {
				am := s
				am.Pending = append([]Pending(nil), s.Pending...)
				for i := range am.Pending {
					e := *am.Pending[i].Entry
					e.Request.GPUModel = ""
					am.Pending[i].Entry = &e
				}
				am.Cache = NewPlanCache()
				opt := PlanOptions{ReserveAfter: 10 * time.Minute}
				for b.Loop() {
					NewPlan(&am, opt)
				}
			})
		}
		b.Run(name, func(b *testing.B) {
			s.Cache = NewPlanCache()
			opt := PlanOptions{ReserveAfter: 10 * time.Minute}
			for b.Loop() {
				NewPlan(&s, opt)
			}
		})
	}
}
