package api

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// usageFields are the parts of a session spec that charge its running
// attempt: decoded into the runtimes cache beside its limits.
type usageFields struct {
	Owner     string `json:"owner"`
	Team      string `json:"team"`
	Resources struct {
		GPUs int `json:"gpus"`
	} `json:"resources"`
	Ray *struct {
		Workers         int `json:"workers"`
		WorkerResources *struct {
			GPUs int `json:"gpus"`
		} `json:"workerResources"`
	} `json:"ray"`
	Nodes int `json:"nodes"`
}

// gpus is what state.SessionGPUs says of the whole spec.
func (u usageFields) gpus() int {
	n := u.Resources.GPUs
	switch {
	case u.Nodes > 1:
		n *= u.Nodes
	case u.Ray != nil:
		w := u.Resources.GPUs
		if u.Ray.WorkerResources != nil {
			w = u.Ray.WorkerResources.GPUs
		}
		n += u.Ray.Workers * w
	}
	return n
}

// UsageRow is GPU-time of one group of a usage report: the fields its
// grouping names are set.
type UsageRow struct {
	Team string `json:"team,omitempty"`
	User string `json:"user,omitempty"`
	// Day is a UTC date, "2026-11-28".
	Day string `json:"day,omitempty"`
	// GPUSeconds is the GPU-time in seconds (to the millisecond);
	// GPUHours the same in hours.
	GPUSeconds float64 `json:"gpuSeconds"`
	GPUHours   float64 `json:"gpuHours"`
}

// UsageReport is GET /api/v1/usage: GPU-time within [From, To) grouped
// by By, from the attempts counted (gpuhours/) and those running now.
type UsageReport struct {
	From time.Time `json:"from"`
	To   time.Time `json:"to"`
	// By is the grouping: some of "team", "user", "day", in that order.
	By   []string   `json:"by"`
	Rows []UsageRow `json:"rows"`
	// Total is the sum of the rows.
	Total UsageRow `json:"total"`
}

// usageSpan is the GPU-time of one subject in one day.
type usageSpan struct {
	team, user, day string
	ms              int64
}

// usageWindow is a half-open time range [from, to).
type usageWindow struct{ from, to time.Time }

// readUsage returns the GPU-time of every (team, owner, day) within w:
// the daily records of the attempts counted, and the running attempts'
// time from their bind to now (from the status and spec caches). An
// attempt that ended but is not counted yet (the accountant's lag, well
// under a second) is in neither.
func (a *API) readUsage(ctx context.Context, w usageWindow, now time.Time) ([]usageSpan, error) {
	var out []usageSpan
	first, last := w.from.UTC().Truncate(24*time.Hour), w.to.UTC().Add(-time.Millisecond)
	resp, err := a.cli.Get(ctx, a.keys.GPUHoursDir()+state.DayOf(first),
		clientv3.WithRange(a.keys.GPUHoursDir()+state.DayOf(last)+"\x00"))
	if err != nil {
		return nil, fmt.Errorf("read gpu-hours: %w", err)
	}
	for _, kv := range resp.Kvs {
		d, err := state.Decode[state.UsageDay](kv.Value)
		if err != nil {
			continue
		}
		for subj, ms := range d.GPUMilliseconds {
			team, user := state.SplitUsageSubject(subj)
			out = append(out, usageSpan{team: team, user: user, day: d.Day, ms: ms})
		}
	}
	specs := a.runtimes.Snapshot()
	a.status.Snapshot().RangeShared(func(it *watcher.Item[state.Status]) bool {
		st := it.Value
		if !state.BoundPhase(st.Phase) || st.Bound == nil {
			return true
		}
		sl, ok := specs.Get(a.keys.Session(st.Session))
		if !ok {
			return true
		}
		from, to := maxTime(*st.Bound, w.from), minTime(now, w.to)
		gpus := sl.gpus()
		if n := state.ElasticSize(&st); n > 0 {
			gpus = n // an elastic job's attempt at the size it was bound at, as the accountant counts it
		}
		for day, ms := range state.SplitByDay(gpus, from, to) {
			out = append(out, usageSpan{team: sl.Team, user: sl.Owner, day: day, ms: ms})
		}
		return true
	})
	return out, nil
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// PeriodStart returns the start of the budget period (state.PeriodMonth,
// PeriodWeek, PeriodDay) that holds t, and the start of the next one, in
// UTC.
func PeriodStart(period string, t time.Time) (time.Time, time.Time) {
	t = t.UTC()
	day := time.Date(t.Year(), t.Month(), t.Day(), 0, 0, 0, 0, time.UTC)
	switch period {
	case state.PeriodDay:
		return day, day.AddDate(0, 0, 1)
	case state.PeriodWeek:
		start := day.AddDate(0, 0, -((int(day.Weekday()) + 6) % 7)) // Monday
		return start, start.AddDate(0, 0, 7)
	}
	start := time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
	return start, start.AddDate(0, 1, 0)
}

// parseUsageWindow reads ?period= (month, week, day: the current one) or
// ?from=&to= (UTC dates; to exclusive, default tomorrow); the default is
// this month.
func parseUsageWindow(c *gin.Context, now time.Time) (usageWindow, []FieldError) {
	var errs []FieldError
	from, to := PeriodStart(state.PeriodMonth, now)
	if p := c.Query("period"); p != "" {
		switch p {
		case state.PeriodMonth, state.PeriodWeek, state.PeriodDay:
			from, to = PeriodStart(p, now)
		default:
			errs = append(errs, FieldError{Field: "period", Message: fmt.Sprintf("got %q, want month, week or day (the current one), or from and to", truncate(p, 32))})
		}
	}
	date := func(field string, dst *time.Time) {
		if v := c.Query(field); v != "" {
			t, err := time.Parse(time.DateOnly, v)
			if err != nil {
				errs = append(errs, FieldError{Field: field, Message: fmt.Sprintf("got %q, want a date such as 2026-11-01 (UTC)", truncate(v, 32))})
				return
			}
			*dst = t
		}
	}
	if c.Query("from") != "" || c.Query("to") != "" {
		if c.Query("period") != "" {
			errs = append(errs, FieldError{Field: "period", Message: "give period or from and to, not both"})
		}
		to = time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
		date("from", &from)
		date("to", &to)
	}
	if len(errs) == 0 && !from.Before(to) {
		errs = append(errs, FieldError{Field: "to", Message: fmt.Sprintf("%s is not after from (%s)", state.DayOf(to), state.DayOf(from))})
	}
	if len(errs) == 0 && to.Sub(from) > 3700*24*time.Hour {
		errs = append(errs, FieldError{Field: "from", Message: "a report covers at most ten years"})
	}
	return usageWindow{from: from, to: to}, errs
}

func (a *API) usageReport(c *gin.Context) {
	p := principalOf(c)
	now := a.cfg.Now().UTC()
	w, errs := parseUsageWindow(c, now)
	by := []string{"team", "user"}
	if v := c.Query("by"); v != "" {
		by = nil
		for _, f := range strings.Split(v, ",") {
			switch f = strings.TrimSpace(f); f {
			case "team", "user", "day":
				if !slices.Contains(by, f) {
					by = append(by, f)
				}
			default:
				errs = append(errs, FieldError{Field: "by", Message: fmt.Sprintf("got %q, want a comma-separated list of team, user and day", truncate(f, 32))})
			}
		}
	}
	if len(errs) > 0 {
		a.invalid(c, "Invalid request", errs)
		return
	}
	order := []string{"team", "user", "day"}
	slices.SortFunc(by, func(x, y string) int { return slices.Index(order, x) - slices.Index(order, y) })
	userFilter, teamFilter := c.Query("user"), c.Query("team")
	if !p.Admin {
		// Others' use is theirs: a user reads her own.
		if userFilter != "" && userFilter != p.Subject {
			a.problem(c, http.StatusForbidden, "Forbidden", "only admins read other users' usage; leave user out to read yours")
			return
		}
		userFilter = p.Subject
	}
	var subtree map[string]bool
	if teamFilter != "" {
		tr, err := state.ReadTeams(c.Request.Context(), a.cli, a.keys)
		if err != nil {
			a.internal(c, "read teams", err)
			return
		}
		subtree = teamSubtree(tr, teamFilter)
	}
	spans, err := a.readUsage(c.Request.Context(), w, now)
	if err != nil {
		a.internal(c, "read usage", err)
		return
	}
	groups := map[UsageRow]int64{}
	var total int64
	for _, s := range spans {
		if (userFilter != "" && s.user != userFilter) || (subtree != nil && !subtree[s.team]) {
			continue
		}
		var key UsageRow
		for _, f := range by {
			switch f {
			case "team":
				key.Team = cmpOrDash(s.team)
			case "user":
				key.User = s.user
			case "day":
				key.Day = s.day
			}
		}
		groups[key] += s.ms
		total += s.ms
	}
	out := UsageReport{From: w.from, To: w.to, By: by, Rows: []UsageRow{}, Total: usageRow(UsageRow{}, total)}
	for k, ms := range groups {
		out.Rows = append(out.Rows, usageRow(k, ms))
	}
	sort.Slice(out.Rows, func(i, j int) bool {
		x, y := out.Rows[i], out.Rows[j]
		if x.Team != y.Team {
			return x.Team < y.Team
		}
		if x.User != y.User {
			return x.User < y.User
		}
		return x.Day < y.Day
	})
	c.JSON(http.StatusOK, out)
}

// cmpOrDash names the absent team "-" in reports.
func cmpOrDash(team string) string {
	if team == "" {
		return "-"
	}
	return team
}

func usageRow(k UsageRow, ms int64) UsageRow {
	k.GPUSeconds = float64(ms) / 1000
	k.GPUHours = float64(ms) / 3.6e6
	return k
}

// teamSubtree is name and every team below it.
func teamSubtree(tr state.TeamTree, name string) map[string]bool {
	out := map[string]bool{name: true}
	for changed := true; changed; {
		changed = false
		for n, t := range tr.Teams {
			if out[t.Parent] && !out[n] {
				out[n], changed = true, true
			}
		}
	}
	return out
}

// The usage route in the OpenAPI document (TestOpenAPICoversEveryRoute).
func init() {
	operations = append(operations, operation{method: "GET", path: "/api/v1/usage",
		summary: "GPU-hours used within a period, grouped by team, user and day: the attempts the usage accountant counted when they ended (gpuhours/), and the running ones up to now. A user reads her own; admins read everyone's.",
		access:  "user", response: UsageReport{}, status: 200,
		params: []param{{"query", "period", "month (the default), week or day: the current one"}, {"query", "from", "first UTC date, 2026-11-01 (instead of period)"},
			{"query", "to", "UTC date after the last (default: tomorrow)"}, {"query", "by", "grouping: a comma-separated list of team, user, day (default team,user)"},
			{"query", "team", "only this team and the teams below it"}, {"query", "user", "only this user (admins)"}}})
}
