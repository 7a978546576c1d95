package state

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestGoodputReportValidate: a report is refused, naming the field and
// what would be right, unless its size is the job's and its numbers are
// finite and in range.
func TestGoodputReportValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    GoodputReport
		size int
		want string // "" accepted; else a part of the error
	}{
		{"good", GoodputReport{Size: 4, SamplesPerSecond: 1200, Efficiency: 0.8}, 4, ""},
		{"no efficiency: 1", GoodputReport{Size: 4, SamplesPerSecond: 1200}, 4, ""},
		{"zero throughput", GoodputReport{Size: 4}, 4, ""},
		{"another size", GoodputReport{Size: 8, SamplesPerSecond: 1}, 4, "runs at 4 GPUs"},
		{"size 0", GoodputReport{SamplesPerSecond: 1}, 0, "size 0"},
		{"huge size", GoodputReport{Size: 1 << 20, SamplesPerSecond: 1}, 0, "1 to 4096"},
		{"negative", GoodputReport{Size: 4, SamplesPerSecond: -1}, 4, "samplesPerSecond"},
		{"NaN", GoodputReport{Size: 4, SamplesPerSecond: math.NaN()}, 4, "samplesPerSecond"},
		{"infinite", GoodputReport{Size: 4, SamplesPerSecond: math.Inf(1)}, 4, "samplesPerSecond"},
		{"efficiency above 1", GoodputReport{Size: 4, SamplesPerSecond: 1, Efficiency: 1.5}, 4, "efficiency"},
		{"efficiency NaN", GoodputReport{Size: 4, SamplesPerSecond: 1, Efficiency: math.NaN()}, 4, "efficiency"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Validate(tc.size)
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// TestMergePartsFoldsGoodput: a part's goodput report lands in the
// status's elastic record, one sample per size, the sizes seen before
// kept; the status merged from is not changed.
func TestMergePartsFoldsGoodput(t *testing.T) {
	now := time.Date(2026, 1, 5, 10, 0, 0, 0, time.UTC)
	spec := Session{ID: "j", Owner: "ada", Kind: KindBatch, Desired: DesiredRunning, Elastic: &Elastic{Min: 2, Max: 8}}
	old := []GoodputSample{{GoodputReport: GoodputReport{Size: 2, SamplesPerSecond: 100}, At: now.Add(-time.Hour)},
		{GoodputReport: GoodputReport{Size: 4, SamplesPerSecond: 150}, At: now.Add(-time.Hour)}}
	cur := Status{Session: "j", Phase: PhaseRunning, Elastic: &Elastic{Min: 2, Max: 8, Size: 4, Goodput: old}, Started: &now}
	report := GoodputSample{GoodputReport: GoodputReport{Size: 4, SamplesPerSecond: 190, Efficiency: 0.9}, At: now}
	part := PartStatus{Session: "j", Node: "n1", Role: RoleSingle, Phase: PhaseRunning, Started: &now,
		Activity: &Activity{Sampled: now, LastActive: now, Goodput: &report}}
	_, st, changed, err := MergeParts(spec, cur, []PartStatus{part}, now)
	if err != nil || !changed {
		t.Fatalf("merge: changed %v, %v", changed, err)
	}
	got := st.Elastic.Goodput
	if len(got) != 2 || got[0].Size != 2 || got[0].SamplesPerSecond != 100 || got[1].Size != 4 || got[1].SamplesPerSecond != 190 || got[1].Efficiency != 0.9 {
		t.Fatalf("status goodput %+v, want size 2 kept and size 4's new report", got)
	}
	if cur.Elastic.Goodput[1].SamplesPerSecond != 150 {
		t.Fatalf("the status merged from was changed: %+v", cur.Elastic.Goodput)
	}
	// At most MaxGoodputSizes sizes, the newest kept.
	var many []GoodputSample
	for i := 1; i <= MaxGoodputSizes+3; i++ {
		many = FoldGoodput(many, GoodputSample{GoodputReport: GoodputReport{Size: i, SamplesPerSecond: 1}, At: now.Add(time.Duration(i) * time.Minute)})
	}
	if len(many) != MaxGoodputSizes || many[0].Size != 4 || many[len(many)-1].Size != MaxGoodputSizes+3 {
		t.Fatalf("%d samples from size %d to %d, want %d from 4", len(many), many[0].Size, many[len(many)-1].Size, MaxGoodputSizes)
	}
}
