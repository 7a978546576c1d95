package api

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/gin-gonic/gin"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/voyager-gpu/voyager/state"
)

// TeamList is GET /api/v1/teams: every team, by name, and the caller's
// own membership.
type TeamList struct {
	Items []state.Team `json:"items"`
	// Mine is which teams the caller belongs to and which one her
	// sessions go to unless she names another (the team field of a create).
	Mine state.Membership `json:"mine"`
	// Standing is where each team stands now, in tree order
	// (teamstanding.go); absent before the API's caches have listed.
	Standing []TeamStandingView `json:"standing,omitempty"`
}

// teamRoutes adds the team routes: reading to every caller (the hub's
// service token acting for a user too), writing to admins.
func (a *API) teamRoutes(read, admin *gin.RouterGroup) {
	read.GET("/teams", a.listTeams)
	read.GET("/teams/:name", a.getTeam)
	admin.PUT("/teams/:name", a.putTeam)
	admin.DELETE("/teams/:name", a.deleteTeam)
}

func (a *API) listTeams(c *gin.Context) {
	p := principalOf(c)
	tr, err := state.ReadTeams(c.Request.Context(), a.cli, a.keys)
	if err != nil {
		a.internal(c, "list teams", err)
		return
	}
	out := TeamList{Items: []state.Team{}, Mine: tr.MembershipOf(p.Subject, p.Groups)}
	for _, n := range tr.Names() {
		out.Items = append(out.Items, tr.Teams[n])
	}
	if out.Mine.Teams == nil {
		out.Mine.Teams = []string{}
	}
	out.Standing = a.teamStandings(c.Request.Context())
	c.JSON(http.StatusOK, out)
}

func (a *API) getTeam(c *gin.Context) {
	name := c.Param("name")
	notFound := func() {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no team %q; GET /api/v1/teams lists them", truncate(name, 64)))
	}
	if state.ValidateName("team", name) != nil {
		notFound()
		return
	}
	t, _, err := state.Get[state.Team](c.Request.Context(), a.cli, a.keys.Team(name))
	switch {
	case errors.Is(err, state.ErrNotFound):
		notFound()
	case err != nil:
		a.internal(c, "read team", err)
	default:
		t.Name = name
		c.JSON(http.StatusOK, t)
	}
}

// teamWriteAttempts bounds how often a team write is retried when
// another admin's write changed the tree between its read and its write.
const teamWriteAttempts = 5

func (a *API) putTeam(c *gin.Context) {
	name, ok := a.pathName(c, "team")
	if !ok {
		return
	}
	var t state.Team
	if !a.decodeTeam(c, name, &t) { // teamguarantee.go
		return
	}
	if t.Name != "" && t.Name != name {
		a.invalid(c, "Invalid request", []FieldError{{Field: "name", Message: fmt.Sprintf("got %q, want %q (the name in the path) or empty", t.Name, name)}})
		return
	}
	t.Name, t.By, t.Updated = name, principalOf(c).Subject, a.cfg.Now().UTC()
	ctx := c.Request.Context()
	err := a.writeTeams(c, func(tr state.TeamTree) error {
		_, err := state.PutTeam(ctx, a.cli, a.keys, tr, t)
		return err
	})
	if errors.Is(err, errAnswered) {
		return
	}
	if probs, ok := state.IsTeamError(err); ok {
		a.invalid(c, "Invalid team", teamFieldErrors(probs))
		return
	}
	if err != nil {
		a.internal(c, "write team", err)
		return
	}
	a.log.Info("team defined", "team", name, "parent", t.Parent, "guaranteeGPUs", t.Guarantee.GPUs, "by", t.By)
	c.JSON(http.StatusOK, t)
}

// errAnswered is what writeTeams returns when it answered the request
// itself.
var errAnswered = errors.New("answered")

// writeTeams runs write against the team tree as read now; while write
// fails with state.ErrConflict (another admin's write came between the
// read and the write, which compares the whole tree it was checked on) it
// reads again and retries, teamWriteAttempts times at most. It returns
// write's error, or errAnswered when it answered itself (a failed read:
// 500; the tree changed on every attempt: 409).
func (a *API) writeTeams(c *gin.Context, write func(state.TeamTree) error) error {
	for range teamWriteAttempts {
		tr, err := state.ReadTeams(c.Request.Context(), a.cli, a.keys)
		if err != nil {
			a.internal(c, "read teams", err)
			return errAnswered
		}
		if err := write(tr); !errors.Is(err, state.ErrConflict) {
			return err
		}
	}
	a.problem(c, http.StatusConflict, "Conflict", "the teams kept changing on every attempt to write them; send the request again")
	return errAnswered
}

func (a *API) deleteTeam(c *gin.Context) {
	name := c.Param("name")
	if state.ValidateName("team", name) != nil {
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no team %q", truncate(name, 64)))
		return
	}
	ctx := c.Request.Context()
	err := a.writeTeams(c, func(tr state.TeamTree) error {
		_, err := state.DeleteTeam(ctx, a.cli, a.keys, tr, name)
		return err
	})
	switch probs, isTeam := state.IsTeamError(err); {
	case errors.Is(err, errAnswered):
	case errors.Is(err, state.ErrNotFound):
		a.problem(c, http.StatusNotFound, "Not found", fmt.Sprintf("no team %q", name))
	case isTeam:
		a.problem(c, http.StatusConflict, "Team in use", strings.Join(probs, "; "))
	case err != nil:
		a.internal(c, "delete team", err)
	default:
		a.log.Info("team deleted", "team", name, "by", principalOf(c).Subject)
		c.Status(http.StatusNoContent)
	}
}

// teamFieldErrors turns "team T: field: message" problems into field
// errors named "teams.T.field".
func teamFieldErrors(probs []string) []FieldError {
	out := make([]FieldError, 0, len(probs))
	for _, p := range probs {
		field, msg := "teams", p
		if rest, ok := strings.CutPrefix(p, "team "); ok {
			if name, r, ok := strings.Cut(rest, ": "); ok {
				field = "teams." + name
				if f, m, ok := strings.Cut(r, ": "); ok && !strings.Contains(f, " ") {
					field += "." + f
					r = m
				}
				msg = r
			}
		}
		out = append(out, FieldError{Field: field, Message: msg})
	}
	return out
}

// admitTeam charges s to its owner's team (asked, else her default one),
// holds its priority to the team's maximum unless p is an admin, and
// applies the budgets of the team and the teams above it. It
// returns the compares that keep the create to the definitions it read
// (the team and those above it), or answers the problem and returns
// false.
func (a *API) admitTeam(c *gin.Context, p Principal, asked string, s *state.Session) ([]clientv3.Cmp, bool) {
	tr, err := state.ReadTeams(c.Request.Context(), a.cli, a.keys)
	if err != nil {
		a.internal(c, "read teams", err)
		return nil, false
	}
	if len(tr.Teams) == 0 && asked == "" {
		return nil, true // no teams: today's behaviour
	}
	name, err := tr.TeamFor(p.Subject, p.Groups, asked)
	if err != nil {
		a.invalid(c, "Invalid request", []FieldError{{Field: "team", Message: err.Error()}})
		return nil, false
	}
	s.Team = name
	if name == "" {
		// Teams exist, none is hers and there is no default: the create
		// goes on uncharged to any team, as before teams.
		return nil, true
	}
	if maxp, by := tr.MaxPriority(name); s.Priority > maxp && !p.Admin {
		from := fmt.Sprintf("team %s's maximum", name)
		if by != name {
			from = fmt.Sprintf("the maximum team %s inherits from team %s", name, by)
		}
		a.invalid(c, "Priority above the team's maximum", []FieldError{{Field: "priority", Message: fmt.Sprintf("got %d, above %d, %s; ask for %d or less, or ask an admin", s.Priority, maxp, from, maxp)}})
		return nil, false
	}
	if !a.admitBudgets(c, tr, name, p.Subject, s) {
		return nil, false
	}
	var guards []clientv3.Cmp
	for _, n := range tr.Path(name) {
		guards = append(guards, clientv3.Compare(clientv3.ModRevision(a.keys.Team(n)), "=", tr.Revs[n]))
	}
	return guards, true
}

// The team routes in the OpenAPI document (TestOpenAPICoversEveryRoute).
func init() {
	name := []param{{"path", "name", "team name"}}
	operations = append(operations,
		operation{method: "GET", path: "/api/v1/teams", summary: "Every team (teams/<name>: parent, who belongs, guarantee, weight, maximum GPUs, maximum priority, budget) and the caller's membership: her teams and the one her sessions go to unless a create names another; and where each team stands now (standing: guarantee, fair share down the tree, held, borrowed, owed, the reclaims under way).", access: "user or service", response: TeamList{}, status: 200},
		operation{method: "GET", path: "/api/v1/teams/{name}", summary: "One team.", access: "user or service", response: state.Team{}, status: 200, params: name},
		operation{method: "PUT", path: "/api/v1/teams/{name}", summary: "Define or replace a team, live. Refused with 422, each problem named (teams.<team>.<field>), when the tree it makes is invalid: an unknown parent, a cycle, children guaranteed more than their parent (in all or per model), a maximum or maximum priority above the parent's, a group named by two teams, two default teams, a guarantee of another shape than {\"gpus\": N, \"models\": {\"MODEL\": N}} or with negative counts, models beyond gpus or a bad model pattern.", access: "admin", request: state.Team{}, response: state.Team{}, status: 200, params: name},
		operation{method: "DELETE", path: "/api/v1/teams/{name}", summary: "Delete a team; 409 while teams are below it. Sessions already charged to it keep its name.", access: "admin", status: 204, params: name},
	)
}

// admitBudgets applies the GPU-hour budgets of team's path to a create of
// owner's: over a "refuse" budget it answers 422 with the numbers and
// returns false; over a "queue" budget it lowers s to the lowest
// priority; past BudgetWarnPercent it adds a Warning header. Budgets are
// read, not compared: a create racing the accountant may pass a budget by
// the GPU-time counted meanwhile.
func (a *API) admitBudgets(c *gin.Context, tr state.TeamTree, team, owner string, s *state.Session) bool {
	checks, err := a.budgets(c.Request.Context(), tr, team, owner, a.cfg.Now())
	if err != nil {
		a.internal(c, "read usage", err)
		return false
	}
	d := decideBudgets(checks)
	if len(d.refuse) > 0 {
		fields := make([]FieldError, len(d.refuse))
		for i, m := range d.refuse {
			fields[i] = FieldError{Field: "team", Message: m + "; ask an admin to raise it, or wait until it resets"}
		}
		a.invalid(c, "Over budget", fields)
		return false
	}
	for _, m := range d.lowered {
		s.Priority = lowestPriority
		msg := m + fmt.Sprintf("; admitted at the lowest priority (%d)", lowestPriority)
		c.Writer.Header().Add("Warning", warningHeader(msg))
		a.log.Info("budget exhausted: session queued at the lowest priority", "team", team, "owner", owner, "detail", m)
	}
	for _, m := range d.warnings {
		c.Writer.Header().Add("Warning", warningHeader(m))
		a.log.Info("budget warning", "team", team, "owner", owner, "detail", m)
	}
	return true
}
