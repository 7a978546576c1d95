package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestElasticFlags: --gpus and --nodes take a count or a range MIN-MAX;
// a range of nodes becomes the request's elastic minNodes and maxNodes
// (the API checks the numbers), and a malformed one is refused naming
// what to write.
func TestElasticFlags(t *testing.T) {
	parse := func(args ...string) (*specFlags, error) {
		var s specFlags
		cmd := &cobra.Command{Use: "x", RunE: func(*cobra.Command, []string) error { return nil }}
		s.register(cmd, true)
		return &s, cmd.ParseFlags(args)
	}
	for _, c := range []struct {
		args                      []string
		nodes, minNodes, maxNodes int
		min, max                  int
		err                       string
	}{
		{args: []string{"--nodes", "3", "--gpus", "2"}, nodes: 3},
		{args: []string{"--nodes", "1-3", "--gpus", "2"}, minNodes: 1, maxNodes: 3},
		{args: []string{"--gpus", "2-8"}, min: 2, max: 8},
		{args: []string{"--nodes", "1-3", "--gpus", "2-4"}, min: 2, max: 4, minNodes: 1, maxNodes: 3}, // both: the API refuses with why
		{args: []string{"--nodes", "x"}, err: "want a number of machines such as 2, or a range MIN-MAX"},
		{args: []string{"--nodes", "1-x"}, err: "want a range MIN-MAX such as 1-4"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			s, err := parse(c.args...)
			if c.err != "" {
				if err == nil || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("error %v, want one saying %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			r, err := s.request([]string{"train"})
			if err != nil {
				t.Fatal(err)
			}
			if r.Nodes != c.nodes {
				t.Errorf("nodes %d, want %d", r.Nodes, c.nodes)
			}
			el := r.Elastic
			if c.min == 0 && c.minNodes == 0 {
				if el != nil {
					t.Errorf("elastic %+v, want none", *el)
				}
				return
			}
			if el == nil || el.Min != c.min || el.Max != c.max || el.MinNodes != c.minNodes || el.MaxNodes != c.maxNodes {
				t.Errorf("elastic %+v, want min %d max %d minNodes %d maxNodes %d", el, c.min, c.max, c.minNodes, c.maxNodes)
			}
		})
	}
}
