package placer

import (
	"context"
	"time"

	"github.com/voyager-gpu/voyager/state"
)

// defaultUsageSweepEvery is how often the active placer deletes the usage
// marks of placers that are gone (state.SweepUsageMarks). Each placer's id
// is new at each start, so the marks of the dead grow with every restart;
// every quota-guarded bind compares them all. Each sweep makes the binds
// planned on ledgers read before it plan once more.
const defaultUsageSweepEvery = time.Minute

// sweepUsage sweeps the usage marks of placers that are gone once the
// caches are ready and every Config.usageSweepEvery after, while this placer is
// the active one (activeOf), until ctx ends. Placers that sweep at once
// are safe (each sweep's transactions compare what they delete), only
// wasteful.
func (p *Placer) sweepUsage(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-p.ready:
	}
	tick := time.NewTicker(p.cfg.usageSweepEvery)
	defer tick.Stop()
	for {
		if p.activeOf() == p.cfg.ID {
			if n, err := state.SweepUsageMarks(ctx, p.cli, p.cfg.Keys, p.cfg.Now()); err != nil && ctx.Err() == nil {
				p.log.Warn("sweep usage marks of placers gone", "err", err)
			} else if n > 0 {
				p.log.Debug("swept usage marks of placers gone", "marks", n)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
