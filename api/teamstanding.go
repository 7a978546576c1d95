package api

import (
	"context"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/voyager-gpu/voyager/placer"
	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// Reclaim made visible (issue 36). Each team's standing in the tree —
// guarantee, fair share, held, borrowed, owed — is computed from the
// API's caches by the planner's own function (placer.TeamStandings, with
// the decayed usage the placers plan with), and the reclaims under way
// are read from warnings/ (state.Warning.Reclaim). GET /api/v1/teams
// carries them (TeamList.Standing), `voyager team list` and the console's
// usage page show them, and /metrics exports them per team.

// TeamStandingView is one team's standing with the reclaims under way.
type TeamStandingView struct {
	placer.TeamStanding
	// ReclaimedSessions and ReclaimedGPUs are the team's sessions warned
	// now that they will be stopped so that another team gets back its
	// guarantee, and what they hold.
	ReclaimedSessions int     `json:"reclaimedSessions"`
	ReclaimedGPUs     float64 `json:"reclaimedGPUs"`
	// ReclaimingSessions and ReclaimingGPUs are other teams' sessions
	// being stopped now for this team's waiting sessions.
	ReclaimingSessions int     `json:"reclaimingSessions"`
	ReclaimingGPUs     float64 `json:"reclaimingGPUs"`
}

// teamStandings is every team's standing now, in tree order; nil without
// teams or before the caches' first list (within SyncTimeout).
func (a *API) teamStandings(ctx context.Context) []TeamStandingView {
	ctx, cancel := context.WithTimeout(ctx, a.cfg.SyncTimeout)
	defer cancel()
	if a.WaitSynced(ctx) != nil {
		return nil
	}
	st := placer.TeamStandings(a.snapshot(a.cfg.Now()))
	if len(st) == 0 {
		return nil
	}
	// The reclaims under way: each warned victim's allocations (its team,
	// its GPUs) from the ledgers.
	type held struct {
		team string
		gpus int64
	}
	victims := map[string]string{} // session → the team reclaiming
	a.warns.Snapshot().RangeShared(func(it *watcher.Item[state.Warning]) bool {
		if w := it.Value; w.Reason == state.ReasonPreempted && w.Reclaim != "" {
			victims[w.Session] = w.Reclaim
		}
		return true
	})
	alloc := map[string]held{}
	if len(victims) > 0 {
		a.ledgers.Snapshot().RangeShared(func(it *watcher.Item[state.Ledger]) bool {
			for id, al := range it.Value.Allocations {
				if _, ok := victims[id]; ok {
					h := alloc[id]
					h.team, h.gpus = al.Team, h.gpus+al.MilliGPUs()
					alloc[id] = h
				}
			}
			return true
		})
	}
	out := make([]TeamStandingView, len(st))
	index := map[string]int{}
	for i, s := range st {
		out[i] = TeamStandingView{TeamStanding: s}
		index[s.Team] = i
	}
	ids := make([]string, 0, len(alloc))
	for id := range alloc {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		h := alloc[id]
		if i, ok := index[h.team]; ok {
			out[i].ReclaimedSessions++
			out[i].ReclaimedGPUs += float64(h.gpus) / 1000
		}
		if i, ok := index[victims[id]]; ok {
			out[i].ReclaimingSessions++
			out[i].ReclaimingGPUs += float64(h.gpus) / 1000
		}
	}
	return out
}

// standingMetrics are the per-team gauges of where each team stands,
// computed at scrape time (teamStandings).
type standingMetrics struct {
	a *API

	fair, held, borrowed, owed, reclaimed *prometheus.Desc
}

func newStandingMetrics(a *API) *standingMetrics {
	l := []string{"team"}
	return &standingMetrics{a: a,
		fair:      prometheus.NewDesc("voyager_team_fair_share_gpus", "The team's fair share of the cluster's GPUs down the team tree given what every team holds and waits for now (with the teams below it).", l, nil),
		held:      prometheus.NewDesc("voyager_team_held_gpus", "GPUs the team holds now with the teams below it, by the ledgers (voyager_team_gpus counts its own running attempts).", l, nil),
		borrowed:  prometheus.NewDesc("voyager_team_borrowed_gpus", "GPUs the team holds beyond its guarantee (with the teams below it): what reclaim may take back.", l, nil),
		owed:      prometheus.NewDesc("voyager_team_owed_gpus", "GPUs the team lacks of its guarantee while it has sessions waiting.", l, nil),
		reclaimed: prometheus.NewDesc("voyager_team_reclaimed_gpus", "GPUs of the team's sessions warned now that they will be stopped so that another team gets back its guarantee.", l, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *standingMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.fair, m.held, m.borrowed, m.owed, m.reclaimed} {
		ch <- d
	}
}

// Collect implements prometheus.Collector: nothing before the caches'
// first list (within 2 s) or without teams.
func (m *standingMetrics) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, s := range m.a.teamStandings(ctx) {
		for _, g := range []struct {
			d *prometheus.Desc
			v float64
		}{{m.fair, s.FairShareGPUs}, {m.held, s.HeldGPUs}, {m.borrowed, s.BorrowedGPUs}, {m.owed, s.OwedGPUs}, {m.reclaimed, s.ReclaimedGPUs}} {
			ch <- prometheus.MustNewConstMetric(g.d, prometheus.GaugeValue, g.v, s.Team)
		}
	}
}
