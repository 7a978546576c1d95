package sim

import (
	"fmt"
	"math"
	"testing"
	"time"
)

// owedBound is the longest a session owed at its arrival (it fits, with
// everything its team held and queued before it, within its team's
// guarantee) may wait with reclaim: up to a pass until the first pass
// sees it and preempts for it, then the grace of its victims, whose end
// is a pass that binds it. The node its victims free stays held for it
// through their stop until it binds (its queue entry's hold,
// placer/preempthold.go), so one round is enough; without the hold
// team-returns's longest wait is 5 minutes, a second round begun.
const owedBound = SuiteTick + 2*time.Minute

// fairBound is the same for a session owed by fair share beyond its
// team's guarantee, two passes more: such a session takes only victims no
// larger than what its team still asks for, of a team over its own share
// by their size, and idle GPUs (a node drained for an 8-GPU request)
// count in the other team's share, so a pass can find no victim it may
// take (team-returns-fair: 7 minutes at the longest; without the hold,
// 38).
const fairBound = owedBound + 2*SuiteTick

// TestTeamSuiteGoals runs TeamSuite at 16 nodes, binpack, seeds 1–3 (seed
// 1 with -short or the race detector), at the default settings with
// preemption as the lifecycle controller runs it, and asserts issue 36's
// goals:
//   - team-returns: every session of the returning team owed at its
//     arrival is placed within owedBound (the pass that first sees it,
//     then the grace), none is left unplaced; without
//     preemption (team-returns-no-reclaim) such sessions wait for the
//     borrower's sessions to end: above an hour (the test fails without
//     reclaim); nlp's sessions are reclaimed (vision's at most half
//     as many, where vision passed its guarantee and nlp fell below its
//     own);
//   - team-returns-fair (nlp's guarantee 25%, so vision's fair share,
//     62.5% while both ask, is beyond its 50% guarantee): vision's
//     sessions owed by guarantee wait at most owedBound, those owed by fair
//     share at most fairBound (reclaiming the guarantee alone, they waited
//     34–45 minutes), and vision holds its fair share over the window
//     within 2 points, nlp its own: reclaim goes to the fair share, not
//     only the guarantee; nlp's sessions are reclaimed, vision's at most a
//     quarter as many (1–3 in 24 h: where sessions ending let vision's own
//     placement take it past its share, never to undo a reclaim, which
//     leaves nlp at its share);
//   - team-borrow against team-strict: borrowing keeps the cluster busy
//     while work waits (at least 95%), strict quotas on the same work do
//     not (at most 85%), and the team that lends waits at most 30 minutes
//     for what it is owed (its 8-GPU requests need a node that none of its
//     own sessions hold: reclaim takes only borrowed work);
//   - team-weights-1:2:3 and team-nested converge to their fair shares
//     within 3 points (1/6, 2/6, 3/6; a1 7/16, a2 3/16, b 6/16);
//   - team-over-max: the team never holds more than its maximum, and
//     borrows up to it (at least 23% of 25%);
//   - team-budget-queue and team-budget-refuse: vision's budget is
//     reached mid-run; past it its creates go in at -100 (nlp still gets
//     the 40% it offers, vision the rest) or are refused (vision holds
//     nothing over the last 12 hours);
//   - adv-team-of-many: twelve users do not win their team more than
//     half (45–55% each team; ordered by users alone it would be 12/13).
func TestTeamSuiteGoals(t *testing.T) {
	seeds := []uint64{1, 2, 3}
	if testing.Short() || raceEnabled {
		seeds = seeds[:1]
	}
	rows := RunTeams(TeamSuite(16), defaultOptions(t), seeds)
	t.Logf("\n%s", TeamTable(rows))
	busy := map[string]map[uint64]float64{}
	for _, row := range rows {
		r := row.Result
		cfg := row.Shape.Build(defaultOptions(t), row.Seed)
		name := fmt.Sprintf("%s seed %d", row.Shape.Name, row.Seed)
		share := func(team string, want, tol float64) {
			if got := r.TeamShare(cfg, team); math.Abs(got-want) > tol {
				t.Errorf("%s: team %s holds %.1f%% of the GPUs, want %.1f%% ± %.0f", name, team, 100*got, 100*want, 100*tol)
			}
		}
		if busy[row.Shape.Name] == nil {
			busy[row.Shape.Name] = map[uint64]float64{}
		}
		busy[row.Shape.Name][row.Seed] = r.Busy
		switch row.Shape.Name {
		case "team-returns":
			v := r.Teams["vision"]
			if v.OwedN == 0 || v.OwedWait > owedBound.Minutes() || v.OwedUnbound > 0 {
				t.Errorf("%s: vision's %d owed sessions waited up to %.0f min (%d unplaced), want at most %.0f", name, v.OwedN, v.OwedWait, v.OwedUnbound, owedBound.Minutes())
			}
			t.Logf("%s: preempted %d of nlp's sessions, %d of vision's", name, r.Teams["nlp"].Preempted, v.Preempted)
			if n := r.Teams["nlp"]; n.Preempted == 0 || v.Preempted*2 > n.Preempted {
				t.Errorf("%s: %d of nlp's and %d of vision's sessions preempted, want nlp's borrowed work reclaimed (vision's only where it passed its own guarantee)", name, n.Preempted, v.Preempted)
			}
		case "team-returns-fair":
			v, n := r.Teams["vision"], r.Teams["nlp"]
			if v.OwedN == 0 || v.OwedWait > owedBound.Minutes() || v.OwedUnbound > 0 {
				t.Errorf("%s: vision's %d sessions owed by guarantee waited up to %.0f min (%d unplaced), want at most %.0f", name, v.OwedN, v.OwedWait, v.OwedUnbound, owedBound.Minutes())
			}
			if v.FairN <= v.OwedN || v.FairWait > fairBound.Minutes() || v.FairUnbound > 0 {
				t.Errorf("%s: vision's %d sessions owed by fair share (%d by guarantee) waited up to %.0f min (%d unplaced), want more than by guarantee, each at most %.0f", name, v.FairN, v.OwedN, v.FairWait, v.FairUnbound, fairBound.Minutes())
			}
			for _, team := range []string{"vision", "nlp"} {
				if got, want := r.TeamShare(cfg, team), r.TeamFair(cfg, team); math.Abs(got-want) > 0.02 {
					t.Errorf("%s: team %s holds %.1f%% of the GPUs, its fair share %.1f%%: want within 2 points", name, team, 100*got, 100*want)
				}
			}
			if r.TeamFair(cfg, "vision") < 0.55 {
				t.Errorf("%s: vision's fair share is %.1f%%, want beyond its 50%% guarantee (else the shape shows nothing)", name, 100*r.TeamFair(cfg, "vision"))
			}
			if n.Preempted == 0 || v.Preempted*4 > n.Preempted {
				t.Errorf("%s: %d of vision's and %d of nlp's sessions preempted, want nlp's reclaimed (vision's at most a quarter as many)", name, v.Preempted, n.Preempted)
			}
		case "team-returns-no-reclaim":
			if v := r.Teams["vision"]; v.OwedWait < 60 {
				t.Errorf("%s: vision's owed sessions waited at most %.0f min without reclaim, want over an hour (else team-returns shows nothing)", name, v.OwedWait)
			}
		case "team-borrow":
			if r.Busy < 0.95 {
				t.Errorf("%s: busy while waiting %.1f%%, want at least 95%% with borrowing", name, 100*r.Busy)
			}
			if v := r.Teams["vision"]; v.OwedWait > 30 {
				t.Errorf("%s: vision's owed sessions waited up to %.0f min, want at most 30 (placer/README.md: an 8-GPU request waits for a node free of vision's own work)", name, v.OwedWait)
			}
		case "team-strict":
			if r.Busy > 0.85 {
				t.Errorf("%s: busy while waiting %.1f%% under strict quotas, want at most 85%% (else borrowing shows nothing)", name, 100*r.Busy)
			}
		case "team-weights-1:2:3":
			share("t1", 1.0/6, 0.03)
			share("t2", 2.0/6, 0.03)
			share("t3", 3.0/6, 0.03)
		case "team-nested":
			share("a1", 7.0/16, 0.03)
			share("a2", 3.0/16, 0.03)
			share("b", 6.0/16, 0.03)
		case "team-over-max":
			if v := r.Teams["vision"]; v.Peak > 32 {
				t.Errorf("%s: vision held %d GPUs at its peak, above its maximum of 32", name, v.Peak)
			}
			share("vision", 0.25, 0.02)
		case "team-budget-queue", "team-budget-refuse":
			v := r.Teams["vision"]
			if v.OverBudgetAt <= 0 || v.OverBudgetAt >= cfg.Duration/2 {
				t.Errorf("%s: vision reached its budget at %v, want within the run's first half", name, v.OverBudgetAt)
			}
			if row.Shape.Name == "team-budget-queue" {
				if v.Demoted == 0 || v.Refused > 0 {
					t.Errorf("%s: %d creates at -100 and %d refused, want them all admitted at -100", name, v.Demoted, v.Refused)
				}
				share("nlp", 0.42, 0.04)    // it gets what it offers: vision's work past its budget yields
				share("vision", 0.57, 0.05) // and vision's runs on the rest
				break
			}
			if v.Refused == 0 || v.Demoted > 0 {
				t.Errorf("%s: %d creates refused and %d at -100, want them all refused", name, v.Refused, v.Demoted)
			}
			share("vision", 0, 0.02) // what it ran before its budget was reached ends
		case "adv-team-of-many":
			share("vision", 0.5, 0.05)
			share("nlp", 0.5, 0.05)
		}
	}
}
