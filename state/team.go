package state

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

const dirTeams = "teams"

// Teams is the prefix of the operator-defined teams.
func (k Keys) Teams() string { return k.dir(dirTeams) }

// Team is the key of team name.
func (k Keys) Team(name string) string { return k.key(dirTeams, name) }

// TeamName returns the team name of a key under teams/.
func (k Keys) TeamName(key string) (string, bool) {
	if !k.hasDir(dirTeams, key) {
		return "", false
	}
	n := k.trimDir(dirTeams, key)
	return n, n != "" && !strings.Contains(n, "/")
}

// Budget actions: what a create does once its team or owner has used the
// period's GPU-hours (TeamBudget.Action).
const (
	// BudgetRefuse refuses the create, with the numbers (the default).
	BudgetRefuse = "refuse"
	// BudgetQueue admits it at the lowest priority (-100), preemptible.
	BudgetQueue = "queue"
)

// Budget periods (TeamBudget.Period): calendar periods in UTC.
const (
	PeriodMonth = "month" // the default
	PeriodWeek  = "week"  // Monday 00:00 UTC to Monday
	PeriodDay   = "day"
)

// TeamPriorityCeiling is the highest priority a session may have at all
// (the API's range is -100 to 100); a team without MaxPriority (nor an
// ancestor with one) lets its users ask for up to it.
const TeamPriorityCeiling = 100

// TeamWeightCeiling is the largest weight a team may have.
const TeamWeightCeiling = 1000

// TeamGuarantee is the GPUs a team is promised when it asks for them.
type TeamGuarantee struct {
	// GPUs is the number of GPUs of any model.
	GPUs int `json:"gpus"`
	// Models guarantees part of GPUs on GPU models, by the model name as
	// the nodes report it (Node.GPUs[].Model, e.g. "NVIDIA A100-SXM4-80GB"),
	// part of it ("H100") or a shell pattern ("*A100*")
	// (GuaranteeModelMatches): of GPUs, this many are of that model. They
	// sum to at most GPUs. A GPU counts for the first key, in sorted order,
	// that names it.
	Models map[string]int `json:"models,omitempty"`
}

// TeamBudget is how many GPU-hours a team and each of its users may use in
// one period.
type TeamBudget struct {
	// GPUHours is the team's (with its sub-teams') budget per period; 0:
	// none.
	GPUHours float64 `json:"gpuHours,omitempty"`
	// UserGPUHours is each member's budget per period in this team; 0:
	// none.
	UserGPUHours float64 `json:"userGpuHours,omitempty"`
	// Period is PeriodMonth (the default, also for ""), PeriodWeek or
	// PeriodDay: budgets reset at the start of each, in UTC.
	Period string `json:"period,omitempty"`
	// Action is BudgetRefuse (the default, also for "") or BudgetQueue.
	Action string `json:"action,omitempty"`
}

// Team is an operator-defined group of users that shares GPUs, stored at
// teams/<name>. Teams form a tree by Parent (an organisation above its
// teams); a user belongs to every team that names her (Users) or one of
// her groups (Groups), and to the Default team when none does.
type Team struct {
	Name string `json:"name"`
	// Parent is the team above this one; empty for a root (an
	// organisation). It must exist.
	Parent      string `json:"parent,omitempty"`
	Description string `json:"description,omitempty"`
	// Groups are the token groups whose members belong to the team. A
	// group names at most one team.
	Groups []string `json:"groups,omitempty"`
	// Users belong to the team whatever their groups.
	Users []string `json:"users,omitempty"`
	// Default makes this the team of every user no team names, by user or
	// group. At most one team is the default.
	Default bool `json:"default,omitempty"`
	// Guarantee is what the team gets back when it asks: its children's
	// guarantees fit in it.
	Guarantee TeamGuarantee `json:"guarantee"`
	// Weight is the team's share of what is left over beside its
	// siblings (0: 1).
	Weight float64 `json:"weight,omitempty"`
	// MaxGPUs caps the GPUs the team's sessions hold at once, borrowing
	// included; nil: no cap but its parent's.
	MaxGPUs *int `json:"maxGPUs,omitempty"`
	// MaxPriority is the highest priority the team's users may give a
	// session (admins may exceed it); nil: its parent's, at the root
	// TeamPriorityCeiling.
	MaxPriority *int `json:"maxPriority,omitempty"`
	// Budget bounds the GPU-hours the team and its users use per period;
	// nil: none.
	Budget *TeamBudget `json:"budget,omitempty"`
	// By is the admin who wrote the definition, at Updated.
	By      string    `json:"by,omitempty"`
	Updated time.Time `json:"updated"`
}

// EffectiveWeight is the team's weight, 1 when unset.
func (t Team) EffectiveWeight() float64 {
	if t.Weight <= 0 {
		return 1
	}
	return t.Weight
}

// Validate checks one definition on its own; each problem is one message
// "field: what is wrong and what would be right". ValidateTeams checks it
// within its tree.
func (t Team) Validate() []string {
	var errs []string
	add := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	if err := ValidateName("team name", t.Name); err != nil {
		add("name: %v", err)
	}
	if t.Parent != "" {
		if err := ValidateName("team name", t.Parent); err != nil {
			add("parent: %v", err)
		} else if t.Parent == t.Name {
			add("parent: a team cannot be its own parent")
		}
	}
	if len(t.Description) > 256 {
		add("description: want at most 256 characters")
	}
	if len(t.Users)+len(t.Groups) > 256 {
		add("users, groups: want at most 256 names together")
	}
	for _, u := range t.Users {
		if err := ValidateSubject("user", u); err != nil {
			add("users: %v", err)
		}
	}
	for _, g := range t.Groups {
		if err := ValidateSubject("group", g); err != nil {
			add("groups: %v", err)
		}
	}
	if d := firstDuplicate(t.Groups); d != "" {
		add("groups: %q is named twice", d)
	}
	g := t.Guarantee
	if g.GPUs < 0 {
		add("guarantee.gpus: got %d, want 0 or more", g.GPUs)
	}
	sum := 0
	models := sortedKeys(g.Models)
	for _, m := range models {
		n := g.Models[m]
		if msg := validateModelKey(m); msg != "" { // teammodels.go
			add("guarantee.models: %s", msg)
		}
		if n < 0 {
			add("guarantee.models[%s]: got %d, want 0 or more", m, n)
		}
		sum += n
	}
	if sum > g.GPUs {
		add("guarantee.models: they sum to %d GPUs, more than guarantee.gpus (%d); raise guarantee.gpus to at least %d", sum, g.GPUs, sum)
	}
	if t.Weight < 0 || t.Weight > TeamWeightCeiling || math.IsNaN(t.Weight) {
		add("weight: got %g, want more than 0 and at most %d (0 or absent: 1)", t.Weight, TeamWeightCeiling)
	}
	if t.MaxGPUs != nil {
		switch m := *t.MaxGPUs; {
		case m < 0:
			add("maxGPUs: got %d, want 0 or more, or absent for no cap", m)
		case m < g.GPUs:
			add("maxGPUs: got %d, below the team's own guarantee of %d GPUs; raise it to at least %d or lower the guarantee", m, g.GPUs, g.GPUs)
		}
	}
	if t.MaxPriority != nil && (*t.MaxPriority < -TeamPriorityCeiling || *t.MaxPriority > TeamPriorityCeiling) {
		add("maxPriority: got %d, want %d to %d", *t.MaxPriority, -TeamPriorityCeiling, TeamPriorityCeiling)
	}
	if b := t.Budget; b != nil {
		for _, v := range []struct {
			f string
			h float64
		}{{"budget.gpuHours", b.GPUHours}, {"budget.userGpuHours", b.UserGPUHours}} {
			if v.h < 0 || math.IsNaN(v.h) || math.IsInf(v.h, 0) || v.h > 1e9 {
				add("%s: got %g, want 0 (none) to 1e9 GPU-hours", v.f, v.h)
			}
		}
		switch b.Period {
		case "", PeriodMonth, PeriodWeek, PeriodDay:
		default:
			add("budget.period: got %q, want %q (the default), %q or %q", b.Period, PeriodMonth, PeriodWeek, PeriodDay)
		}
		switch b.Action {
		case "", BudgetRefuse, BudgetQueue:
		default:
			add("budget.action: got %q, want %q (the default: a create over budget is refused) or %q (admitted at the lowest priority)", b.Action, BudgetRefuse, BudgetQueue)
		}
	}
	return errs
}

// TeamTree is every team as read at one revision.
type TeamTree struct {
	// Teams are the definitions by name.
	Teams map[string]Team
	// Revs are their keys' mod revisions.
	Revs map[string]int64
	// Rev is the revision they were read at.
	Rev int64
}

// ReadTeams reads every team at one revision.
func ReadTeams(ctx context.Context, kv clientv3.KV, k Keys) (TeamTree, error) {
	resp, err := kv.Get(ctx, k.Teams(), clientv3.WithPrefix())
	if err != nil {
		return TeamTree{}, fmt.Errorf("read teams: %w", err)
	}
	tr := TeamTree{Teams: map[string]Team{}, Revs: map[string]int64{}, Rev: resp.Header.Revision}
	for _, kv := range resp.Kvs {
		name, ok := k.TeamName(string(kv.Key))
		if !ok {
			continue
		}
		t, err := Decode[Team](kv.Value)
		if err != nil {
			return TeamTree{}, fmt.Errorf("read team %s: %w", name, err)
		}
		t.Name = name
		tr.Teams[name] = t
		tr.Revs[name] = kv.ModRevision
	}
	return tr, nil
}

// NewTeamTree returns a tree of teams, with no revisions: for checks and
// tests that read no etcd.
func NewTeamTree(teams ...Team) TeamTree {
	tr := TeamTree{Teams: map[string]Team{}, Revs: map[string]int64{}}
	for _, t := range teams {
		tr.Teams[t.Name] = t
	}
	return tr
}

// Names returns the teams' names, sorted.
func (tr TeamTree) Names() []string { return sortedKeys(tr.Teams) }

// Path returns the names from name's root down to name; nil when name is
// not a team or its parents loop (which ValidateTeams refuses).
func (tr TeamTree) Path(name string) []string {
	var path []string
	for n := name; n != ""; n = tr.Teams[n].Parent {
		if _, ok := tr.Teams[n]; !ok || len(path) > len(tr.Teams) {
			return nil
		}
		path = append(path, n)
	}
	slices.Reverse(path)
	return path
}

// Children returns the names of name's children, sorted.
func (tr TeamTree) Children(name string) []string {
	var out []string
	for n, t := range tr.Teams {
		if t.Parent == name {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

// Default returns the default team's name, or "".
func (tr TeamTree) Default() string {
	for _, n := range tr.Names() {
		if tr.Teams[n].Default {
			return n
		}
	}
	return ""
}

// Membership is which teams a user belongs to and which one her sessions
// are charged to unless she names another.
type Membership struct {
	// Teams are the teams that name her or one of her groups: first those
	// that name her, by name, then by the order of her groups.
	Teams []string `json:"teams"`
	// Team is the team her sessions go to by default: the first of Teams,
	// else the default team; empty when neither exists.
	Team string `json:"team"`
	// ByDefault is true when Team is the default team because no team
	// names her.
	ByDefault bool `json:"byDefault,omitempty"`
}

// MembershipOf returns the teams of user, a member of groups.
func (tr TeamTree) MembershipOf(user string, groups []string) Membership {
	var m Membership
	for _, n := range tr.Names() {
		if slices.Contains(tr.Teams[n].Users, user) {
			m.Teams = append(m.Teams, n)
		}
	}
	for _, g := range groups {
		for _, n := range tr.Names() {
			if slices.Contains(tr.Teams[n].Groups, g) && !slices.Contains(m.Teams, n) {
				m.Teams = append(m.Teams, n)
			}
		}
	}
	if len(m.Teams) > 0 {
		m.Team = m.Teams[0]
	} else if d := tr.Default(); d != "" {
		m.Team, m.ByDefault = d, true
		m.Teams = []string{d}
	}
	return m
}

// TeamFor returns the team a session of user (a member of groups) goes
// to: asked, which must be one of her teams, or her default one. It
// returns "" with no error when there are no teams for her at all.
func (tr TeamTree) TeamFor(user string, groups []string, asked string) (string, error) {
	m := tr.MembershipOf(user, groups)
	if asked == "" {
		return m.Team, nil
	}
	if _, ok := tr.Teams[asked]; !ok {
		return "", fmt.Errorf("no team %q; GET /api/v1/teams (voyager team list) lists them; you belong to %s", asked, listOrNone(m.Teams))
	}
	if !slices.Contains(m.Teams, asked) {
		return "", fmt.Errorf("you are not a member of team %q; you belong to %s", asked, listOrNone(m.Teams))
	}
	return asked, nil
}

// MaxPriority returns the highest priority name's users may give a
// session: its own MaxPriority, else the nearest ancestor's, else
// TeamPriorityCeiling; and the team that sets it ("" for the ceiling).
func (tr TeamTree) MaxPriority(name string) (int, string) {
	path := tr.Path(name)
	for i := len(path) - 1; i >= 0; i-- {
		if p := tr.Teams[path[i]].MaxPriority; p != nil {
			return *p, path[i]
		}
	}
	return TeamPriorityCeiling, ""
}

// ValidateTeams checks a whole tree: every parent exists, no team is its
// own ancestor, the children's guarantees (in all and per model) fit in
// their parent's, a child's maximum GPUs and maximum priority are within
// its parent's, a group names one team only, and at most one team is the
// default. Each problem is one message naming the team and the field.
func ValidateTeams(tr TeamTree) []string {
	var errs []string
	add := func(f string, a ...any) { errs = append(errs, fmt.Sprintf(f, a...)) }
	names := tr.Names()
	for _, n := range names {
		t := tr.Teams[n]
		for _, e := range t.Validate() {
			add("team %s: %s", n, e)
		}
		if t.Parent == "" {
			continue
		}
		if _, ok := tr.Teams[t.Parent]; !ok {
			add("team %s: parent: no team %q; create the parent first (teams: %s)", n, t.Parent, listOrNone(names))
			continue
		}
		if t.Parent == n {
			continue // Validate said so
		}
		// A cycle through n: walking up from n comes back to n. (A walk
		// that meets another loop stops: its teams report it.)
		chain := []string{n}
		seen := map[string]bool{n: true}
		for p := t.Parent; p != ""; p = tr.Teams[p].Parent {
			if _, ok := tr.Teams[p]; !ok || (seen[p] && p != n) {
				break
			}
			chain = append(chain, p)
			if p == n && n == slices.Min(chain) { // once per cycle
				add("team %s: parent: %q makes a cycle (%s); a team cannot be below itself", n, t.Parent, strings.Join(chain, " → "))
				break
			}
			seen[p] = true
		}
	}
	if len(errs) > 0 {
		return errs // the checks below walk the tree, which must be one
	}
	for _, n := range names {
		t := tr.Teams[n]
		kids := tr.Children(n)
		if len(kids) > 0 {
			sum, models := 0, map[string]int{}
			for _, c := range kids {
				g := tr.Teams[c].Guarantee
				sum += g.GPUs
				for m, v := range g.Models {
					models[m] += v
				}
			}
			if sum > t.Guarantee.GPUs {
				add("team %s: guarantee.gpus: its teams (%s) are guaranteed %d GPUs together, more than its own %d; raise its guarantee or lower theirs", n, strings.Join(kids, ", "), sum, t.Guarantee.GPUs)
			}
			for _, m := range sortedKeys(models) {
				if own, ok := t.Guarantee.Models[m]; ok && models[m] > own {
					add("team %s: guarantee.models[%s]: its teams are guaranteed %d of them together, more than its own %d", n, m, models[m], own)
				}
			}
		}
		if t.Parent == "" {
			continue
		}
		if pm := tr.maxGPUs(t.Parent); pm >= 0 && t.MaxGPUs != nil && *t.MaxGPUs > pm {
			add("team %s: maxGPUs: got %d, above its parent's cap of %d", n, *t.MaxGPUs, pm)
		}
		if pp, by := tr.MaxPriority(t.Parent); t.MaxPriority != nil && *t.MaxPriority > pp {
			add("team %s: maxPriority: got %d, above %d, the maximum of its parent (set by team %s)", n, *t.MaxPriority, pp, by)
		}
		if pm := tr.maxGPUs(t.Parent); pm >= 0 && t.Guarantee.GPUs > pm {
			add("team %s: guarantee.gpus: got %d, above its parent's cap of %d GPUs", n, t.Guarantee.GPUs, pm)
		}
	}
	groups := map[string]string{}
	var defaults []string
	for _, n := range names {
		for _, g := range tr.Teams[n].Groups {
			if o, ok := groups[g]; ok {
				add("team %s: groups: group %q is also named by team %s; a group names one team", n, g, o)
			}
			groups[g] = n
		}
		if tr.Teams[n].Default {
			defaults = append(defaults, n)
		}
	}
	if len(defaults) > 1 {
		add("teams %s: default: more than one team is the default; keep one", strings.Join(defaults, ", "))
	}
	return errs
}

// maxGPUs is the cap on name's GPUs from it and its ancestors; -1: none.
func (tr TeamTree) maxGPUs(name string) int {
	m := -1
	for _, n := range tr.Path(name) {
		if c := tr.Teams[n].MaxGPUs; c != nil && (m < 0 || *c < m) {
			m = *c
		}
	}
	return m
}

// TeamError is a team write refused because the tree it would make is
// invalid; Problems each name a team and a field.
type TeamError struct {
	Problems []string
}

// Error joins the problems.
func (e *TeamError) Error() string { return "invalid teams: " + strings.Join(e.Problems, "; ") }

// teamGuards are the compares that keep a write to the tree as read: no
// team key written since tr.Rev (a new, changed or re-created team), and
// each team in keep still at its revision (a deleted one fails: its mod
// revision is then 0).
func teamGuards(k Keys, tr TeamTree, keep []string) []clientv3.Cmp {
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(k.Teams()), "<", tr.Rev+1).WithRange(clientv3.GetPrefixRangeEnd(k.Teams())),
	}
	for _, n := range keep {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k.Team(n)), "=", tr.Revs[n]))
	}
	return cmps
}

// PutTeam writes t into tr, the tree as read by ReadTeams, if the tree
// with t is valid (ValidateTeams: a *TeamError otherwise, writing
// nothing). The write compares what the check was made on: no team
// changed or was added since tr was read, and every team t relies on
// (its ancestors, and t itself when it replaces one) still exists. It
// returns ErrConflict, writing nothing, when one did; read again and
// retry.
func PutTeam(ctx context.Context, kv clientv3.KV, k Keys, tr TeamTree, t Team) (int64, error) {
	next := TeamTree{Teams: map[string]Team{}, Revs: tr.Revs, Rev: tr.Rev}
	for n, v := range tr.Teams {
		next.Teams[n] = v
	}
	next.Teams[t.Name] = t
	if errs := ValidateTeams(next); len(errs) > 0 {
		return 0, &TeamError{Problems: errs}
	}
	// Every team the check read may not be deleted under it: a sibling's
	// delete only frees guarantee, but a child's or an ancestor's would
	// change what was checked.
	keep := make([]string, 0, len(tr.Teams))
	for n := range tr.Teams {
		keep = append(keep, n)
	}
	sort.Strings(keep)
	if len(keep) > DefaultMaxTxnOps-2 {
		// Too many teams to compare one by one: the path above t and its
		// children are what its checks read.
		keep = append(next.Path(t.Parent), next.Children(t.Name)...)
		if _, ok := tr.Teams[t.Name]; ok {
			keep = append(keep, t.Name)
		}
	}
	v, err := Encode(t)
	if err != nil {
		return 0, fmt.Errorf("put team %s: %w", t.Name, err)
	}
	resp, err := kv.Txn(ctx).If(teamGuards(k, tr, keep)...).Then(clientv3.OpPut(k.Team(t.Name), v)).Commit()
	if err != nil {
		return 0, fmt.Errorf("put team %s: %w", t.Name, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("put team %s: %w", t.Name, ErrConflict)
	}
	return resp.Header.Revision, nil
}

// DeleteTeam deletes team name from tr, the tree as read. A team with
// teams below it is refused (a *TeamError), as the tree would lose their
// parent; ErrNotFound when there is no such team; ErrConflict when the
// tree changed since it was read. Sessions already charged to the team
// keep its name; new ones go to their owners' other teams.
func DeleteTeam(ctx context.Context, kv clientv3.KV, k Keys, tr TeamTree, name string) (int64, error) {
	if _, ok := tr.Teams[name]; !ok {
		return 0, fmt.Errorf("delete team %s: %w", name, ErrNotFound)
	}
	if kids := tr.Children(name); len(kids) > 0 {
		return 0, &TeamError{Problems: []string{fmt.Sprintf("team %s: it has teams below it (%s); delete or move them first", name, strings.Join(kids, ", "))}}
	}
	resp, err := kv.Txn(ctx).If(teamGuards(k, tr, []string{name})...).Then(clientv3.OpDelete(k.Team(name))).Commit()
	if err != nil {
		return 0, fmt.Errorf("delete team %s: %w", name, err)
	}
	if !resp.Succeeded {
		return 0, fmt.Errorf("delete team %s: %w", name, ErrConflict)
	}
	return resp.Header.Revision, nil
}

// IsTeamError reports whether err is a refused team write, and its problems.
func IsTeamError(err error) ([]string, bool) {
	var te *TeamError
	if errors.As(err, &te) {
		return te.Problems, true
	}
	return nil, false
}

func firstDuplicate(xs []string) string {
	seen := map[string]bool{}
	for _, x := range xs {
		if seen[x] {
			return x
		}
		seen[x] = true
	}
	return ""
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func listOrNone(xs []string) string {
	if len(xs) == 0 {
		return "no team"
	}
	return strings.Join(xs, ", ")
}
