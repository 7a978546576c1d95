package rendezvous

import (
	"fmt"
	"testing"
)

// TestOwnerMovesOnlyTheLeaversShare: with a member gone, every name it
// did not own keeps its owner, and its own names spread over the rest.
func TestOwnerMovesOnlyTheLeaversShare(t *testing.T) {
	all := []string{"p1", "p2", "p3", "p4"}
	rest := []string{"p4", "p2", "p1"} // another order: the owner does not depend on it
	count := map[string]int{}
	moved := map[string]int{}
	for i := 0; i < 4000; i++ {
		name := fmt.Sprintf("node-%d", i)
		before, after := Owner(all, name), Owner(rest, name)
		count[before]++
		if before != "p3" && after != before {
			t.Fatalf("%s moved from %s to %s though p3 left, not its owner", name, before, after)
		}
		if before == "p3" {
			moved[after]++
		}
	}
	for _, m := range all {
		if count[m] < 800 || count[m] > 1200 {
			t.Errorf("%s owns %d of 4000 names, want about 1000: %v", m, count[m], count)
		}
	}
	for _, m := range rest {
		if moved[m] == 0 {
			t.Errorf("none of p3's names went to %s: %v", m, moved)
		}
	}
	if got := Owner(nil, "x"); got != "" {
		t.Errorf("Owner(nil) = %q, want \"\"", got)
	}
}
