package api

import "time"

// The queue view plans as the placers plan (cluster.go's queuePlan): with
// VOYAGER_PLACER_USAGE_HALF_LIFE set, placers add each team's decayed
// GPU-hours (the usage accountant's daily records under gpuhours/) to its
// share in the order, so the API, given the same half-life
// (Config.UsageHalfLife), watches gpuhours/ too and plans with the same
// numbers (placer.DecayedUsage): the positions and reasons users see are
// the placers' order, not the order without decay.

// teamUsage is each team's decayed usage as seen from now, nil when no
// half-life is set.
func (a *API) teamUsage(now time.Time) map[string]float64 {
	if a.days == nil {
		return nil
	}
	return a.decay.Of(a.days.Snapshot(), now, a.cfg.UsageHalfLife)
}

// daysRevision is the revision of the daily records the queue plan read;
// 0 without a half-life.
func (a *API) daysRevision() int64 {
	if a.days == nil {
		return 0
	}
	return a.days.Revision()
}
