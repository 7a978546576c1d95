package api

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// BudgetWarnPercent is the share of a budget past which a create is
// admitted with a warning (the Warning header, and the log).
const BudgetWarnPercent = 80

// lowestPriority is where a create over a "queue" budget goes.
const lowestPriority = -maxPriority

// budgetCheck is one budget that applies to a create: the team's or one
// of its ancestors', for the team as a whole or for the owner.
type budgetCheck struct {
	team     string // the team that sets the budget
	perUser  bool   // the owner's own budget in that team
	hours    float64
	used     float64
	resets   time.Time
	period   string
	action   string
	charged  string // the session's team
	ownerArg string
}

func (b budgetCheck) over() bool { return b.used >= b.hours }

func (b budgetCheck) percent() float64 { return 100 * b.used / b.hours }

// describe says whose budget it is and where it stands.
func (b budgetCheck) describe() string {
	whose := fmt.Sprintf("team %s", b.team)
	if b.team != b.charged {
		whose = fmt.Sprintf("team %s (above team %s)", b.team, b.charged)
	}
	if b.perUser {
		whose = fmt.Sprintf("%s in %s", b.ownerArg, whose)
	}
	return fmt.Sprintf("%s has used %.2f of its %g GPU-hours this %s (%.0f%%); the budget resets at %s",
		whose, b.used, b.hours, b.period, b.percent(), b.resets.Format(time.RFC3339))
}

// budgets returns every budget of team's path (team and the teams above
// it) that applies to owner, with what was used in its current period:
// a team's budget counts the team with every team below it; a per-user
// budget counts the owner's use in those teams.
func (a *API) budgets(ctx context.Context, tr state.TeamTree, team, owner string, now time.Time) ([]budgetCheck, error) {
	var out []budgetCheck
	byStart := map[time.Time][]usageSpan{} // one read per period start
	for _, name := range tr.Path(team) {
		b := tr.Teams[name].Budget
		if b == nil || (b.GPUHours <= 0 && b.UserGPUHours <= 0) {
			continue
		}
		period := b.Period
		if period == "" {
			period = state.PeriodMonth
		}
		start, next := PeriodStart(period, now)
		spans, ok := byStart[start]
		if !ok {
			var err error
			if spans, err = a.readUsage(ctx, usageWindow{from: start, to: next}, now); err != nil {
				return nil, err
			}
			byStart[start] = spans
		}
		sub := teamSubtree(tr, name)
		var teamMS, userMS int64
		for _, s := range spans {
			if !sub[s.team] {
				continue
			}
			if d, err := time.Parse(time.DateOnly, s.day); err != nil || d.Before(start) || !d.Before(next) {
				continue
			}
			teamMS += s.ms
			if s.user == owner {
				userMS += s.ms
			}
		}
		action := b.Action
		if action == "" {
			action = state.BudgetRefuse
		}
		base := budgetCheck{team: name, resets: next, period: period, action: action, charged: team, ownerArg: owner}
		if b.GPUHours > 0 {
			c := base
			c.hours, c.used = b.GPUHours, float64(teamMS)/3.6e6
			out = append(out, c)
		}
		if b.UserGPUHours > 0 {
			c := base
			c.perUser, c.hours, c.used = true, b.UserGPUHours, float64(userMS)/3.6e6
			out = append(out, c)
		}
	}
	return out, nil
}

// budgetDecision applies the budgets to a create: refused (the problem's
// message), or admitted at the lowest priority, or admitted with
// warnings.
type budgetDecision struct {
	refuse   []string
	lowered  []string
	warnings []string
}

func decideBudgets(checks []budgetCheck) budgetDecision {
	var d budgetDecision
	for _, b := range checks {
		switch {
		case b.over() && b.action == state.BudgetQueue:
			d.lowered = append(d.lowered, b.describe())
		case b.over():
			d.refuse = append(d.refuse, b.describe())
		case b.percent() >= BudgetWarnPercent:
			d.warnings = append(d.warnings, b.describe())
		}
	}
	return d
}

// warningHeader is an RFC 9111 Warning header value (code 299,
// "miscellaneous persistent warning") that clients such as the CLI print.
func warningHeader(msg string) string {
	return `299 voyager "` + strings.ReplaceAll(msg, `"`, `'`) + `"`
}
