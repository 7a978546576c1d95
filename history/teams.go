package history

import (
	"fmt"
	"sort"

	"github.com/voyager-gpu/voyager/state"
)

// RuleTeamOverMax: a revision raised what a team holds, with the teams
// below it (the ledgers' allocations charged to them, state.Allocation.
// Team), above its maximum (state.Team.MaxGPUs). A maximum lowered below
// what a team already holds is not broken by the lowering, only by a
// revision that adds to the team while it is over.
const RuleTeamOverMax = "team-over-max"

// teamModel is the model of the team rule: the teams as defined, and the
// milli-GPUs the ledgers charge to each team itself (not its sub-teams).
type teamModel struct {
	defs map[string]state.Team
	own  map[string]int64
	// last is each team's holding with its sub-teams at the end of the
	// last revision checked.
	last map[string]int64
}

// noteTeam applies one change of a team key.
func (c *Checker) noteTeam(key string, value []byte, bad func(key, rule, format string, args ...any)) {
	name, ok := c.k.TeamName(key)
	if !ok {
		return
	}
	if c.tm.defs == nil {
		c.tm.defs = map[string]state.Team{}
	}
	if value == nil {
		delete(c.tm.defs, name)
		return
	}
	t, err := state.Decode[state.Team](value)
	if err != nil {
		bad(key, RuleUndecodable, "%v", err)
		return
	}
	t.Name = name
	c.tm.defs[name] = t
}

// chargeTeams adds (sign +1) or takes away (-1) what l's allocations
// charge to their teams.
func (c *Checker) chargeTeams(l state.Ledger, sign int64) {
	for _, a := range l.Allocations {
		if a.Team == "" {
			continue
		}
		if c.tm.own == nil {
			c.tm.own = map[string]int64{}
		}
		c.tm.own[a.Team] += sign * a.MilliGPUs()
	}
}

// teamsOver checks, after a revision, every team with a maximum: what it
// holds with the teams below it may not have grown past the maximum.
func (c *Checker) teamsOver(transitions bool, bad func(key, rule, format string, args ...any)) {
	if len(c.tm.defs) == 0 && len(c.tm.last) == 0 {
		return
	}
	tree := state.NewTeamTree()
	for n, t := range c.tm.defs {
		tree.Teams[n] = t
	}
	now := map[string]int64{}
	for team, g := range c.tm.own {
		for _, t := range tree.Path(team) {
			now[t] += g
		}
	}
	names := tree.Names()
	sort.Strings(names)
	for _, n := range names {
		m := tree.Teams[n].MaxGPUs
		if m == nil || !transitions {
			continue
		}
		if limit, was := 1000*int64(*m), c.tm.last[n]; now[n] > limit && now[n] > was {
			bad(c.k.Team(n), RuleTeamOverMax, "team %s holds %s GPUs with the teams below it, above its maximum of %d (it held %s before this revision)",
				n, gpus(now[n]), *m, gpus(was))
		}
	}
	c.tm.last = now
}

func gpus(milli int64) string {
	if milli%1000 == 0 {
		return fmt.Sprint(milli / 1000)
	}
	return fmt.Sprintf("%.3f", float64(milli)/1000)
}
