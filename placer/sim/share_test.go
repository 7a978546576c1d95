package sim

import (
	"testing"

	"github.com/voyager-gpu/voyager/placer"
)

// TestFractionalNotebooks runs issue 35's workload (ShareSuite) at 16
// nodes, binpack and spread, seed 1: notebooks in fractions of a quarter
// of the nodes beside whole-GPU training, and the control where the same
// notebooks each take a whole GPU. At every pass no shared GPU breaks its
// rules (memory, one owner, nothing whole beside a fraction); fractions
// pack (more than two on a shared GPU in use, on average); the cluster
// holds more sessions at once than the control; and the training's 8-GPU
// requests wait no longer at p99 than in the control, where notebooks
// compete with them for whole GPUs.
func TestFractionalNotebooks(t *testing.T) {
	rows := RunSuite(ShareSuite(16, 1), defaultOptions(t), []placer.Strategy{placer.Binpack, placer.Spread}, []uint64{1})
	t.Logf("\n%s", ShareTable(rows))
	by := map[string]map[placer.Strategy]Result{}
	for _, row := range rows {
		if by[row.Shape.Name] == nil {
			by[row.Shape.Name] = map[placer.Strategy]Result{}
		}
		by[row.Shape.Name][row.Strategy] = row.Result
		if v := row.Result.Sharing; v.Violations > 0 {
			t.Errorf("%s %s: %d violations of shared GPUs' rules, first: %s", row.Shape.Name, row.Strategy, v.Violations, v.FirstViolation)
		}
	}
	for _, st := range []placer.Strategy{placer.Binpack, placer.Spread} {
		frac, whole := by["frac-notebooks"][st], by["frac-notebooks-whole"][st]
		if frac.Sharing.PerGPU <= 2 {
			t.Errorf("%s: %.2f fractions on a shared GPU in use on average; want them packed, more than 2", st, frac.Sharing.PerGPU)
		}
		if whole.Sharing.PerGPU != 0 {
			t.Errorf("%s: the control has fractions (%.2f per GPU)", st, whole.Sharing.PerGPU)
		}
		if frac.Sharing.Running <= whole.Sharing.Running {
			t.Errorf("%s: %.1f sessions running with fractions, %.1f without; want more with", st, frac.Sharing.Running, whole.Sharing.Running)
		}
		if f, w := frac.Wait["8"].P99, whole.Wait["8"].P99; f > w {
			t.Errorf("%s: 8-GPU p99 wait %.0f min with fractions, %.0f without; want no longer", st, f, w)
		}
	}
}
