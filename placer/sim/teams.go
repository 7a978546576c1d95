package sim

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
)

// Preempt makes a run preempt as the lifecycle controller does: after
// every pass, placer.PlanPreemption over the pass's snapshot and plan; its
// victims are warned, stop Grace later (their work lost) and are queued
// again with their first submission's age, their nodes held for their
// preemptors meanwhile and after, until the preemptors bind (the hold the
// controller writes into a preemptor's queue entry).
type Preempt struct {
	// Grace is the time between a warning and the stop (the controller's
	// VOYAGER_PREEMPT_GRACE; the suite uses its default, 2 minutes).
	Grace time.Duration
	// Max bounds the preemptions one pass decides (0: the placer's
	// default, 8).
	Max int
}

// TeamResult is what one team (with the teams below it) held and asked
// for over a run.
type TeamResult struct {
	// Held is the GPUs it held after each pass, from time zero, one
	// entry every Config.Tick; Waiting the GPUs its waiting sessions
	// asked for then.
	Held, Waiting []int
	// Owed is, after each pass, whether one of its waiting sessions would
	// fit within what it lacks of its guarantee: GPUs it is owed.
	Owed []bool
	// OwedWait is the longest any of its sessions waited, in minutes,
	// that was owed at its arrival: it fitted, with everything its team
	// held and had queued before it, within the guarantee of its team and
	// of every team above it. OwedN counts those sessions, and
	// OwedUnbound those still waiting at the end.
	OwedWait           float64
	OwedN, OwedUnbound int
	// FairWait, FairN and FairUnbound are the same for the sessions owed
	// at their arrival by fair share: each fitted, with everything its
	// team held and had queued before it, within the fair share of its
	// team and of every team above it (placer.TeamFairShares), which a
	// team beyond its guarantee is owed while others hold more than
	// theirs.
	FairWait           float64
	FairN, FairUnbound int
	// Fair is the team's fair share in GPUs after each pass, as reclaim
	// computes it (placer.TeamFairShares).
	Fair []float64
	// UsedGPUHours is the GPU-hours its sessions ran (with its
	// sub-teams'), and OverBudgetAt when they first reached its budget
	// (state.TeamBudget.GPUHours over the whole run; -1: never). Refused
	// counts the sessions refused then (action refuse), Demoted those
	// admitted at priority -100, preemptible (action queue).
	UsedGPUHours     float64
	OverBudgetAt     time.Duration
	Refused, Demoted int
	// Peak is the most it held after any pass.
	Peak int
	// Preempted counts its sessions stopped by preemption.
	Preempted int
}

// teamSim is a run's teams and preemptions; nil when the run has neither.
type teamSim struct {
	cfg    *Config
	teams  state.TeamTree
	warned map[string]warning // victim → its warning
	// stopped counts preempted sessions by team, preempted in all, and
	// lostH the GPU-hours they had run.
	stopped   map[string]int
	preempted int
	lostH     float64
	// owed are the sessions owed at their arrival (TeamResult.OwedWait),
	// with their team path.
	owed  map[string]bool
	waits map[string]float64 // team → longest owed wait
	count map[string]int     // team → owed sessions
	// fairOwed, fairWaits and fairCount are the same by fair share
	// (TeamResult.FairWait).
	fairOwed  map[string]bool
	fairWaits map[string]float64
	fairCount map[string]int
	// used is each team's GPU-hours run so far (with its sub-teams'),
	// and overAt when it reached its budget; refused and demoted count
	// the creates its budget turned away or sent to priority -100.
	used            map[string]float64
	overAt          map[string]time.Duration
	refused, demote map[string]int
	now             time.Duration
}

type warning struct {
	stopAt   time.Duration
	node, by string
}

func newTeamSim(cfg *Config) *teamSim {
	if len(cfg.Teams) == 0 && cfg.Preempt == nil {
		return nil
	}
	return &teamSim{cfg: cfg, teams: state.NewTeamTree(cfg.Teams...), warned: map[string]warning{}, stopped: map[string]int{},
		owed: map[string]bool{}, waits: map[string]float64{}, count: map[string]int{},
		fairOwed: map[string]bool{}, fairWaits: map[string]float64{}, fairCount: map[string]int{},
		used: map[string]float64{}, overAt: map[string]time.Duration{}, refused: map[string]int{}, demote: map[string]int{}}
}

// tree is the planner's team tree.
func (tm *teamSim) tree() state.TeamTree {
	if tm == nil {
		return state.TeamTree{}
	}
	return tm.teams
}

// heldNodes are the nodes kept for preemptors while their victims stop,
// and after, until they bind, by their queue entries' holds, as
// placer.SnapshotOf reads them from the warnings and the queue.
func (tm *teamSim) heldNodes(pending []placer.Pending, now time.Duration) map[string]string {
	if tm == nil {
		return nil
	}
	var out map[string]string
	for _, w := range tm.warned {
		if out == nil {
			out = map[string]string{}
		}
		out[w.node] = w.by
	}
	return placer.AddEntryHolds(out, pending, epoch.Add(now))
}

// preempting maps the sessions warned of a preemption to their
// preemptors (placer.Snapshot.Preempting).
func (tm *teamSim) preempting() map[string]string {
	if tm == nil || len(tm.warned) == 0 {
		return nil
	}
	out := make(map[string]string, len(tm.warned))
	for id, w := range tm.warned {
		out[id] = w.by
	}
	return out
}

// stopVictims stops the victims whose grace ended by now: their
// allocations leave the ledgers and they are queued again, with their
// first submission's age, to run from the start.
func (tm *teamSim) stopVictims(now time.Duration, views []placer.NodeView, index map[string]int, pending []placer.Pending,
	held, waitGPUs map[string]int, bySession map[string]*session) []placer.Pending {
	if tm == nil {
		return pending
	}
	var due []string
	for id, w := range tm.warned {
		if w.stopAt <= now {
			due = append(due, id)
		}
	}
	sort.Strings(due)
	for _, id := range due {
		delete(tm.warned, id)
		s := bySession[id]
		gone := false
		for i := range views {
			if _, ok := views[i].Ledger.Allocations[id]; ok {
				delete(views[i].Ledger.Allocations, id)
				views[i].LedgerRevision++
				gone = true
			}
		}
		if !gone {
			continue // it ended during its grace
		}
		s.gen++             // its planned end is void
		g := s.size.milli() // held and waitGPUs count milli-GPUs
		held[s.user] -= g
		waitGPUs[s.user] += g
		created := epoch.Add(s.arrive)
		e := state.QueueEntry{Session: s.id, Kind: state.KindBatch, Owner: s.user, Groups: s.groups, Team: s.team, Preemptible: s.preemptible, Priority: s.prio,
			Created: created, Enqueued: epoch.Add(now), Attempt: s.gen,
			Request:    state.Resources{GPUs: s.size.GPUs, CPUMilli: int64(s.size.GPUs) * 1000, MemoryMiB: int64(s.size.GPUs) << 13},
			MaxRuntime: state.Duration(s.limit), Workers: s.size.Workers}
		pending = append(pending, placer.Pending{Entry: &e, Revision: 1})
		tm.lost(s, now)
	}
	return pending
}

// lostHours accumulates the GPU-hours preempted sessions had run.
func (tm *teamSim) lost(s *session, now time.Duration) {
	tm.lostH += float64(s.size.GPUs*(s.size.Workers+1)) * (now - s.started).Hours()
	tm.stopped[s.team]++
	tm.preempted++
}

// pass plans the preemptions of a pass and samples what each team holds.
func (tm *teamSim) pass(now time.Duration, snap *placer.Snapshot, plan *placer.Plan, views []placer.NodeView, pending []placer.Pending,
	bySession map[string]*session, res *Result) {
	if tm == nil {
		return
	}
	if p := tm.cfg.Preempt; p != nil {
		opt := placer.PreemptOptions{Max: p.Max, Victims: map[string]bool{}, Preemptors: map[string]bool{}}
		for id, w := range tm.warned {
			opt.Victims[id] = true
			opt.Preemptors[w.by] = true
		}
		at := map[string]int{}
		for i := range pending {
			at[pending[i].Entry.Session] = i
		}
		for _, pr := range placer.PlanPreemption(snap, plan, opt) {
			for _, v := range pr.Victims {
				tm.warned[v.Session] = warning{stopAt: now + p.Grace, node: pr.Node, by: pr.Preemptor.Entry.Session}
			}
			// The controller writes the node into the preemptor's queue
			// entry with the warnings (placer/preempthold.go).
			if i, ok := at[pr.Preemptor.Entry.Session]; ok {
				e := *pending[i].Entry
				e.Hold = &state.QueueHold{Node: pr.Node, Until: epoch.Add(now + 2*p.Grace)}
				pending[i].Entry = &e
			}
		}
	}
	if res.Teams == nil {
		res.Teams = map[string]*TeamResult{}
		for _, n := range tm.teams.Names() {
			res.Teams[n] = &TeamResult{}
		}
	}
	heldBy := map[string]int{}
	for i := range views {
		for _, a := range views[i].Ledger.Allocations {
			for _, t := range tm.teams.Path(a.Team) {
				heldBy[t] += len(a.GPUs)
			}
		}
	}
	// What ran until the next pass counts now (the accountant accrues
	// the bound time); a budget reached stays reached for the run.
	tm.now = now + tm.cfg.Tick
	for t, g := range heldBy {
		tm.used[t] += float64(g) * tm.cfg.Tick.Hours()
		if b := tm.teams.Teams[t].Budget; b != nil && b.GPUHours > 0 && tm.used[t] >= b.GPUHours {
			if _, ok := tm.overAt[t]; !ok {
				tm.overAt[t] = tm.now
			}
		}
	}
	waiting, smallest := map[string]int{}, map[string]int{}
	for _, p := range pending {
		g := p.Entry.Request.GPUs * (p.Entry.Workers + 1)
		for _, t := range tm.teams.Path(p.Entry.Team) {
			waiting[t] += g
			if m, ok := smallest[t]; !ok || g < m {
				smallest[t] = g
			}
		}
	}
	fair := placer.TeamFairShares(snapAfter(snap, views, pending))
	for n, tr := range res.Teams {
		tr.Held = append(tr.Held, heldBy[n])
		tr.Fair = append(tr.Fair, fair[n])
		tr.FairWait, tr.FairN, tr.FairUnbound = tm.fairWaits[n], tm.fairCount[n], 0
		tr.Waiting = append(tr.Waiting, waiting[n])
		lack := tm.teams.Teams[n].Guarantee.GPUs - heldBy[n]
		tr.Owed = append(tr.Owed, waiting[n] > 0 && smallest[n] <= lack)
		tr.Peak = max(tr.Peak, heldBy[n])
		tr.Preempted = tm.stopped[n]
		tr.OwedWait, tr.OwedN = tm.waits[n], tm.count[n]
		tr.UsedGPUHours, tr.Refused, tr.Demoted = tm.used[n], tm.refused[n], tm.demote[n]
		tr.OverBudgetAt = -1
		if at, ok := tm.overAt[n]; ok {
			tr.OverBudgetAt = at
		}
		tr.OwedUnbound = 0
	}
	for id := range tm.owed {
		if tr := res.Teams[bySession[id].team]; tr != nil {
			tr.OwedUnbound++
		}
	}
	for id := range tm.fairOwed {
		if tr := res.Teams[bySession[id].team]; tr != nil {
			tr.FairUnbound++
		}
	}
	res.Preempted, res.PreemptedGPUHours = tm.preempted, tm.lostH
}

// snapAfter is snap as the pass left it: the ledgers with its binds and
// stops, the sessions still waiting.
func snapAfter(snap *placer.Snapshot, views []placer.NodeView, pending []placer.Pending) *placer.Snapshot {
	cp := *snap
	cp.Nodes, cp.Pending = views, pending
	return &cp
}

// teamShape builds one shape of TeamSuite.
func teamShape(name, about string, nodes int, build func(o placer.PlanOptions, seed uint64) Config) Shape {
	return Shape{Name: name, About: about, Nodes: nodes, Build: build}
}

// teamStream is a stream of team's sessions from user offering load of
// the cluster, DefaultMix, exponential run times of mean run.
func teamStream(user, team string, nodes int, load float64, run time.Duration, preemptible bool) Stream {
	return Stream{User: user, Team: team, Preemptible: preemptible, Rate: rate(nodes, load, meanGPUs(DefaultMix), run), Runtime: Runtime{Mean: run}}
}

func maxGPUs(t state.Team, m int) state.Team {
	t.MaxGPUs = &m
	return t
}

// TeamReturns is the hour at which team vision, idle until then, starts
// asking in TeamSuite's team-returns shape.
const TeamReturns = 6 * time.Hour

// TeamSuite is the team shapes of issue 36 at a cluster of nodes 8-GPU
// nodes (16 in the tests): a team with a 50% guarantee returning to a
// cluster another team borrowed whole; borrowing against strict quotas on
// one workload; three teams of weights 1:2:3; nested teams; a team trying
// to pass its maximum; and one built to defeat the tree (one team of many
// users against a team of one). Preemption as the lifecycle controller
// runs it with its default grace (2 minutes) and at most 8 a pass.
func TeamSuite(nodes int) []Shape {
	gpus := nodes * 8
	half := gpus / 2
	pre := &Preempt{Grace: 2 * time.Minute}
	cfg := func(o placer.PlanOptions, seed uint64, d, from time.Duration, teams []state.Team, p *Preempt, streams ...Stream) Config {
		return Config{Nodes: nodes, Plan: o, Streams: streams, Duration: d, Tick: SuiteTick, Seed: seed, From: from, Teams: teams, Preempt: p}
	}
	returns := func(o placer.PlanOptions, seed uint64, p *Preempt) Config {
		v := teamStream("ada", "vision", nodes, 1.0, time.Hour, true)
		v.Start = TeamReturns
		return cfg(o, seed, 12*time.Hour, TeamReturns, []state.Team{
			{Name: "vision", Guarantee: state.TeamGuarantee{GPUs: half}}, {Name: "nlp", Guarantee: state.TeamGuarantee{GPUs: half}},
		}, p, teamStream("bob", "nlp", nodes, 1.5, 4*time.Hour, true), v)
	}
	borrow := func(strict bool) func(o placer.PlanOptions, seed uint64) Config {
		return func(o placer.PlanOptions, seed uint64) Config {
			v, n := state.Team{Name: "vision", Guarantee: state.TeamGuarantee{GPUs: half}}, state.Team{Name: "nlp", Guarantee: state.TeamGuarantee{GPUs: half}}
			if strict {
				v, n = maxGPUs(v, half), maxGPUs(n, half)
			}
			return cfg(o, seed, 24*time.Hour, 2*time.Hour, []state.Team{v, n}, pre,
				teamStream("ada", "vision", nodes, 0.3, time.Hour, true), teamStream("bob", "nlp", nodes, 1.0, time.Hour, true))
		}
	}
	budget := func(o placer.PlanOptions, seed uint64, action string) Config {
		v := state.Team{Name: "vision", Budget: &state.TeamBudget{GPUHours: 400, Period: state.PeriodDay, Action: action}}
		return cfg(o, seed, 24*time.Hour, 12*time.Hour, []state.Team{v, {Name: "nlp"}}, pre,
			teamStream("ada", "vision", nodes, 1.0, time.Hour, false), teamStream("bob", "nlp", nodes, 0.4, time.Hour, false))
	}
	return []Shape{
		teamShape("team-returns", "team vision (50% guarantee) idle for 6 h while team nlp borrows the whole cluster (150%, preemptible, 4 h mean); then vision asks for 100%", nodes,
			func(o placer.PlanOptions, seed uint64) Config { return returns(o, seed, pre) }),
		teamShape("team-returns-fair", "team-returns with nlp's guarantee 25%: vision's fair share (50% + half the unguaranteed 25%) is 62.5%, beyond its guarantee, while nlp holds the cluster", nodes,
			func(o placer.PlanOptions, seed uint64) Config {
				c := returns(o, seed, pre)
				c.Teams[1].Guarantee.GPUs = half / 2
				return c
			}),
		teamShape("team-returns-no-reclaim", "team-returns without preemption: what vision waits for when borrowed GPUs come back only as nlp's sessions end", nodes,
			func(o placer.PlanOptions, seed uint64) Config { return returns(o, seed, nil) }),
		teamShape("team-borrow", "vision (50% guarantee) offers 30%, nlp (50%) offers 100%: nlp borrows vision's idle half", nodes, borrow(false)),
		teamShape("team-strict", "team-borrow's workload with each team's maximum at its guarantee (strict quotas, no borrowing)", nodes, borrow(true)),
		teamShape("team-weights-1:2:3", "three teams of weights 1, 2 and 3, no guarantees, each offering 100%", nodes,
			func(o placer.PlanOptions, seed uint64) Config {
				return cfg(o, seed, 24*time.Hour, 3*time.Hour, []state.Team{{Name: "t1", Weight: 1}, {Name: "t2", Weight: 2}, {Name: "t3", Weight: 3}}, pre,
					teamStream("u1", "t1", nodes, 1, time.Hour, true), teamStream("u2", "t2", nodes, 1, time.Hour, true), teamStream("u3", "t3", nodes, 1, time.Hour, true))
			}),
		teamShape("team-nested", "org a (guarantee 50%) with teams a1 (guarantee 25%) and a2 (none), org b (guarantee 25%); every team offers 100%", nodes,
			func(o placer.PlanOptions, seed uint64) Config {
				return cfg(o, seed, 24*time.Hour, 3*time.Hour, []state.Team{
					{Name: "a", Guarantee: state.TeamGuarantee{GPUs: half}}, {Name: "a1", Parent: "a", Guarantee: state.TeamGuarantee{GPUs: half / 2}},
					{Name: "a2", Parent: "a"}, {Name: "b", Guarantee: state.TeamGuarantee{GPUs: half / 2}},
				}, pre, teamStream("u1", "a1", nodes, 1, time.Hour, true), teamStream("u2", "a2", nodes, 1, time.Hour, true), teamStream("u3", "b", nodes, 1, time.Hour, true))
			}),
		teamShape("team-over-max", "team vision (maximum 25%) offers 150% against nlp at 20%: vision borrows up to its maximum, never past it", nodes,
			func(o placer.PlanOptions, seed uint64) Config {
				return cfg(o, seed, 24*time.Hour, 2*time.Hour, []state.Team{maxGPUs(state.Team{Name: "vision"}, gpus/4), {Name: "nlp"}}, pre,
					teamStream("ada", "vision", nodes, 1.5, time.Hour, true), teamStream("bob", "nlp", nodes, 0.2, time.Hour, true))
			}),
		teamShape("team-budget-queue", "team vision (budget 400 GPU-hours, action queue) offers 100% against nlp at 40%: past its budget vision's creates go in at priority -100, preemptible, onto what nlp leaves idle", nodes,
			func(o placer.PlanOptions, seed uint64) Config { return budget(o, seed, state.BudgetQueue) }),
		teamShape("team-budget-refuse", "team-budget-queue with action refuse: past its budget vision's creates are refused", nodes,
			func(o placer.PlanOptions, seed uint64) Config { return budget(o, seed, state.BudgetRefuse) }),
		teamShape("adv-team-of-many", "adversarial: team nlp sends its work through 12 users against team vision's one, both offering 100%, to win the order by users' shares", nodes,
			func(o placer.PlanOptions, seed uint64) Config {
				st := []Stream{teamStream("ada", "vision", nodes, 1, time.Hour, true)}
				for i := 0; i < 12; i++ {
					st = append(st, teamStream(string(rune('a'+i))+"-nlp", "nlp", nodes, 1.0/12, time.Hour, true))
				}
				return cfg(o, seed, 24*time.Hour, 3*time.Hour, []state.Team{{Name: "vision"}, {Name: "nlp"}}, pre, st...)
			}),
	}
}

// TeamRow is one run of TeamSuite.
type TeamRow struct {
	Shape  Shape
	Seed   uint64
	Result Result
}

// meanFrom is the mean of xs from pass index from (inclusive).
func meanFrom(xs []int, from int) float64 {
	if from >= len(xs) {
		return 0
	}
	s := 0
	for _, x := range xs[from:] {
		s += x
	}
	return float64(s) / float64(len(xs)-from)
}

// TeamShare is team's mean fraction of the cluster's GPUs over the
// window of cfg.
func (r Result) TeamShare(cfg Config, team string) float64 {
	tr := r.Teams[team]
	if tr == nil {
		return 0
	}
	gpus := cfg.totalGPUs()
	return meanFrom(tr.Held, int(cfg.From/cfg.Tick)) / float64(gpus)
}

// TeamFair is team's mean fair share (TeamResult.Fair) as a fraction of
// the cluster's GPUs over the window of cfg.
func (r Result) TeamFair(cfg Config, team string) float64 {
	tr := r.Teams[team]
	if tr == nil {
		return 0
	}
	gpus := cfg.totalGPUs()
	from := int(cfg.From / cfg.Tick)
	if from >= len(tr.Fair) {
		return 0
	}
	sum := 0.0
	for _, f := range tr.Fair[from:] {
		sum += f
	}
	return sum / float64(len(tr.Fair)-from) / float64(gpus)
}

// arrived marks s owed when it fits, with what its team holds and has
// queued (pending, s among them), within the guarantee of its team and of
// each team above it.
func (tm *teamSim) arrived(s *session, views []placer.NodeView, pending []placer.Pending) {
	if tm == nil || s.team == "" {
		return
	}
	path := tm.teams.Path(s.team)
	use := map[string]int{}
	for i := range views {
		for _, a := range views[i].Ledger.Allocations {
			for _, t := range tm.teams.Path(a.Team) {
				use[t] += len(a.GPUs)
			}
		}
	}
	for _, p := range pending {
		for _, t := range tm.teams.Path(p.Entry.Team) {
			use[t] += p.Entry.Request.GPUs * (p.Entry.Workers + 1)
		}
	}
	fair := placer.TeamFairShares(&placer.Snapshot{Nodes: views, Pending: pending, Teams: tm.teams})
	fits := true
	for _, t := range path {
		fits = fits && float64(use[t]) <= fair[t]+0.001
	}
	if fits {
		tm.fairOwed[s.id] = true
		tm.fairCount[s.team]++
	}
	for _, t := range path {
		if g := tm.teams.Teams[t].Guarantee.GPUs; use[t] > g {
			return
		}
	}
	tm.owed[s.id] = true
	tm.count[s.team]++
}

// bound records the wait of an owed session placed at now.
func (tm *teamSim) bound(s *session, now time.Duration) {
	if tm == nil {
		return
	}
	if tm.fairOwed[s.id] {
		delete(tm.fairOwed, s.id)
		tm.fairWaits[s.team] = max(tm.fairWaits[s.team], (now - s.arrive).Minutes())
	}
	if !tm.owed[s.id] {
		return
	}
	delete(tm.owed, s.id)
	tm.waits[s.team] = max(tm.waits[s.team], (now - s.arrive).Minutes())
}

// RunTeams runs every shape for every seed with binpack (the default),
// parallel runs at most GOMAXPROCS at a time, in order.
func RunTeams(shapes []Shape, opt placer.PlanOptions, seeds []uint64) []SuiteRow {
	return RunSuite(shapes, opt, []placer.Strategy{placer.Binpack}, seeds)
}

// TeamTable writes runs of TeamSuite as one Markdown table: per run, each
// team's mean share of the GPUs over the window and its peak, the
// longest wait of a session owed at its arrival (with how many there
// were), utilisation while work waits, and the sessions preempted with
// the GPU-hours they had run, and for a team with a budget, when it was
// reached and how many creates were refused or sent to priority -100.
func TeamTable(rows []SuiteRow) string {
	var b strings.Builder
	b.WriteString("| shape | seed | sessions | team share of fair share (peak GPUs) | longest owed wait, min (owed sessions): guarantee / fair share | busy while waiting | preempted (GPU-h lost) | budget reached at / refused / at -100 |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, row := range rows {
		r := row.Result
		cfg := row.Shape.Build(placer.PlanOptions{}, row.Seed)
		names := make([]string, 0, len(r.Teams))
		for n := range r.Teams {
			names = append(names, n)
		}
		sort.Strings(names)
		var shares, owed, budget []string
		for _, n := range names {
			tr := r.Teams[n]
			shares = append(shares, fmt.Sprintf("%s %.1f%% of %.1f%% (%d)", n, 100*r.TeamShare(cfg, n), 100*r.TeamFair(cfg, n), tr.Peak))
			if tr.OverBudgetAt >= 0 {
				budget = append(budget, fmt.Sprintf("%s %v / %d / %d", n, tr.OverBudgetAt, tr.Refused, tr.Demoted))
			}
			if tr.OwedN > 0 || tr.FairN > 0 {
				s := fmt.Sprintf("%s %.0f (%d)", n, tr.OwedWait, tr.OwedN)
				if tr.OwedUnbound > 0 {
					s += fmt.Sprintf(", %d unplaced", tr.OwedUnbound)
				}
				s += fmt.Sprintf(" / %.0f (%d)", tr.FairWait, tr.FairN)
				if tr.FairUnbound > 0 {
					s += fmt.Sprintf(", %d unplaced", tr.FairUnbound)
				}
				owed = append(owed, s)
			}
		}
		if len(owed) == 0 {
			owed = []string{"–"}
		}
		if len(budget) == 0 {
			budget = []string{"–"}
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %s | %s | %.1f%% | %d (%.0f) | %s |\n", row.Shape.Name, row.Seed, r.Sessions,
			strings.Join(shares, ", "), strings.Join(owed, ", "), 100*r.Busy, r.Preempted, r.PreemptedGPUHours, strings.Join(budget, ", "))
	}
	return b.String()
}

// admit applies the budgets of s's team and the teams above it to its
// create, as the API does: over a budget, a create is refused
// (state.BudgetRefuse) or admitted at priority -100, preemptible
// (state.BudgetQueue).
func (tm *teamSim) admit(s *session, e *state.QueueEntry) bool {
	if tm == nil || s.team == "" {
		return true
	}
	for _, t := range tm.teams.Path(s.team) {
		if _, over := tm.overAt[t]; !over {
			continue
		}
		if tm.teams.Teams[t].Budget.Action == state.BudgetQueue {
			e.Priority, e.Preemptible = -state.TeamPriorityCeiling, true
			s.prio, s.preemptible = e.Priority, true
			tm.demote[s.team]++
			return true
		}
		tm.refused[s.team]++
		return false
	}
	return true
}
