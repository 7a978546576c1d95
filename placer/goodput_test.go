package placer

import (
	"math"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// amdahlReports are a job's reports at sizes, made by Amdahl's law with
// parallel fraction p and scale samples per second at one GPU.
func amdahlReports(p, scale float64, sizes ...int) []state.GoodputSample {
	var out []state.GoodputSample
	for _, n := range sizes {
		out = append(out, state.GoodputSample{GoodputReport: state.GoodputReport{Size: n,
			SamplesPerSecond: scale / ((1 - p) + p/float64(n))}, At: time.Unix(0, 0)})
	}
	return out
}

// TestCurveOfReports: Amdahl's law is fitted back from reports at two
// sizes or more, whatever their scale and with a statistical efficiency;
// one size, or none, is taken as linear.
func TestCurveOfReports(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []state.GoodputSample
		want    float64
	}{
		{"p 0.9 at 2 and 4 GPUs", amdahlReports(0.9, 137, 2, 4), 0.9},
		{"p 0.5 at 2, 3 and 8 GPUs", amdahlReports(0.5, 12000, 2, 3, 8), 0.5},
		{"p 0.99 at 1 and 8 GPUs", amdahlReports(0.99, 0.3, 1, 8), 0.99},
		{"one size: linear", amdahlReports(0.5, 100, 4), 1},
		{"none: linear", nil, 1},
		{"two sizes, one of zero throughput: linear", append(amdahlReports(0.5, 100, 4), state.GoodputSample{GoodputReport: state.GoodputReport{Size: 2}}), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := curveOf(tc.samples).p; math.Abs(got-tc.want) > 0.0015 {
				t.Errorf("parallel fraction %.3f, want %.3f", got, tc.want)
			}
		})
	}
	// Efficiency scales goodput: half the efficiency at 8 GPUs makes the
	// job scale worse than its samples per second say.
	s := amdahlReports(0.99, 100, 2, 8)
	s[1].Efficiency = 0.5
	if p := curveOf(s).p; p >= 0.9 {
		t.Errorf("with efficiency 0.5 at 8 GPUs: parallel fraction %.3f, want well below 0.99", p)
	}
}

// TestPlanElasticPrefersGoodput: with ElasticOptions.Goodput the idle GPUs
// of a node go to the job whose reports say they add the most, and a
// waiter is served by shrinking the job that loses the least; without
// reports, or without the option, the choice is size-blind.
func TestPlanElasticPrefersGoodput(t *testing.T) {
	n := func() NodeView { return view(gpuNode("n1", 8, "A100")) }
	poor := amdahlReports(0.5, 400, 2, 4)   // its 3rd GPU adds 0.17 of one
	linear := amdahlReports(0.99, 50, 2, 4) // nearly linear
	twoJobs := func(a, b []state.GoodputSample) map[string]ElasticJob {
		return map[string]ElasticJob{
			"a": {Session: "a", Min: 2, Max: 8, Ready: true, Goodput: a},
			"b": {Session: "b", Min: 2, Max: 8, Ready: true, Goodput: b},
		}
	}
	for _, tc := range []struct {
		name    string
		node    NodeView // n1; without job a, a second node n2 holds a at 7 GPUs
		queue   []Pending
		jobs    map[string]ElasticJob
		goodput bool
		want    map[string][2]int // session → from, to
	}{
		{"grows, size-blind: the idle GPUs to the first job", holdingAt(holdingAt(n(), "a", "alice", 0, 2), "b", "bob", 2, 2), nil,
			twoJobs(poor, linear), false, map[string][2]int{"a": {2, 6}}},
		{"grows with goodput: the idle GPUs to the job that scales", holdingAt(holdingAt(n(), "a", "alice", 0, 2), "b", "bob", 2, 2), nil,
			twoJobs(poor, linear), true, map[string][2]int{"b": {2, 6}}},
		{"grows with goodput, no reports: size-blind", holdingAt(holdingAt(n(), "a", "alice", 0, 2), "b", "bob", 2, 2), nil,
			twoJobs(nil, nil), true, map[string][2]int{"a": {2, 6}}},
		{"shrink, size-blind: the first job", holdingAt(holdingAt(n(), "a", "alice", 0, 4), "b", "bob", 4, 4),
			[]Pending{req("c", "carol", 2, time.Minute)}, twoJobs(linear, poor), false, map[string][2]int{"a": {4, 2}}},
		{"shrink with goodput: the job that loses the least", holdingAt(holdingAt(n(), "a", "alice", 0, 4), "b", "bob", 4, 4),
			[]Pending{req("c", "carol", 2, time.Minute)}, twoJobs(linear, poor), true, map[string][2]int{"b": {4, 2}}},
		{"shrink with goodput: a smaller shrink still first", holdingAt(n(), "b", "bob", 0, 8),
			[]Pending{req("c", "carol", 2, time.Minute)}, twoJobs(linear, poor), true, map[string][2]int{"a": {7, 6}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nodes := []NodeView{tc.node}
			if _, ok := tc.node.Ledger.Allocations["a"]; !ok {
				nodes = append(nodes, holdingAt(view(gpuNode("n2", 8, "A100")), "a", "alice", 0, 7))
			}
			s := snap(nodes, tc.queue...)
			rs := PlanElastic(s, NewPlan(s, PlanOptions{}), tc.jobs, ElasticOptions{Goodput: tc.goodput})
			got := map[string][2]int{}
			for _, r := range rs {
				got[r.Session] = [2]int{r.From, r.To}
			}
			if len(got) != len(tc.want) {
				t.Fatalf("resizes %v, want %v", got, tc.want)
			}
			for id, w := range tc.want {
				if got[id] != w {
					t.Fatalf("resizes %v, want %v", got, tc.want)
				}
			}
		})
	}
}
