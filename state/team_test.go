package state_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/voyager-gpu/voyager/internal/etcdtest"
	"github.com/voyager-gpu/voyager/state"
)

func ptr[T any](v T) *T { return &v }

// team is a fixture builder: name under parent with a GPU guarantee.
func team(name, parent string, gpus int) state.Team {
	return state.Team{Name: name, Parent: parent, Guarantee: state.TeamGuarantee{GPUs: gpus}}
}

func with(t state.Team, f func(*state.Team)) state.Team { f(&t); return t }

// TestValidateTeamsRefusesBadTrees: each case breaks one rule of the tree
// and is refused with a message that names the team, the field and the
// numbers; the valid tree passes.
func TestValidateTeamsRefusesBadTrees(t *testing.T) {
	base := []state.Team{
		with(team("research", "", 32), func(t *state.Team) {
			t.MaxGPUs, t.MaxPriority = ptr(48), ptr(50)
			t.Guarantee.Models = map[string]int{"A100": 16}
		}),
		with(team("vision", "research", 16), func(t *state.Team) { t.Guarantee.Models = map[string]int{"A100": 10} }),
		team("nlp", "research", 8),
	}
	if errs := state.ValidateTeams(state.NewTeamTree(base...)); len(errs) != 0 {
		t.Fatalf("valid tree refused: %v", errs)
	}
	for _, c := range []struct {
		name   string
		change state.Team
		want   []string // substrings of the one message
	}{
		{"unknown parent", team("speech", "labs", 1), []string{"team speech: parent", `no team "labs"`}},
		{"cycle", with(team("research", "nlp", 32), func(t *state.Team) { t.MaxGPUs = ptr(48) }), []string{"team nlp: parent", "cycle", "nlp → research → nlp"}},
		{"self parent", team("nlp", "nlp", 8), []string{"team nlp: parent: a team cannot be its own parent"}},
		{"guarantee over the parent's", team("nlp", "research", 17), []string{"team research: guarantee.gpus", "33 GPUs together, more than its own 32"}},
		{"model guarantee within the parent's", with(team("nlp", "research", 8), func(t *state.Team) { t.Guarantee.Models = map[string]int{"A100": 6} }),
			nil},
		{"model guarantee over the parent's", with(team("nlp", "research", 8), func(t *state.Team) { t.Guarantee.Models = map[string]int{"A100": 7} }),
			[]string{"team research: guarantee.models[A100]: its teams are guaranteed 17 of them together, more than its own 16"}},
		{"models over own gpus", with(team("nlp", "research", 4), func(t *state.Team) { t.Guarantee.Models = map[string]int{"H100": 5} }),
			[]string{"team nlp: guarantee.models: they sum to 5"}},
		{"max priority above the parent's", with(team("nlp", "research", 8), func(t *state.Team) { t.MaxPriority = ptr(60) }),
			[]string{"team nlp: maxPriority: got 60, above 50", "team research"}},
		{"max GPUs above the parent's", with(team("nlp", "research", 8), func(t *state.Team) { t.MaxGPUs = ptr(64) }),
			[]string{"team nlp: maxGPUs: got 64, above its parent's cap of 48"}},
		{"max GPUs below own guarantee", with(team("nlp", "research", 8), func(t *state.Team) { t.MaxGPUs = ptr(4) }),
			[]string{"maxGPUs: got 4, below the team's own guarantee of 8"}},
		{"a new team with a group", with(team("speech", "research", 0), func(t *state.Team) { t.Groups = []string{"audio"} }), nil},
		{"bad weight", with(team("nlp", "research", 8), func(t *state.Team) { t.Weight = -1 }), []string{"weight: got -1"}},
		{"bad budget", with(team("nlp", "research", 8), func(t *state.Team) {
			t.Budget = &state.TeamBudget{GPUHours: 10, Period: "year"}
		}), []string{`budget.period: got "year"`}},
		{"bad action", with(team("nlp", "research", 8), func(t *state.Team) {
			t.Budget = &state.TeamBudget{GPUHours: 10, Action: "warn"}
		}), []string{`budget.action: got "warn"`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			tr := state.NewTeamTree(base...)
			tr.Teams[c.change.Name] = c.change
			errs := state.ValidateTeams(tr)
			if c.want == nil {
				if len(errs) != 0 {
					t.Fatalf("refused: %v", errs)
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("got %d problems %v, want one", len(errs), errs)
			}
			for _, w := range c.want {
				if !strings.Contains(errs[0], w) {
					t.Errorf("problem %q lacks %q", errs[0], w)
				}
			}
		})
	}
	two := state.NewTeamTree(append(base, with(team("speech", "", 0), func(t *state.Team) { t.Groups, t.Default = []string{"vision"}, true }),
		with(team("misc", "", 0), func(t *state.Team) { t.Default = true }),
		with(team("nlp", "research", 8), func(t *state.Team) { t.Groups = []string{"vision"} }))...)
	errs := strings.Join(state.ValidateTeams(two), "\n")
	for _, w := range []string{`team speech: groups: group "vision" is also named by team nlp`, "teams misc, speech: default: more than one team is the default"} {
		if !strings.Contains(errs, w) {
			t.Errorf("problems %q lack %q", errs, w)
		}
	}
}

// TestTeamMembership: a user is in the teams that name her, then those
// of her groups in order; else the default team; her session's team is
// the one she names if it is hers, and priority ceilings inherit.
func TestTeamMembership(t *testing.T) {
	tr := state.NewTeamTree(
		with(team("research", "", 32), func(t *state.Team) { t.MaxPriority = ptr(50) }),
		with(team("vision", "research", 16), func(t *state.Team) { t.Groups = []string{"cv"} }),
		with(team("nlp", "research", 8), func(t *state.Team) { t.Groups = []string{"text"}; t.MaxPriority = ptr(10) }),
		with(team("ops", "", 0), func(t *state.Team) { t.Users = []string{"zed"}; t.Default = true }),
	)
	for _, c := range []struct {
		user      string
		groups    []string
		teams     []string
		team      string
		byDefault bool
	}{
		{"ada", []string{"text", "cv"}, []string{"nlp", "vision"}, "nlp", false},
		{"ada", []string{"cv", "text"}, []string{"vision", "nlp"}, "vision", false},
		{"zed", []string{"cv"}, []string{"ops", "vision"}, "ops", false},
		{"bob", []string{"other"}, []string{"ops"}, "ops", true},
		{"bob", nil, []string{"ops"}, "ops", true},
	} {
		m := tr.MembershipOf(c.user, c.groups)
		if !slices.Equal(m.Teams, c.teams) || m.Team != c.team || m.ByDefault != c.byDefault {
			t.Errorf("%s %v: got %+v, want teams %v team %s default %v", c.user, c.groups, m, c.teams, c.team, c.byDefault)
		}
	}
	if got, err := tr.TeamFor("ada", []string{"cv", "text"}, "nlp"); err != nil || got != "nlp" {
		t.Errorf("ada asks for nlp: %q, %v", got, err)
	}
	if _, err := tr.TeamFor("ada", []string{"cv"}, "nlp"); err == nil || !strings.Contains(err.Error(), `not a member of team "nlp"; you belong to vision`) {
		t.Errorf("ada asks for a team not hers: %v", err)
	}
	if _, err := tr.TeamFor("ada", []string{"cv"}, "nope"); err == nil || !strings.Contains(err.Error(), `no team "nope"`) {
		t.Errorf("ada asks for no team: %v", err)
	}
	for name, want := range map[string]int{"vision": 50, "nlp": 10, "research": 50, "ops": 100} {
		if got, _ := tr.MaxPriority(name); got != want {
			t.Errorf("max priority of %s: %d, want %d", name, got, want)
		}
	}
	if m := state.NewTeamTree().MembershipOf("ada", []string{"cv"}); m.Team != "" || len(m.Teams) != 0 {
		t.Errorf("no teams: got %+v, want none", m)
	}
}

// TestPutTeamComparesTheTreeItChecked: writes that would each be valid on
// the tree they read but together make an invalid one lose with
// ErrConflict: a child added under a parent deleted meanwhile, a
// guarantee raised beside a sibling's raise, a team deleted while a child
// is added below it.
func TestPutTeamComparesTheTreeItChecked(t *testing.T) {
	c := etcdtest.Start(t, etcdtest.Options{})
	cli := c.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := state.MustKeys("/h7team")
	read := func() state.TeamTree {
		tr, err := state.ReadTeams(ctx, cli, k)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	put := func(tr state.TeamTree, tm state.Team) error {
		_, err := state.PutTeam(ctx, cli, k, tr, tm)
		return err
	}
	for _, tm := range []state.Team{team("research", "", 16), team("vision", "research", 8), team("labs", "", 0)} {
		if err := put(read(), tm); err != nil {
			t.Fatalf("put %s: %v", tm.Name, err)
		}
	}
	// Refused by the check, writing nothing.
	err := put(read(), team("nlp", "research", 9))
	if probs, ok := state.IsTeamError(err); !ok || !strings.Contains(probs[0], "17 GPUs together, more than its own 16") {
		t.Fatalf("over-guarantee: %v", err)
	}
	if _, ok := read().Teams["nlp"]; ok {
		t.Fatal("a refused team was written")
	}
	if _, err := state.DeleteTeam(ctx, cli, k, read(), "research"); err == nil || !strings.Contains(err.Error(), "has teams below it (vision)") {
		t.Fatalf("delete of a parent: %v", err)
	}

	// Two raises of sibling guarantees, each valid alone: the second loses.
	tr := read()
	if err := put(tr, team("nlp", "research", 8)); err != nil {
		t.Fatal(err)
	}
	if err := put(tr, team("vision", "research", 9)); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("second raise on a stale tree: %v, want ErrConflict", err)
	}
	if got := read().Teams["vision"].Guarantee.GPUs; got != 8 {
		t.Fatalf("vision's guarantee %d after the lost raise, want 8", got)
	}

	// A parent deleted after the tree was read: the child's write loses.
	tr = read()
	if _, err := state.DeleteTeam(ctx, cli, k, tr, "labs"); err != nil {
		t.Fatal(err)
	}
	if err := put(tr, team("robots", "labs", 0)); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("child of a deleted parent: %v, want ErrConflict", err)
	}
	// A delete on a tree that gained a child below the team meanwhile.
	if err := put(read(), team("labs", "", 0)); err != nil {
		t.Fatal(err)
	}
	tr = read()
	if err := put(tr, team("robots", "labs", 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := state.DeleteTeam(ctx, cli, k, tr, "labs"); !errors.Is(err, state.ErrConflict) {
		t.Fatalf("delete with a child added meanwhile: %v, want ErrConflict", err)
	}
	final := read()
	if errs := state.ValidateTeams(final); len(errs) != 0 {
		t.Fatalf("the tree in etcd is invalid: %v", errs)
	}
	if got := final.Names(); !slices.Equal(got, []string{"labs", "nlp", "research", "robots", "vision"}) {
		t.Fatalf("teams %v", got)
	}
}
