package state_test

import (
	"strings"
	"testing"

	"github.com/voyager-gpu/voyager/state"
)

// TestGuaranteeModelMatches: a guarantee's model key names the models it
// equals, contains, or (with wildcards) matches as a pattern; a GPU counts
// for the first key in sorted order that names it; a bad pattern is
// refused by Validate with what would be right.
func TestGuaranteeModelMatches(t *testing.T) {
	for _, c := range []struct {
		key, model string
		want       bool
	}{
		{"NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3", true},
		{"H100", "NVIDIA H100 80GB HBM3", true},
		{"A100", "NVIDIA A100-SXM4-80GB", true},
		{"A100", "NVIDIA H100 80GB HBM3", false},
		{"*A100*80GB*", "NVIDIA A100-SXM4-80GB", true},
		{"*A100*40GB*", "NVIDIA A100-SXM4-80GB", false},
		{"H10?", "H100", true},
		{"", "H100", false},
	} {
		if got := state.GuaranteeModelMatches(c.key, c.model); got != c.want {
			t.Errorf("GuaranteeModelMatches(%q, %q) = %v, want %v", c.key, c.model, got, c.want)
		}
	}
	keys := []string{"A100", "A100-SXM4-80GB", "H100"}
	if got := state.GuaranteeModelOf(keys, "NVIDIA A100-SXM4-80GB"); got != "A100" {
		t.Errorf("an 80GB A100 counts for %q, want A100 (the first key naming it)", got)
	}
	if got := state.GuaranteeModelOf(keys, "NVIDIA L4"); got != "" {
		t.Errorf("an L4 counts for %q, want none", got)
	}
	tr := state.NewTeamTree(state.Team{Name: "a", Guarantee: state.TeamGuarantee{GPUs: 8, Models: map[string]int{"H100": 4, "A100": 0}}},
		state.Team{Name: "b", Guarantee: state.TeamGuarantee{GPUs: 8, Models: map[string]int{"L4": 2, "H100": 1}}})
	if got := strings.Join(tr.GuaranteeModelKeys(), ","); got != "H100,L4" {
		t.Errorf("the tree's model keys %q, want H100,L4 (none of 0 GPUs)", got)
	}
	bad := state.Team{Name: "a", Guarantee: state.TeamGuarantee{GPUs: 8, Models: map[string]int{"[H100": 4}}}
	if errs := bad.Validate(); len(errs) != 1 || !strings.Contains(errs[0], `guarantee.models: model "[H100": not a valid pattern`) {
		t.Errorf("a bad pattern: %v", errs)
	}
}
