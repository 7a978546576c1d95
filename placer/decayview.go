package placer

import (
	"sync"
	"time"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// DecayedUsage is each team's decayed GPU-hours computed as a placer
// computes it for Snapshot.TeamUsage (teams.go's decayCache: again when
// the daily records change or a minute has passed), for a process that
// plans the queue beside the placers: the API's queue view orders and
// explains the queue with the numbers the placers order it by. Safe for
// concurrent use; the zero value is ready.
type DecayedUsage struct {
	mu sync.Mutex
	c  decayCache
}

// Of is each team's GPU-hours in days decayed with halfLife as seen from
// now, keyed as Snapshot.TeamUsage is ("" for sessions of no team); nil
// when halfLife is not above zero or days is nil. The map is shared
// between calls: read it, never change it.
func (d *DecayedUsage) Of(days *watcher.Snapshot[state.UsageDay], now time.Time, halfLife time.Duration) map[string]float64 {
	if halfLife <= 0 || days == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.c.of(days, now, halfLife)
}
