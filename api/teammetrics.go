package api

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// teamMetrics are the per-team gauges, computed at scrape time from the
// teams, the daily GPU-hours and the running attempts.
type teamMetrics struct {
	a *API

	gpus, hours, guarantee, maxGPUs, budget, used *prometheus.Desc
}

func newTeamMetrics(a *API) *teamMetrics {
	l := []string{"team"}
	return &teamMetrics{a: a,
		gpus:      prometheus.NewDesc("voyager_team_gpus", "GPU devices held now by the running attempts charged to the team (its own sessions; \"-\": no team).", l, nil),
		hours:     prometheus.NewDesc("voyager_team_gpu_hours", "GPU-hours this calendar month (UTC) of the team's own sessions, counted attempts and running ones up to now (\"-\": no team).", l, nil),
		guarantee: prometheus.NewDesc("voyager_team_guarantee_gpus", "The team's guaranteed GPUs (teams/<name>).", l, nil),
		maxGPUs:   prometheus.NewDesc("voyager_team_max_gpus", "The most GPUs the team may hold at once; absent: no cap of its own.", l, nil),
		budget:    prometheus.NewDesc("voyager_team_budget_gpu_hours", "The team's GPU-hour budget per period, for it with the teams below it; absent: none.", l, nil),
		used:      prometheus.NewDesc("voyager_team_budget_used_ratio", "GPU-hours used in the budget's current period by the team with the teams below it, over its budget: alert at 0.8, refused or queued at 1.", l, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *teamMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.gpus, m.hours, m.guarantee, m.maxGPUs, m.budget, m.used} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. It reads the teams and this
// month's days from etcd (a scrape that cannot, within 2 s, shows no team
// gauges).
func (m *teamMetrics) Collect(ch chan<- prometheus.Metric) {
	a := m.a
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	tr, err := state.ReadTeams(ctx, a.cli, a.keys)
	if err != nil {
		a.log.Debug("team metrics: read teams", "err", err)
		return
	}
	now := a.cfg.Now().UTC()
	month, next := PeriodStart(state.PeriodMonth, now)
	spans, err := a.readUsage(ctx, usageWindow{from: month, to: next}, now)
	if err != nil {
		a.log.Debug("team metrics: read usage", "err", err)
		return
	}
	hours := map[string]float64{}
	for _, s := range spans {
		hours[cmpOrDash(s.team)] += float64(s.ms) / 3.6e6
	}
	held := map[string]float64{}
	specs := a.runtimes.Snapshot()
	a.ledgers.Snapshot().RangeShared(func(l *watcher.Item[state.Ledger]) bool {
		for id, al := range l.Value.Allocations {
			if sl, ok := specs.Get(a.keys.Session(id)); ok {
				held[cmpOrDash(sl.Team)] += float64(len(al.GPUs))
			}
		}
		return true
	})
	for _, n := range tr.Names() {
		t := tr.Teams[n]
		ch <- prometheus.MustNewConstMetric(m.guarantee, prometheus.GaugeValue, float64(t.Guarantee.GPUs), n)
		if t.MaxGPUs != nil {
			ch <- prometheus.MustNewConstMetric(m.maxGPUs, prometheus.GaugeValue, float64(*t.MaxGPUs), n)
		}
		if _, ok := hours[n]; !ok {
			hours[n] = 0
		}
		if _, ok := held[n]; !ok {
			held[n] = 0
		}
		if b := t.Budget; b != nil && b.GPUHours > 0 {
			ch <- prometheus.MustNewConstMetric(m.budget, prometheus.GaugeValue, b.GPUHours, n)
			period := b.Period
			if period == "" {
				period = state.PeriodMonth
			}
			pspans := spans
			if period != state.PeriodMonth {
				start, end := PeriodStart(period, now)
				if pspans, err = a.readUsage(ctx, usageWindow{from: start, to: end}, now); err != nil {
					continue
				}
			}
			sub, used := teamSubtree(tr, n), 0.0
			for _, s := range pspans {
				if sub[s.team] {
					used += float64(s.ms) / 3.6e6
				}
			}
			ch <- prometheus.MustNewConstMetric(m.used, prometheus.GaugeValue, used/b.GPUHours, n)
		}
	}
	for team, v := range hours {
		ch <- prometheus.MustNewConstMetric(m.hours, prometheus.GaugeValue, v, team)
	}
	for team, v := range held {
		ch <- prometheus.MustNewConstMetric(m.gpus, prometheus.GaugeValue, v, team)
	}
}
