package api

import (
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/voyager-gpu/voyager/state"
	"github.com/voyager-gpu/voyager/watcher"
)

// metrics are the API's Prometheus collectors: request counts and latency
// by route, and gauges computed from the caches at scrape time.
type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	// plans times the queue plans that positions and reasons come from.
	plans prometheus.Histogram
	// servingRereads counts the GETs whose serializable read was read
	// again linearizably (readSessionServing).
	servingRereads prometheus.Counter
	cluster        *API

	sessionsDesc, pendingDesc, gpusDesc, unusedDesc, warningsDesc *prometheus.Desc
}

func newMetrics() *metrics {
	return &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "voyager_api_requests_total",
			Help: "API requests by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "voyager_api_request_duration_seconds",
			Help:    "API request latency by route pattern and method (streams count until they end).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"route", "method"}),
		plans: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "voyager_api_queue_plan_seconds",
			Help:    "Time to plan the queue over the API's caches (for queue positions and reasons); requests wait for it only while it stays short.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}),
		servingRereads: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "voyager_api_session_rereads_total",
			Help: "GETs of a session whose serializable read was repeated linearizably: the session was not on the etcd member that answered, or that member was behind the API's watches.",
		}),
		sessionsDesc: prometheus.NewDesc("voyager_sessions", "Sessions by phase, from status/ in etcd.", []string{"phase"}, nil),
		pendingDesc:  prometheus.NewDesc("voyager_pending_sessions", "Pending sessions by reason (Queued, Capacity, Quota, Unsatisfiable, Cordoned…).", []string{"reason"}, nil),
		gpusDesc:     prometheus.NewDesc("voyager_gpus", "GPU devices of live nodes: allocated and total (healthy whole GPUs and MIG devices).", []string{"state"}, nil),
		unusedDesc:   prometheus.NewDesc("voyager_gpus_allocated_unused", "Allocated GPU devices that nothing runs on (no process, no utilisation past the agent's unused-after time), by node.", []string{"node"}, nil),
		warningsDesc: prometheus.NewDesc("voyager_session_warnings", "Sessions the system has warned it will stop, by reason (IdleTimeout, MaxRuntime, NodeDrained, Preempted).", []string{"reason"}, nil),
	}
}

// Collectors returns the API's collectors, to register on the process's
// Prometheus registry.
func (a *API) Collectors() []prometheus.Collector {
	cs := []prometheus.Collector{a.metrics.requests, a.metrics.latency, a.metrics.plans, a.metrics.servingRereads, a.metrics, newTeamMetrics(a), newStandingMetrics(a)}
	if a.cfg.Audit != nil {
		cs = append(cs, a.cfg.Audit.Collectors()...)
	}
	return cs
}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	ch <- m.sessionsDesc
	ch <- m.pendingDesc
	ch <- m.gpusDesc
	ch <- m.unusedDesc
	ch <- m.warningsDesc
}

// Collect implements prometheus.Collector: it counts from the caches.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	a := m.cluster
	phases := map[state.Phase]int{}
	reasons := map[string]int{}
	// Ranged, not listed: a list copies and sorts every status (250 ms
	// of CPU a scrape at 100,000 sessions).
	a.status.Snapshot().RangeShared(func(it *watcher.Item[state.Status]) bool {
		phases[it.Value.Phase]++
		if it.Value.Phase == state.PhasePending {
			reasons[it.Value.Reason]++
		}
		return true
	})
	for _, p := range []state.Phase{state.PhasePending, state.PhaseBound, state.PhaseStarting, state.PhaseRunning,
		state.PhaseSucceeded, state.PhaseFailed, state.PhaseStopping, state.PhaseStopped, state.PhaseLost} {
		ch <- prometheus.MustNewConstMetric(m.sessionsDesc, prometheus.GaugeValue, float64(phases[p]), string(p))
	}
	for r, n := range reasons {
		ch <- prometheus.MustNewConstMetric(m.pendingDesc, prometheus.GaugeValue, float64(n), r)
	}
	var used, total int
	for _, n := range a.nodeSummaries() {
		used += n.GPUs.Used
		total += n.GPUs.Total
		ch <- prometheus.MustNewConstMetric(m.unusedDesc, prometheus.GaugeValue, float64(n.GPUs.Unused), n.Name)
	}
	ch <- prometheus.MustNewConstMetric(m.gpusDesc, prometheus.GaugeValue, float64(used), "allocated")
	ch <- prometheus.MustNewConstMetric(m.gpusDesc, prometheus.GaugeValue, float64(total), "total")
	// Every reason is reported, 0 included, so alerts need no absent().
	warns := map[string]int{state.ReasonIdle: 0, state.ReasonMaxRuntime: 0, state.ReasonDrained: 0, state.ReasonPreempted: 0}
	a.warns.Snapshot().RangeShared(func(it *watcher.Item[state.Warning]) bool {
		warns[it.Value.Reason]++
		return true
	})
	for r, n := range warns {
		ch <- prometheus.MustNewConstMetric(m.warningsDesc, prometheus.GaugeValue, float64(n), r)
	}
}

func (m *metrics) observePlan(d time.Duration) { m.plans.Observe(d.Seconds()) }

// observe counts every request by its route pattern, never its raw path,
// so label cardinality stays bounded.
func (a *API) observe(c *gin.Context) {
	start := time.Now()
	c.Next()
	route := c.FullPath()
	if route == "" {
		route = "unmatched"
	}
	a.metrics.requests.WithLabelValues(route, c.Request.Method, strconv.Itoa(c.Writer.Status())).Inc()
	a.metrics.latency.WithLabelValues(route, c.Request.Method).Observe(time.Since(start).Seconds())
}
