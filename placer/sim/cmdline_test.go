package sim

import (
	"slices"
	"testing"
)

func TestCommandLineHelpers(t *testing.T) {
	if got := SeedList(3); !slices.Equal(got, []uint64{1, 2, 3}) {
		t.Errorf("SeedList(3) = %v, want [1 2 3]", got)
	}
	if got, err := ParseSizes("16, 200,2000"); err != nil || !slices.Equal(got, []int{16, 200, 2000}) {
		t.Errorf("ParseSizes = %v, %v; want [16 200 2000]", got, err)
	}
	for _, bad := range []string{"", "16,", "0", "x", "-4"} {
		if _, err := ParseSizes(bad); err == nil {
			t.Errorf("ParseSizes(%q) took it, want an error", bad)
		}
	}
	shapes := []Shape{{Name: "flood-drain"}, {Name: "steady-90"}, {Name: "adv-flood"}}
	var names []string
	for _, sh := range Matching(shapes, "flood") {
		names = append(names, sh.Name)
	}
	if !slices.Equal(names, []string{"flood-drain", "adv-flood"}) {
		t.Errorf("Matching(flood) = %v", names)
	}
	if len(Matching(shapes, "")) != 3 {
		t.Errorf("Matching(\"\") dropped shapes")
	}
}
