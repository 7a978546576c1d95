package placer

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns Prometheus collectors for the placer's counters, each
// labelled with the placer's id. Register them once.
func (p *Placer) Collectors() []prometheus.Collector {
	labels := prometheus.Labels{"placer": p.cfg.ID}
	counter := func(name, help string, f func() int64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Namespace: "voyager", Subsystem: "placer", Name: name, Help: help, ConstLabels: labels,
		}, func() float64 { return float64(f()) })
	}
	return []prometheus.Collector{
		counter("passes_total", "Planning passes run.", p.passes.Load),
		counter("bindings_total", "Sessions bound by this placer.", p.bound.Load),
		counter("bind_transactions_total", "Bind transactions committed.", p.txns.Load),
		counter("conflicts_total", "Transactions refused because state moved since read; the placer re-read and retried.", p.conflicts.Load),
		counter("lost_sessions_total", "Sessions re-queued or ended because their node's lease expired.", p.lost.Load),
		counter("pending_status_writes_total", "Pending reasons and queue positions written.", p.statuses.Load),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "voyager", Subsystem: "placer", Name: "active", ConstLabels: labels,
			Help: "1 while this placer plans and binds (the oldest live placer, or any when sharded), 0 while it stands by or before its first pass.",
		}, func() float64 {
			if p.cfg.Sharded || p.role.Load() == roleActive {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "voyager", Subsystem: "placer", Name: "queue_length", ConstLabels: labels,
			Help: "Sessions pending, as this placer's cache sees them.",
		}, func() float64 { return float64(p.pending.Len()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Namespace: "voyager", Subsystem: "placer", Name: "cache_lag_revisions", ConstLabels: labels,
			Help: "How many revisions this placer's pending or ledger cache trails its newest bind (0: both show it); its own binds are laid over the caches meanwhile.",
		}, func() float64 { return float64(p.cacheLag()) }),
	}
}
