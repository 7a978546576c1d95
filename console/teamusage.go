package console

import (
	"net/url"
	"sort"
	"time"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

// chartDays is how many days the team chart shows, today included.
const chartDays = 14

// Geometry of one team's chart, in SVG user units.
const (
	chartW, chartH = 560, 120
	chartTop       = 8
)

// teamChart is one team's GPU-hours per day (an SVG bar chart) against
// what its guarantee gives in a day (guarantee × 24 GPU-hours) and its
// budget spread over its period's days.
type teamChart struct {
	Team  string
	Bars  []chartBar
	Total float64
	// Guarantee and Budget are GPU-hours a day; 0: none. Their Y is
	// where their line is drawn.
	Guarantee, GuaranteeY float64
	Budget, BudgetY       float64
	// Max is the top of the scale.
	Max           float64
	Width, Height int
}

// chartBar is one day's bar.
type chartBar struct {
	Day        string
	Hours      float64
	X, Y, W, H float64
}

// teamCharts reads the last chartDays days of GPU-hours by team and day
// (the caller's own for a user, everyone's for an admin) and the teams,
// with where each team stands now (teamstanding.go).
func (c *Console) teamCharts(k *caller) ([]teamChart, []standingRow, error) {
	now := c.cfg.Now().UTC()
	today := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	from := today.AddDate(0, 0, 1-chartDays)
	q := url.Values{"by": {"team,day"}, "from": {state.DayOf(from)}, "to": {state.DayOf(today.AddDate(0, 0, 1))}}
	var rep api.UsageReport
	if err := k.call("GET", "/api/v1/usage?"+q.Encode(), nil, &rep); err != nil {
		return nil, nil, err
	}
	var teams api.TeamList
	if err := k.call("GET", "/api/v1/teams", nil, &teams); err != nil {
		return nil, nil, err
	}
	defs := map[string]state.Team{}
	for _, t := range teams.Items {
		defs[t.Name] = t
	}
	byTeam := map[string]map[string]float64{}
	for _, r := range rep.Rows {
		if byTeam[r.Team] == nil {
			byTeam[r.Team] = map[string]float64{}
		}
		byTeam[r.Team][r.Day] += r.GPUHours
	}
	names := make([]string, 0, len(byTeam))
	for n := range byTeam {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]teamChart, 0, len(names))
	slot := float64(chartW) / chartDays
	for _, n := range names {
		ch := teamChart{Team: n, Width: chartW, Height: chartH + 20}
		if t, ok := defs[n]; ok {
			ch.Guarantee = float64(t.Guarantee.GPUs) * 24
			if b := t.Budget; b != nil && b.GPUHours > 0 {
				start, next := api.PeriodStart(b.Period, now)
				ch.Budget = b.GPUHours / next.Sub(start).Hours() * 24
			}
		}
		ch.Max = max(ch.Guarantee, ch.Budget)
		for _, h := range byTeam[n] {
			ch.Max = max(ch.Max, h)
		}
		if ch.Max <= 0 {
			ch.Max = 1
		}
		ch.Max *= 1.1
		y := func(h float64) float64 { return chartTop + (chartH-chartTop)*(1-h/ch.Max) }
		for i := range chartDays {
			day := state.DayOf(from.AddDate(0, 0, i))
			h := byTeam[n][day]
			ch.Total += h
			ch.Bars = append(ch.Bars, chartBar{Day: day, Hours: h, X: float64(i)*slot + 2, W: slot - 4, Y: y(h), H: chartH - y(h)})
		}
		if ch.Guarantee > 0 {
			ch.GuaranteeY = y(ch.Guarantee)
		}
		if ch.Budget > 0 {
			ch.BudgetY = y(ch.Budget)
		}
		out = append(out, ch)
	}
	return out, standingRows(teams.Standing), nil
}
