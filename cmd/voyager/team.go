package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/voyager-gpu/voyager/api"
	"github.com/voyager-gpu/voyager/state"
)

func newTeamCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:     "team",
		Aliases: []string{"teams"},
		Short:   "List teams; define and delete them (admin)",
		Long: `Teams share the cluster's GPUs: a tree of them (an organisation above its
teams), each with a guarantee of GPUs (per model where it matters), a weight,
a maximum, a maximum priority and a budget of GPU-hours. A user belongs to
the teams that name her or one of her groups, else to the default team; her
sessions are charged to her first team unless she names another
(voyager session create --team). Changes apply at once.`,
		GroupID: groupCLI,
		Args:    cobra.NoArgs,
		RunE:    groupRunE,
	}
	cmd.AddCommand(newTeamListCmd(), newTeamGetCmd(), newTeamCreateCmd(), newTeamDeleteCmd())
	return cmd
}

// teamPath returns name's place in the tree, "research/vision".
func teamPath(byName map[string]state.Team, name string) string {
	path := []string{name}
	for p := byName[name].Parent; p != "" && len(path) <= len(byName); p = byName[p].Parent {
		path = append([]string{p}, path...)
	}
	return strings.Join(path, "/")
}

func newTeamListCmd() *cobra.Command {
	var (
		cf clientFlags
		wf watchFlags
	)
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List the teams, in tree order, marking yours",
		Args:    cobra.NoArgs,
		RunE: listRunE(&cf, &wf, func(_ *cobra.Command, c *client) listing[state.Team] {
			var (
				byName   map[string]state.Team
				mine     state.Membership
				standing map[string]api.TeamStandingView
			)
			return listing[state.Team]{
				fetch: func(ctx context.Context) ([]state.Team, error) {
					var out api.TeamList
					if err := c.do(ctx, "GET", "/api/v1/teams", nil, &out); err != nil {
						return nil, err
					}
					byName, mine = map[string]state.Team{}, out.Mine
					standing = map[string]api.TeamStandingView{}
					for _, st := range out.Standing {
						standing[st.Team] = st
					}
					for _, t := range out.Items {
						byName[t.Name] = t
					}
					// Tree order: each team after its parent.
					sort.SliceStable(out.Items, func(i, j int) bool {
						return teamPath(byName, out.Items[i].Name) < teamPath(byName, out.Items[j].Name)
					})
					return out.Items, nil
				},
				key: func(t state.Team) string { return t.Name },
				header: func(wide bool) string {
					h := "TEAM\tGUARANTEE\tHELD\tFAIR SHARE\tRECLAIM\tWEIGHT\tMAX GPUS\tMAX PRIORITY\tBUDGET\tMEMBERS"
					if wide {
						h += "\tDESCRIPTION\tBY"
					}
					return h
				},
				row: func(t state.Team, wide bool) string {
					name := teamPath(byName, t.Name)
					if t.Name == mine.Team {
						name += " (yours)"
					} else if contains(mine.Teams, t.Name) {
						name += " (member)"
					}
					maxg, maxp := "-", "-"
					if t.MaxGPUs != nil {
						maxg = fmt.Sprint(*t.MaxGPUs)
					}
					if t.MaxPriority != nil {
						maxp = fmt.Sprint(*t.MaxPriority)
					}
					held, fair, reclaim := standingStrings(standing[t.Name]) // teamstanding.go
					r := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%g\t%s\t%s\t%s\t%s", name, guaranteeString(t.Guarantee), held, fair, reclaim, t.EffectiveWeight(), maxg, maxp, budgetString(t.Budget), membersString(t))
					if wide {
						r += fmt.Sprintf("\t%s\t%s", dash(t.Description), dash(t.By))
					}
					return r
				},
			}
		}),
	}
	cf.register(cmd, true)
	wf.register(cmd)
	return cmd
}

func contains(xs []string, s string) bool {
	for _, x := range xs {
		if x == s {
			return true
		}
	}
	return false
}

func guaranteeString(g state.TeamGuarantee) string {
	s := fmt.Sprintf("%d GPUs", g.GPUs)
	if len(g.Models) > 0 {
		var parts []string
		for m, n := range g.Models {
			parts = append(parts, fmt.Sprintf("%d %s", n, m))
		}
		sort.Strings(parts)
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	return s
}

func budgetString(b *state.TeamBudget) string {
	if b == nil || (b.GPUHours == 0 && b.UserGPUHours == 0) {
		return "-"
	}
	period := b.Period
	if period == "" {
		period = state.PeriodMonth
	}
	var parts []string
	if b.GPUHours > 0 {
		parts = append(parts, fmt.Sprintf("%g GPU-h", b.GPUHours))
	}
	if b.UserGPUHours > 0 {
		parts = append(parts, fmt.Sprintf("%g per user", b.UserGPUHours))
	}
	s := strings.Join(parts, ", ") + " a " + period
	if b.Action == state.BudgetQueue {
		s += ", then queued last"
	}
	return s
}

func membersString(t state.Team) string {
	var parts []string
	for _, u := range t.Users {
		parts = append(parts, "user:"+u)
	}
	for _, g := range t.Groups {
		parts = append(parts, "group:"+g)
	}
	if t.Default {
		parts = append(parts, "default")
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ",")
}

func newTeamGetCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Print one team's definition",
		Args:  exactArgs(1),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			return callShow(cmd, c, &cf, "GET", "/api/v1/teams/"+url.PathEscape(args[0]), nil, func(w io.Writer, t state.Team) {
				fmt.Fprintf(w, "team %s\nparent: %s\nguarantee: %s\nweight: %g\nbudget: %s\nmembers: %s\n",
					t.Name, dash(t.Parent), guaranteeString(t.Guarantee), t.EffectiveWeight(), budgetString(t.Budget), membersString(t))
			})
		}),
	}
	cf.register(cmd, true)
	return cmd
}

// teamFlags are the flags of voyager team create.
type teamFlags struct {
	t                  state.Team
	models             []string
	maxGPUs, maxPrio   int
	budget, userBudget float64
	period, overBudget string
}

func newTeamCreateCmd() *cobra.Command {
	var (
		cf clientFlags
		f  teamFlags
	)
	cmd := &cobra.Command{
		Use:     "create NAME",
		Aliases: []string{"set"},
		Short:   "Define or replace a team (admin)",
		Long: `Defines team NAME, or replaces its definition whole, at once. The tree it
makes must be valid: the parent exists, no cycle, the children's guarantees
fit in their parent's, a child's maximum GPUs and priority are within its
parent's, a group names one team, one default team at most; otherwise each
problem is named and nothing is written.`,
		Example: `  voyager team create research --guarantee 32 --max-priority 50
  voyager team create vision --parent research --groups vision --guarantee 16 --guarantee-model 'NVIDIA A100-SXM4-80GB=8' --weight 2
  voyager team create guests --default --max-priority 0 --budget 100 --over-budget queue`,
		Args: exactArgs(1),
		RunE: cliRunE(&cf, func(cmd *cobra.Command, c *client, args []string) error {
			t, err := f.team(cmd)
			if err != nil {
				fmt.Fprintf(cmd.ErrOrStderr(), "%s: %v\n", cmd.CommandPath(), err)
				return exitCode(exitUsage)
			}
			var out state.Team
			if err := c.do(cmd.Context(), "PUT", "/api/v1/teams/"+url.PathEscape(args[0]), t, &out); err != nil {
				return cliError(cmd, err)
			}
			return cf.show(cmd.OutOrStdout(), out, func(w io.Writer, _ bool) {
				fmt.Fprintf(w, "team %s: guarantee %s\n", out.Name, guaranteeString(out.Guarantee))
			})
		}),
	}
	cf.register(cmd, true)
	fs := cmd.Flags()
	fs.StringVar(&f.t.Parent, "parent", "", "the team above this one (none: a root, such as an organisation)")
	fs.StringVar(&f.t.Description, "description", "", "what the team is, for users")
	fs.StringSliceVar(&f.t.Groups, "groups", nil, "token groups whose members belong to the team (comma-separated)")
	fs.StringSliceVar(&f.t.Users, "users", nil, "users who belong to the team whatever their groups (comma-separated)")
	fs.BoolVar(&f.t.Default, "default", false, "the team of every user no team names")
	fs.IntVar(&f.t.Guarantee.GPUs, "guarantee", 0, "GPUs the team gets back when it asks")
	fs.StringArrayVar(&f.models, "guarantee-model", nil, "MODEL=N: of --guarantee, N GPUs of this model, as nodes report it (repeatable)")
	fs.Float64Var(&f.t.Weight, "weight", 1, "the team's share of what is left beside its siblings")
	fs.IntVar(&f.maxGPUs, "max-gpus", 0, "the most GPUs the team holds at once, borrowing included (absent: no cap)")
	fs.IntVar(&f.maxPrio, "max-priority", 0, "the highest priority its users may give a session (absent: its parent's, at the root 100)")
	fs.Float64Var(&f.budget, "budget", 0, "GPU-hours per period for the team with its sub-teams (0: none)")
	fs.Float64Var(&f.userBudget, "user-budget", 0, "GPU-hours per period for each member in this team (0: none)")
	fs.StringVar(&f.period, "period", "", "the budget's period: month (default), week or day, in UTC")
	fs.StringVar(&f.overBudget, "over-budget", "", "what a create over budget gets: refuse (default) or queue (at the lowest priority)")
	_ = cmd.RegisterFlagCompletionFunc("period", cobra.FixedCompletions([]cobra.Completion{state.PeriodMonth, state.PeriodWeek, state.PeriodDay}, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("over-budget", cobra.FixedCompletions([]cobra.Completion{state.BudgetRefuse, state.BudgetQueue}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// team builds the definition the flags describe.
func (f *teamFlags) team(cmd *cobra.Command) (state.Team, error) {
	t := f.t
	for _, m := range f.models {
		model, n, ok := strings.Cut(m, "=")
		var v int
		if _, err := fmt.Sscan(n, &v); !ok || err != nil || model == "" {
			return t, fmt.Errorf("invalid --guarantee-model %q: want MODEL=N, e.g. 'NVIDIA A100-SXM4-80GB=8'", m)
		}
		if t.Guarantee.Models == nil {
			t.Guarantee.Models = map[string]int{}
		}
		t.Guarantee.Models[model] = v
	}
	if cmd.Flags().Changed("max-gpus") {
		t.MaxGPUs = &f.maxGPUs
	}
	if cmd.Flags().Changed("max-priority") {
		t.MaxPriority = &f.maxPrio
	}
	if f.budget != 0 || f.userBudget != 0 || f.period != "" || f.overBudget != "" {
		t.Budget = &state.TeamBudget{GPUHours: f.budget, UserGPUHours: f.userBudget, Period: f.period, Action: f.overBudget}
	}
	return t, nil
}

func newTeamDeleteCmd() *cobra.Command {
	return newDeleteCmd("team", "/api/v1/teams/", "Delete a team with no teams below it (admin)")
}
