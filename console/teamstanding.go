package console

import (
	"github.com/voyager-gpu/voyager/api"
)

// Where each team stands now (issue 36), beside its GPU-hours chart on
// the history page: a row per team with what it holds against its
// guarantee and its fair share down the tree, what it borrows or is owed,
// and the reclaims under way — GET /api/v1/teams' standing, the numbers
// the placers plan with and `voyager team list` prints.

// Geometry of a standing row's bar, in SVG user units.
const standW, standH = 320, 18

// standingRow is one team's row: its standing and the bar drawn for it,
// held as a bar and the guarantee and fair share as marks, on a scale up
// to the largest of the three over every team (Scale).
type standingRow struct {
	api.TeamStandingView
	// Depth is the team's depth in the tree (0 for a root).
	Depth int
	// HeldW is the held bar's width; GuaranteeX and FairX the marks'
	// positions; BorrowedX where the part beyond the guarantee starts.
	HeldW, GuaranteeX, FairX float64
	Width, Height            int
}

// standingRows lays out the standing of list, in its tree order.
func standingRows(list []api.TeamStandingView) []standingRow {
	scale := 1.0
	for _, s := range list {
		scale = max(scale, s.HeldGPUs, float64(s.GuaranteeGPUs), s.FairShareGPUs)
	}
	x := func(g float64) float64 { return 2 + (standW-4)*g/scale }
	depth := map[string]int{}
	out := make([]standingRow, 0, len(list))
	for _, s := range list {
		d := 0
		if s.Parent != "" {
			d = depth[s.Parent] + 1
		}
		depth[s.Team] = d
		out = append(out, standingRow{TeamStandingView: s, Depth: d, Width: standW, Height: standH,
			HeldW: x(s.HeldGPUs) - 2, GuaranteeX: x(float64(s.GuaranteeGPUs)), FairX: x(s.FairShareGPUs)})
	}
	return out
}
