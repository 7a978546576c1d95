package placer

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/voyager-gpu/voyager/internal/promfunc"
)

// Collectors returns Prometheus collectors for the placer's counters, each
// labelled with the placer's id. Register them once.
func (p *Placer) Collectors() []prometheus.Collector {
	m := promfunc.Set{Subsystem: "placer", Labels: prometheus.Labels{"placer": p.cfg.ID}}
	return []prometheus.Collector{
		m.Counter("passes_total", "Planning passes run.", p.passes.Load),
		m.Counter("bindings_total", "Sessions bound by this placer.", p.bound.Load),
		m.Counter("bind_transactions_total", "Bind transactions committed.", p.txns.Load),
		m.Counter("conflicts_total", "Transactions refused because state moved since read; the placer re-read and retried.", p.conflicts.Load),
		m.Counter("lost_sessions_total", "Sessions re-queued or ended because their node's lease expired.", p.lost.Load),
		m.Counter("pending_status_writes_total", "Pending reasons and queue positions written.", p.statuses.Load),
		m.Gauge("active", "1 while this placer plans and binds (the oldest live placer, or any when sharded), 0 while it stands by or before its first pass.",
			promfunc.Flag(func() bool { return p.cfg.Sharded || p.role.Load() == roleActive })),
		m.Gauge("queue_length", "Sessions pending, as this placer's cache sees them.", func() float64 { return float64(p.pending.Len()) }),
		m.Gauge("cache_lag_revisions",
			"How many revisions this placer's pending or ledger cache trails its newest bind (0: both show it); its own binds are laid over the caches meanwhile.",
			func() float64 { return float64(p.cacheLag()) }),
	}
}
