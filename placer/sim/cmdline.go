package sim

import (
	"fmt"
	"strconv"
	"strings"
)

// SeedList is the seeds 1..n, as the suite commands (simsuite, simgap,
// simpower) run them.
func SeedList(n int) []uint64 {
	ss := make([]uint64, 0, n)
	for s := 1; s <= n; s++ {
		ss = append(ss, uint64(s))
	}
	return ss
}

// ParseSizes reads a comma-separated list of cluster sizes, such as
// "16,200,2000", each a positive number of nodes.
func ParseSizes(list string) ([]int, error) {
	var sizes []int
	for _, part := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(part))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("parse -nodes %q: want positive cluster sizes, comma-separated, such as 16,200", part)
		}
		sizes = append(sizes, n)
	}
	return sizes, nil
}

// Matching is the shapes whose name contains substr (all of them for "").
func Matching(shapes []Shape, substr string) []Shape {
	var out []Shape
	for _, sh := range shapes {
		if strings.Contains(sh.Name, substr) {
			out = append(out, sh)
		}
	}
	return out
}
