package placer

import (
	"fmt"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

func heldBy(p *Plan) map[string]int {
	out := map[string]int{}
	for _, d := range p.Bound {
		for _, pp := range d.Parts {
			out[d.Pending.Entry.Owner] += len(pp.Devices)
		}
	}
	return out
}

// TestWeightedFairShare: on an empty 32-GPU cluster with more 1-GPU
// requests than GPUs from each owner, a user of weight 3 ends the pass
// with three times the GPUs of a user of weight 1; and a group of weight 3
// gets three quarters between its members, against one user of weight 1.
func TestWeightedFairShare(t *testing.T) {
	nodes := []NodeView{}
	for i := 0; i < 4; i++ {
		nodes = append(nodes, view(gpuNode(fmt.Sprintf("n%d", i), 8, "A100")))
	}
	three, one := 3.0, 1.0
	t.Run("users", func(t *testing.T) {
		s := snap(nodes)
		for i := 0; i < 40; i++ {
			s.Pending = append(s.Pending, req(fmt.Sprintf("a%02d", i), "ada", 1, time.Duration(i)*time.Second),
				req(fmt.Sprintf("b%02d", i), "bob", 1, time.Duration(i)*time.Second))
		}
		s.UserQuotas = map[string]state.Quota{"ada": {Weight: &three}, "bob": {Weight: &one}}
		got := heldBy(NewPlan(s, PlanOptions{ReserveAfter: 10 * time.Minute}))
		if got["ada"] != 24 || got["bob"] != 8 {
			t.Errorf("GPUs bound ada %d, bob %d; want 24 and 8 (weights 3 and 1)", got["ada"], got["bob"])
		}
		s.UserQuotas = nil
		got = heldBy(NewPlan(s, PlanOptions{}))
		if got["ada"] != 16 || got["bob"] != 16 {
			t.Errorf("without weights: ada %d, bob %d; want 16 each", got["ada"], got["bob"])
		}
	})
	t.Run("groups", func(t *testing.T) {
		s := snap(nodes)
		for i := 0; i < 40; i++ {
			for _, u := range []string{"cy", "di", "ed"} {
				p := req(fmt.Sprintf("%s%02d", u, i), u, 1, time.Duration(i)*time.Second)
				if u != "ed" {
					p.Entry.Groups = []string{"vision"}
				}
				s.Pending = append(s.Pending, p)
			}
		}
		s.GroupQuotas = map[string]state.Quota{"vision": {Weight: &three}}
		got := heldBy(NewPlan(s, PlanOptions{}))
		if got["cy"]+got["di"] != 24 || got["ed"] != 8 {
			t.Errorf("GPUs bound cy %d + di %d (group vision, weight 3), ed %d; want 24 and 8", got["cy"], got["di"], got["ed"])
		}
		if got["cy"] != 12 {
			t.Errorf("cy %d, di %d: want the group's 24 split evenly", got["cy"], got["di"])
		}
	})
}
