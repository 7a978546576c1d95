package state

import (
	"math"
	"time"
)

// UsageInterval is GPU-time spread evenly over [From, To): what decayed
// usage is computed from.
type UsageInterval struct {
	// Subject is whom it is charged to (a team, a user, UsageSubject).
	Subject         string
	From, To        time.Time
	GPUMilliseconds int64
}

// DecayFactor is the weight of usage age ago under halfLife:
// 2^(−age/halfLife); 1 for a halfLife of 0 (no decay) and for usage not
// yet in the past.
func DecayFactor(age, halfLife time.Duration) float64 {
	if halfLife <= 0 || age <= 0 {
		return 1
	}
	return math.Exp2(-float64(age) / float64(halfLife))
}

// decayedShare is the mean of DecayFactor over [from, to) seen from now:
// the exact integral of 2^(−(now−t)/h) over the interval, over its length.
func decayedShare(from, to, now time.Time, halfLife time.Duration) float64 {
	if halfLife <= 0 {
		return 1
	}
	if !to.After(from) {
		return DecayFactor(now.Sub(from), halfLife)
	}
	h := float64(halfLife)
	a, b := float64(now.Sub(to)), float64(now.Sub(from)) // ages of the ends, a < b
	if b <= 0 {
		return 1 // all of it now or later
	}
	if a < 0 {
		// Usage running up to now (or later): no decay for the future part.
		fut := -a
		return (fut + h/math.Ln2*(1-math.Exp2(-b/h))) / (b + fut)
	}
	return h / math.Ln2 * (math.Exp2(-a/h) - math.Exp2(-b/h)) / (b - a)
}

// DecayedUsage is each subject's GPU-hours with older use counting less:
// every interval's GPU-time weighted by the decay 2^(−age/halfLife)
// integrated over the interval, seen from now. A halfLife of 0 is no
// decay: the plain sum. It is pure, for the planner's fair share to call
// with the intervals the caller read (DayIntervals of the daily records
// and the running attempts).
func DecayedUsage(intervals []UsageInterval, now time.Time, halfLife time.Duration) map[string]float64 {
	out := map[string]float64{}
	for _, iv := range intervals {
		out[iv.Subject] += float64(iv.GPUMilliseconds) / 3.6e6 * decayedShare(iv.From, iv.To, now, halfLife)
	}
	return out
}

// DayIntervals turns daily records into intervals, each day's GPU-time of
// a subject spread evenly over that UTC day (today's up to now), with
// subject chosen from the record's "team/owner" key (by returning "" a
// caller leaves a key out).
func DayIntervals(days []UsageDay, now time.Time, subject func(team, owner string) string) []UsageInterval {
	var out []UsageInterval
	for _, d := range days {
		from, err := time.Parse(time.DateOnly, d.Day)
		if err != nil {
			continue
		}
		to := from.AddDate(0, 0, 1)
		if to.After(now) && now.After(from) {
			to = now
		}
		for key, ms := range d.GPUMilliseconds {
			team, owner := SplitUsageSubject(key)
			if s := subject(team, owner); s != "" {
				out = append(out, UsageInterval{Subject: s, From: from, To: to, GPUMilliseconds: ms})
			}
		}
	}
	return out
}
