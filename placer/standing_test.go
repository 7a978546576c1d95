package placer

import (
	"fmt"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// TestTeamStandings: nlp (guarantee 8) holds 24 of 32 GPUs; vision
// (guarantee 8, 4 of them H100s) holds nothing and waits for 16. Down the
// tree each gets its guarantee and the other 16 split by weight: 16 each.
// nlp borrows 16; vision is owed 8. A team below a team counts in it.
func TestTeamStandings(t *testing.T) {
	var nodes []NodeView
	for i := 0; i < 3; i++ {
		nodes = append(nodes, teamRunning(view(gpuNode(fmt.Sprintf("n%d", i), 8, a100)), fmt.Sprintf("nlp-%d", i), "bob", "nlp-small", 0, 8))
	}
	nodes = append(nodes, view(gpuNode("h", 8, h100)))
	s := snap(nodes, teamReq("v1", "ada", "vision", 8, time.Minute), teamReq("v2", "ada", "vision", 8, time.Minute))
	s.Teams = state.NewTeamTree(withModels(team("vision", "", 8, 0), map[string]int{"H100": 4}), team("nlp", "", 8, 0), team("nlp-small", "nlp", 0, 0))
	got := map[string]TeamStanding{}
	var order []string
	for _, st := range TeamStandings(s) {
		got[st.Team] = st
		order = append(order, st.Team)
	}
	if fmt.Sprint(order) != "[nlp nlp-small vision]" {
		t.Fatalf("order %v, want each team before the teams below it, by name", order)
	}
	if v := got["vision"]; v.GuaranteeGPUs != 8 || v.GuaranteeModels["H100"] != 4 || v.FairShareGPUs != 16 || v.HeldGPUs != 0 || v.OwedGPUs != 8 || v.WaitingGPUs != 16 || v.BorrowedGPUs != 0 {
		t.Errorf("vision %+v, want guarantee 8 (4 H100), fair share 16, holds 0, owed 8, waits for 16", v)
	}
	if n := got["nlp"]; n.FairShareGPUs != 16 || n.HeldGPUs != 24 || n.BorrowedGPUs != 16 || n.OwedGPUs != 0 {
		t.Errorf("nlp %+v, want fair share 16, holds 24, 16 borrowed", n)
	}
	if n := got["nlp-small"]; n.HeldGPUs != 24 || n.Parent != "nlp" || n.BorrowedGPUs != 24 {
		t.Errorf("nlp-small %+v, want 24 held, all borrowed (no guarantee)", n)
	}
	if TeamStandings(snap(nodes)) != nil {
		t.Error("standings without teams, want nil")
	}
}
